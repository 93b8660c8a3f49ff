/* attnviz image view: the picture with its patch grid; pointing at a patch shows where it attends.
   Uses common.js (AV); the data is the inline JSON #attnviz-data written by render/image_view.py. */
"use strict";
(function () {
  var data = JSON.parse(document.getElementById("attnviz-data").textContent);
  var grid = data.grid, labels = grid.labels, extra = grid.extra_kinds.length;
  var tokens = labels.length, rows = grid.rows, cols = grid.cols;
  var MAIN = 384, THUMB = 96;

  /* shared page helpers from common.js (AV) */
  var el = AV.el;
  function decode(layer) { return AV.decode(layer, tokens); }
  function colour(t) { return AV.css(AV.colour(t)); }

  var layers = data.layers.map(function (layer) { return {layer: layer.layer, heads: layer.heads, weights: decode(layer)}; });
  var state = {layer: layers.length - 1, head: "mean", query: data.default_query, pinned: null};

  /* attention of the current query over every token: Float32Array [tokens] */
  function row(layerIndex, head, query) {
    var layer = layers[layerIndex], heads = layer.heads.length, out = new Float32Array(tokens);
    var chosen = head === "mean" ? layer.heads.map(function (_, i) { return i; }) : [head];
    chosen.forEach(function (h) {
      var queries = query === "mean" ? [] : [query];
      if (query === "mean") for (var q = extra; q < tokens; q++) queries.push(q);
      queries.forEach(function (q) {
        var base = (h * tokens + q) * tokens;
        for (var k = 0; k < tokens; k++) out[k] += layer.weights[base + k] / (chosen.length * queries.length);
      });
    });
    return out;
  }
  function queryName(query) {
    return query === "mean" ? "mean over patches" + (extra && labels[0] === "[CLS]" ? "" : " (the model has no class token)")
                            : labels[query];
  }

  var picture = new Image();
  picture.src = data.picture;

  /* the picture, the translucent heat of `weights` on the patches, the grid, and the query's outline */
  function drawOverlay(canvas, weights, query, size, withGrid) {
    var ctx = canvas.getContext("2d"), cellW = size / cols, cellH = size * (data.height / data.width) / rows;
    ctx.imageSmoothingEnabled = true;
    var top = AV.patchHeat(ctx, picture, weights, grid, cellW, cellH);
    if (withGrid) {
      ctx.strokeStyle = "rgba(255,255,255,0.35)";
      ctx.lineWidth = 1;
      for (var r = 1; r < rows; r++) { ctx.beginPath(); ctx.moveTo(0, r * cellH); ctx.lineTo(cols * cellW, r * cellH); ctx.stroke(); }
      for (var c = 1; c < cols; c++) { ctx.beginPath(); ctx.moveTo(c * cellW, 0); ctx.lineTo(c * cellW, rows * cellH); ctx.stroke(); }
    }
    if (query !== "mean" && query >= extra) {
      var index = query - extra;
      ctx.strokeStyle = "#e8384f";
      ctx.lineWidth = 2;
      ctx.strokeRect((index % cols) * cellW + 1, Math.floor(index / cols) * cellH + 1, cellW - 2, cellH - 2);
    }
    return top;
  }

  var app = document.getElementById("app");
  var title = el("h1", {text: data.title});
  var hint = el("p", {"class": "hint", text: "Point at a patch (or an extra token) to see where it attends; click to pin it, " +
    "click again to unpin. The heat is scaled to the largest weight on a patch; the extra tokens show their own weight."});
  var layerSelect = el("select", {id: "layer", onchange: function () { state.layer = Number(layerSelect.value); render(); }});
  layers.forEach(function (layer, i) { layerSelect.appendChild(el("option", {value: i, text: "layer " + layer.layer})); });
  layerSelect.value = state.layer;
  var headSelect = el("select", {id: "head", onchange: function () {
    state.head = headSelect.value === "mean" ? "mean" : Number(headSelect.value); render();
  }});
  function fillHeads() {
    headSelect.innerHTML = "";
    headSelect.appendChild(el("option", {value: "mean", text: "mean of heads"}));
    layers[state.layer].heads.forEach(function (number, i) { headSelect.appendChild(el("option", {value: i, text: "head " + number})); });
    headSelect.value = String(state.head);
  }
  var controls = el("div", {"class": "controls"}, [el("label", {}, ["Layer ", layerSelect]), el("label", {}, ["Head ", headSelect])]);
  var main = el("canvas", {id: "picture", width: MAIN, height: Math.round(MAIN * data.height / data.width)});
  var readout = el("div", {"class": "readout", id: "readout"});
  var extrasBox = el("div", {"class": "extras", id: "extras"});
  var legend = el("div", {"class": "legend"});
  var thumbs = el("table", {"class": "thumbs", id: "thumbs"});
  app.appendChild(el("header", {}, [title, hint]));
  app.appendChild(controls);
  app.appendChild(el("main", {}, [
    el("div", {"class": "split"}, [el("div", {"class": "stage"}, [main, readout, legend]), extrasBox]),
    el("h2", {text: "Model view: every layer and head, same query"}), thumbs,
  ]));

  function patchAt(event) {
    var box = main.getBoundingClientRect();
    var x = (event.clientX - box.left) / box.width, y = (event.clientY - box.top) / box.height;
    var col = Math.floor(x * cols), r = Math.floor(y * rows);
    if (col < 0 || col >= cols || r < 0 || r >= rows) return null;
    return extra + r * cols + col;
  }
  main.addEventListener("mousemove", function (event) {
    if (state.pinned !== null) return;
    var token = patchAt(event);
    if (token !== null && token !== state.query) { state.query = token; render(); }
  });
  main.addEventListener("mouseleave", function () {
    if (state.pinned === null) { state.query = data.default_query; render(); }
  });
  main.addEventListener("click", function (event) {
    var token = patchAt(event);
    state.pinned = state.pinned === token ? null : token;
    if (token !== null) state.query = token;
    render();
  });

  function renderExtras(weights) {
    extrasBox.innerHTML = "";
    if (!extra) { extrasBox.appendChild(el("p", {"class": "hint", text: "This model has no extra tokens."})); return; }
    extrasBox.appendChild(el("div", {"class": "extras-title", text: "Extra tokens (attention to them)"}));
    var top = 0;
    for (var k = 0; k < tokens; k++) top = Math.max(top, weights[k]);
    for (var e = 0; e < extra; e++) {
      (function (token) {
        var swatch = el("span", {"class": "swatch"});
        swatch.style.background = colour(top > 0 ? weights[token] / top : 0);
        var item = el("div", {"class": "extra" + (state.query === token ? " active" : ""), "data-token": token,
          onmouseenter: function () { if (state.pinned === null) { state.query = token; render(); } },
          onclick: function () { state.pinned = state.pinned === token ? null : token; state.query = token; render(); }},
          [swatch, labels[token] + " " + weights[token].toFixed(3)]);
        extrasBox.appendChild(item);
      })(e);
    }
  }

  function renderThumbs() {
    thumbs.innerHTML = "";
    var most = Math.max.apply(null, layers.map(function (l) { return l.heads.length; }));
    var header = el("tr", {}, [el("th", {})]);
    for (var h = 0; h < most; h++) header.appendChild(el("th", {text: "head " + h}));
    thumbs.appendChild(header);
    layers.forEach(function (layer, li) {
      var tr = el("tr", {}, [el("th", {text: "layer " + layer.layer})]);
      layer.heads.forEach(function (number, hi) {
        var canvas = el("canvas", {"class": "thumb", width: THUMB, height: Math.round(THUMB * data.height / data.width)});
        drawOverlay(canvas, row(li, hi, state.query), state.query, THUMB, false);
        var selected = li === state.layer && hi === state.head;
        tr.appendChild(el("td", {"class": "cell" + (selected ? " selected" : ""), title: "layer " + layer.layer + " head " + number,
          onclick: function () { state.layer = li; state.head = hi; layerSelect.value = li; render(); }}, [canvas]));
      });
      thumbs.appendChild(tr);
    });
  }

  function render() {
    fillHeads();
    var weights = row(state.layer, state.head, state.query);
    var top = drawOverlay(main, weights, state.query, MAIN, true);
    var best = extra;
    for (var k = extra; k < tokens; k++) if (weights[k] > weights[best]) best = k;
    var layer = layers[state.layer];
    readout.textContent = "query " + queryName(state.query) + (state.pinned !== null ? " (pinned)" : "") + " · layer " + layer.layer +
      " · " + (state.head === "mean" ? "mean of heads" : "head " + layer.heads[state.head]) +
      " · hottest patch " + labels[best] + " (" + weights[best].toFixed(3) + ")";
    legend.innerHTML = "";
    var bar = el("canvas", {width: 160, height: 10});
    var ctx = bar.getContext("2d");
    for (var x = 0; x < 160; x++) { ctx.fillStyle = colour(x / 159); ctx.fillRect(x, 0, 1, 10); }
    legend.appendChild(el("span", {text: "0"}));
    legend.appendChild(bar);
    legend.appendChild(el("span", {text: top.toFixed(3) + " (largest weight on a patch)"}));
    renderExtras(weights);
    renderThumbs();
    document.body.setAttribute("data-query", String(state.query));
    document.body.setAttribute("data-hottest", labels[best]);
  }
  picture.onload = render;
  render();
})();
