/* attnviz caption view: the picture and its caption; clicking a word shows, for every layer and head, where the
   decoder step that wrote it looked on the picture. Data: the inline JSON #attnviz-data (render/caption_view.py). */
"use strict";
(function () {
  var data = JSON.parse(document.getElementById("attnviz-data").textContent);
  var grid = data.grid, extra = grid.extra_kinds.length, tokens = grid.labels.length;
  var rows = grid.rows, cols = grid.cols, words = data.words, MAIN = 256, THUMB = 112;

  /* shared page helpers from common.js (AV) */
  var el = AV.el;
  function decode(layer) { return AV.decode(layer, tokens); }
  function colour(t) { return AV.css(AV.colour(t)); }
  var layers = data.layers.map(function (layer) { return {layer: layer.layer, heads: layer.heads, weights: decode(layer)}; });
  var state = {word: 0};

  /* a word's weights over every image token in one head (or the mean of the layer's heads: head "mean") */
  function weightsOf(layer, head, word) {
    var out = new Float32Array(tokens), heads = layer.heads.length;
    var chosen = head === "mean" ? layer.heads.map(function (_, i) { return i; }) : [head];
    chosen.forEach(function (h) {
      var base = (h * words.length + word) * tokens;
      for (var k = 0; k < tokens; k++) out[k] += layer.weights[base + k] / chosen.length;
    });
    return out;
  }
  var picture = new Image();
  picture.src = data.picture;
  function drawOverlay(canvas, weights, size) {
    var cellW = size / cols, cellH = size * (data.height / data.width) / rows;
    AV.patchHeat(canvas.getContext("2d"), picture, weights, grid, cellW, cellH);
  }
  function hottest(weights) {
    var best = extra;
    for (var k = extra; k < tokens; k++) if (weights[k] > weights[best]) best = k;
    return best;
  }

  var app = document.getElementById("app");
  var main = el("canvas", {id: "picture", width: MAIN, height: Math.round(MAIN * data.height / data.width)});
  var caption = el("div", {"class": "controls", id: "caption"});
  var readout = el("div", {"class": "readout", id: "readout"});
  var thumbs = el("table", {"class": "thumbs", id: "thumbs"});
  app.appendChild(el("header", {}, [el("h1", {text: data.title}), el("p", {"class": "hint", text:
    data.hint + " Each overlay is scaled to its own largest weight on a patch."})]));
  app.appendChild(caption);
  app.appendChild(el("main", {}, [el("div", {"class": "split"}, [el("div", {"class": "stage"}, [main, readout])]),
    el("h2", {text: "Every layer and head, for the chosen word"}), thumbs]));

  function render() {
    caption.innerHTML = "";
    caption.appendChild(el("span", {text: "Caption:"}));
    words.forEach(function (word, index) {
      caption.appendChild(el("button", {"class": "word" + (index === state.word ? " active" : ""), "data-word": index,
        onclick: function () { state.word = index; render(); }, text: word}));
    });
    var last = layers[layers.length - 1], mean = weightsOf(last, "mean", state.word);
    drawOverlay(main, mean, MAIN);
    readout.textContent = "word " + JSON.stringify(words[state.word]) + " · layer " + last.layer + " · mean of heads · " +
      "hottest patch " + grid.labels[hottest(mean)] + " (" + mean[hottest(mean)].toFixed(3) + ")";
    thumbs.innerHTML = "";
    var most = Math.max.apply(null, layers.map(function (l) { return l.heads.length; }));
    var header = el("tr", {}, [el("th", {})]);
    for (var h = 0; h < most; h++) header.appendChild(el("th", {text: "head " + h}));
    header.appendChild(el("th", {text: "mean of heads"}));
    thumbs.appendChild(header);
    layers.forEach(function (layer) {
      var tr = el("tr", {}, [el("th", {text: "layer " + layer.layer})]);
      layer.heads.concat(["mean"]).forEach(function (number, hi) {
        var head = number === "mean" ? "mean" : hi, weights = weightsOf(layer, head, state.word);
        var canvas = el("canvas", {"class": "thumb", width: THUMB, height: Math.round(THUMB * data.height / data.width)});
        drawOverlay(canvas, weights, THUMB);
        var name = "layer " + layer.layer + " " + (head === "mean" ? "mean of heads" : "head " + number);
        tr.appendChild(el("td", {"class": "cell", title: name + " · hottest " + grid.labels[hottest(weights)],
          "data-hottest": grid.labels[hottest(weights)]}, [canvas]));
      });
      thumbs.appendChild(tr);
    });
    document.body.setAttribute("data-word", words[state.word]);
    document.body.setAttribute("data-hottest", grid.labels[hottest(mean)]);
  }
  picture.onload = render;
  render();
})();
