/* attnviz attention page: a head view (two token columns joined by lines weighted by attention) and a model
   view (layers x heads thumbnails; click one for the full heatmap). Data: the inline #attnviz-data JSON. */
(function () {
  var data = AV.data(), app = document.getElementById("app");
  var state = {stack: 0, layer: 0, view: "head", scale: "linear", selected: null, pinned: false, off: {}, detail: null};
  var cache = {};

  function stack() { return data.stacks[state.stack]; }
  function layer() { return stack().layers[state.layer]; }
  /* weights of a layer: Float32Array [head, query, key] */
  function weights(stackIndex, layerIndex) {
    var id = stackIndex + ":" + layerIndex;
    if (!cache[id]) {
      var s = data.stacks[stackIndex];
      cache[id] = AV.decode(s.layers[layerIndex], s.keys.length);
    }
    return cache[id];
  }
  function headLabel(l, position) {
    var id = l.heads[position];
    return "H" + id + (l.maskedHeads.indexOf(id) >= 0 ? " (masked)" : "");
  }

  var header = AV.el("header", {}, [
    AV.el("h1", {text: data.title}),
    AV.el("p", {"class": "hint", text: "Rows / left: attending from (queries) \u00b7 columns / right: attended to (keys)" +
      (data.words ? " \u00b7 words: attention to a word is the sum over its pieces, from a word the mean" : "")})]);
  var controls = AV.el("div", {"class": "controls"});
  var body = AV.el("main", {});
  app.appendChild(header); app.appendChild(controls); app.appendChild(body);

  function renderControls() {
    controls.innerHTML = "";
    ["head", "model"].forEach(function (view) {
      controls.appendChild(AV.el("button", {"class": "tab" + (state.view === view ? " active" : ""), id: "tab-" + view,
        text: view === "head" ? "Head view" : "Model view", onclick: function () { state.view = view; render(); }}));
    });
    if (data.stacks.length > 1) {
      controls.appendChild(AV.select("Attention", data.stacks.map(function (s, i) { return [i, s.label]; }), state.stack,
        function (v) { state.stack = +v; state.layer = 0; state.selected = null; state.detail = null; render(); },
        {id: "stack-select"}));
    }
    if (state.view === "head") {
      controls.appendChild(AV.select("Layer", stack().layers.map(function (l, i) { return [i, "layer " + l.layer]; }),
        state.layer, function (v) { state.layer = +v; render(); }, {id: "layer-select"}));
    }
    controls.appendChild(AV.select("Colour scale", [["linear", "linear"], ["sqrt", "square root"], ["log", "log"]],
      state.scale, function (v) { state.scale = v; render(); }, {id: "scale-select"}));
  }

  /* ---------------- head view ---------------- */
  function headView() {
    var s = stack(), l = layer(), nq = s.queries.length, nk = s.keys.length, heads = l.heads.length;
    var w = weights(state.stack, state.layer), off = state.off[state.stack + ":" + state.layer] || {};
    var toggles = AV.el("div", {"class": "head-toggles"}, [AV.el("span", {text: "Heads (click: show/hide, double-click: only this one):"})]);
    for (var h = 0; h < heads; h++) {
      (function (h) {
        var on = !off[h];
        toggles.appendChild(AV.el("button", {"class": "head-toggle" + (on ? " on" : ""), "data-head": h,
          "aria-pressed": on ? "true" : "false", style: "--head:" + AV.headColour(h), text: headLabel(l, h),
          onclick: function () { off[h] = !off[h]; state.off[state.stack + ":" + state.layer] = off; render(); },
          ondblclick: function () {
            for (var i = 0; i < heads; i++) off[i] = i !== h;
            state.off[state.stack + ":" + state.layer] = off; render();
          }}));
      })(h);
    }
    var all = AV.el("button", {"class": "small", id: "heads-all", text: "all", onclick: function () {
      state.off[state.stack + ":" + state.layer] = {}; render(); }});
    var none = AV.el("button", {"class": "small", id: "heads-none", text: "none", onclick: function () {
      var o = {}; for (var i = 0; i < heads; i++) o[i] = true; state.off[state.stack + ":" + state.layer] = o; render(); }});
    toggles.appendChild(all); toggles.appendChild(none);

    var rowHeight = 18, colWidth = 170, gap = 180, pad = 6;
    var height = Math.max(nq, nk) * rowHeight + 2 * pad, width = 2 * colWidth + gap;
    var svgNode = AV.svg("svg", {"class": "head-view", width: width, height: height, viewBox: "0 0 " + width + " " + height});
    var lines = AV.svg("g", {"class": "lines"});
    svgNode.appendChild(lines);
    function y(i) { return pad + (i + 0.5) * rowHeight; }
    var readout = AV.el("div", {"class": "readout", id: "head-readout", text: "point at a token on the left (click to pin it)"});

    function draw(query) {
      while (lines.firstChild) lines.removeChild(lines.firstChild);
      svgNode.querySelectorAll(".tok").forEach(function (node) { node.classList.remove("active"); });
      if (query === null) return;
      var node = svgNode.querySelector('.tok.q[data-index="' + query + '"]');
      if (node) node.classList.add("active");
      var visibleKeys = s.visible ? s.visible[query] : nk, shown = [];
      for (var h = 0; h < heads; h++) {
        if (off[h]) continue;
        shown.push(h);
        var base = (h * nq + query) * nk;
        for (var k = 0; k < visibleKeys; k++) {
          var weight = w[base + k];
          lines.appendChild(AV.svg("line", {"class": "att", x1: colWidth, y1: y(query), x2: colWidth + gap, y2: y(k),
            stroke: AV.headColour(h), "stroke-width": 2, "stroke-opacity": Math.min(1, weight),
            "data-head": h, "data-key": k, "data-weight": weight}));
        }
      }
      readout.setAttribute("data-query", query);
      readout.textContent = "from \u201c" + s.queries[query] + "\u201d (" + query + "), " + shown.length + " head" +
        (shown.length === 1 ? "" : "s") + (visibleKeys < nk ? "; it can see " + visibleKeys + " of " + nk + " keys" : "") +
        (shown.length === 1 ? ": strongest \u201c" + s.keys[argmax(w, (shown[0] * nq + query) * nk, visibleKeys)] + "\u201d" : "");
    }
    function argmax(array, start, count) {
      var best = 0;
      for (var k = 1; k < count; k++) if (array[start + k] > array[start + best]) best = k;
      return best;
    }
    s.queries.forEach(function (label, i) {
      var text = AV.svg("text", {"class": "tok q", x: colWidth - 8, y: y(i), "text-anchor": "end", "data-index": i});
      text.textContent = AV.short(label, 22);
      text.addEventListener("mouseenter", function () { if (!state.pinned) { state.selected = i; draw(i); } });
      text.addEventListener("click", function () {
        state.pinned = !(state.pinned && state.selected === i); state.selected = i; draw(i);
      });
      svgNode.appendChild(text);
    });
    s.keys.forEach(function (label, k) {
      var text = AV.svg("text", {"class": "tok k", x: colWidth + gap + 8, y: y(k), "text-anchor": "start", "data-index": k});
      text.textContent = AV.short(label, 22);
      svgNode.appendChild(text);
    });
    svgNode.addEventListener("mouseleave", function () { if (!state.pinned) { state.selected = null; draw(null); } });
    if (state.selected !== null && state.selected < nq) draw(state.selected);
    body.appendChild(AV.el("section", {id: "head-view"}, [toggles, readout, AV.el("div", {"class": "scroll"}, [svgNode])]));
  }

  /* ---------------- model view ---------------- */
  function modelView() {
    var s = stack(), nq = s.queries.length, nk = s.keys.length;
    var maxHeads = s.layers.reduce(function (m, l) { return Math.max(m, l.heads.length); }, 0);
    var thumb = Math.max(36, Math.min(80, Math.floor(900 / Math.max(maxHeads, 1))));
    var grid = AV.el("table", {"class": "model-grid", id: "model-grid"});
    var head = AV.el("tr", {}, [AV.el("th", {})]);
    for (var h = 0; h < maxHeads; h++) head.appendChild(AV.el("th", {text: "head " + h}));
    grid.appendChild(head);
    s.layers.forEach(function (l, li) {
      var row = AV.el("tr", {}, [AV.el("th", {text: "layer " + l.layer})]);
      var w = weights(state.stack, li);
      for (var h = 0; h < maxHeads; h++) {
        if (h >= l.heads.length) { row.appendChild(AV.el("td", {})); continue; }
        var canvas = AV.el("canvas", {"class": "thumb", style: "width:" + thumb + "px;height:" + Math.round(thumb * nq / nk) + "px"});
        AV.thumbnail(canvas, w, h * nq * nk, nq, nk, s.visible, state.scale);
        var masked = l.maskedHeads.indexOf(l.heads[h]) >= 0;
        (function (li, h) {
          var selected = state.detail && state.detail[0] === li && state.detail[1] === h;
          row.appendChild(AV.el("td", {"class": "cell" + (selected ? " selected" : "") + (masked ? " masked-head" : ""),
            "data-layer": li, "data-head": h, title: "layer " + l.layer + ", " + headLabel(l, h) + " \u2014 click for the full heatmap",
            onclick: function () { state.detail = [li, h]; render(); }},
            [canvas, l.heads[h] !== h || masked ? AV.el("div", {"class": "tag", text: headLabel(l, h)}) : AV.el("span")]));
        })(li, h);
      }
      grid.appendChild(row);
    });
    var detail = AV.el("div", {"class": "detail", id: "detail"});
    if (state.detail) {
      var l = s.layers[state.detail[0]], h = state.detail[1];
      detail.appendChild(AV.heatmap({queries: s.queries, keys: s.keys, weights: weights(state.stack, state.detail[0]),
        offset: h * nq * nk, visible: s.visible, scale: state.scale,
        title: s.label + " \u00b7 layer " + l.layer + " \u00b7 " + headLabel(l, h)}));
    } else {
      detail.appendChild(AV.el("p", {"class": "hint", text: "Click a thumbnail to open that head as a full heatmap."}));
    }
    body.appendChild(AV.el("section", {id: "model-view", "class": "split"}, [AV.el("div", {"class": "scroll grid-box"}, [grid]), detail]));
  }

  function render() {
    renderControls();
    body.innerHTML = "";
    if (state.view === "head") headView(); else modelView();
  }
  render();
})();
