/* attnviz page helpers: decoding the inline data, colour scales, and a canvas heatmap with a pointer readout.
   Written by hand, no dependencies; everything the page needs is in this file and the inline JSON. */
"use strict";
var AV = (function () {
  var AV = {};

  AV.data = function () {
    return JSON.parse(document.getElementById("attnviz-data").textContent);
  };

  /* element helper: AV.el("div", {class: "x", onclick: f}, [children or strings]) */
  AV.el = function (tag, attrs, children) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (key) {
      var value = attrs[key];
      if (value === null || value === undefined) return;
      if (key.slice(0, 2) === "on") node.addEventListener(key.slice(2), value);
      else if (key === "text") node.textContent = value;
      else node.setAttribute(key, value);
    });
    (children || []).forEach(function (child) {
      node.appendChild(typeof child === "string" ? document.createTextNode(child) : child);
    });
    return node;
  };

  AV.svg = function (tag, attrs) {
    var node = document.createElementNS("http://www.w3.org/2000/svg", tag);
    Object.keys(attrs || {}).forEach(function (key) { node.setAttribute(key, attrs[key]); });
    return node;
  };

  function bytes(base64) {
    var text = atob(base64), out = new Uint8Array(text.length);
    for (var i = 0; i < text.length; i++) out[i] = text.charCodeAt(i);
    return out;
  }

  /* One encoded block [..., query, key] -> Float32Array of weights (code * per-row scale). */
  AV.decode = function (encoded, keys) {
    var codes = bytes(encoded.codes);
    var scales = new Float32Array(bytes(encoded.scales).buffer);
    var out = new Float32Array(codes.length);
    for (var row = 0; row < scales.length; row++) {
      var scale = scales[row], base = row * keys;
      for (var k = 0; k < keys; k++) out[base + k] = codes[base + k] * scale;
    }
    return out;
  };

  /* zlib-compressed base64 -> Promise of its bytes, inflated by the browser's own DecompressionStream. */
  AV.inflate = function (base64) {
    var stream = new Blob([bytes(base64)]).stream().pipeThrough(new DecompressionStream("deflate"));
    return new Response(stream).arrayBuffer().then(function (buffer) { return new Uint8Array(buffer); });
  };

  /* Reads byte-planar arrays (all first bytes, then all second bytes, ...) one after another from raw bytes. */
  AV.reader = function (raw) {
    var offset = 0;
    return function (size, count) {
      var out = new Uint32Array(count);
      for (var b = 0; b < size; b++) {
        var base = offset + b * count, shift = 8 * b;
        for (var i = 0; i < count; i++) out[i] += raw[base + i] * Math.pow(2, shift);
      }
      offset += size * count;
      return out;
    };
  };
  /* float32 bit patterns (Uint32Array) -> Float32Array */
  AV.floats = function (bits) { return new Float32Array(bits.buffer); };
  /* bfloat16 bit patterns -> Float32Array */
  AV.bfloats = function (bits) {
    var wide = new Uint32Array(bits.length);
    for (var i = 0; i < bits.length; i++) wide[i] = bits[i] * 65536;
    return new Float32Array(wide.buffer);
  };

  /* viridis, 11 stops */
  var VIRIDIS = ["#440154", "#482475", "#414487", "#355f8d", "#2a788e", "#21918c", "#22a884", "#44bf70",
                 "#7ad151", "#bddf26", "#fde725"].map(function (hex) {
    return [parseInt(hex.slice(1, 3), 16), parseInt(hex.slice(3, 5), 16), parseInt(hex.slice(5, 7), 16)];
  });
  AV.colour = function (t) { /* t in [0, 1] -> [r, g, b] */
    t = Math.max(0, Math.min(1, t)) * (VIRIDIS.length - 1);
    var i = Math.min(VIRIDIS.length - 2, Math.floor(t)), f = t - i, a = VIRIDIS[i], b = VIRIDIS[i + 1];
    return [a[0] + (b[0] - a[0]) * f, a[1] + (b[1] - a[1]) * f, a[2] + (b[2] - a[2]) * f];
  };
  AV.css = function (rgb) { return "rgb(" + rgb.map(Math.round).join(",") + ")"; };
  AV.MASKED = [217, 217, 217];
  AV.DROPPED = [246, 240, 232];

  /* weight -> [0, 1] on a linear, square-root or logarithmic (3 decades below vmax) scale */
  AV.scaled = function (w, vmax, scale) {
    if (!(vmax > 0)) return 0;
    var x = Math.max(0, w) / vmax;
    if (scale === "sqrt") return Math.sqrt(x);
    if (scale === "log") return x <= 0 ? 0 : Math.max(0, (Math.log10(x) + 3) / 3);
    return x;
  };

  /* An image page's overlay: the picture, then each patch's weight as translucent heat scaled to the largest
     weight on a patch. weights: [tokens] (the grid's extra tokens first, then the rows × cols patches).
     Returns that largest weight. */
  AV.patchHeat = function (ctx, picture, weights, grid, cellW, cellH) {
    var extra = grid.extra_kinds.length, rows = grid.rows, cols = grid.cols, top = 0;
    for (var k = extra; k < extra + rows * cols; k++) top = Math.max(top, weights[k]);
    ctx.clearRect(0, 0, ctx.canvas.width, ctx.canvas.height);
    if (picture.complete) ctx.drawImage(picture, 0, 0, ctx.canvas.width, ctx.canvas.height);
    ctx.globalAlpha = 0.6;
    for (var p = 0; p < rows * cols; p++) {
      ctx.fillStyle = AV.css(AV.colour(top > 0 ? weights[extra + p] / top : 0));
      ctx.fillRect((p % cols) * cellW, Math.floor(p / cols) * cellH, cellW, cellH);
    }
    ctx.globalAlpha = 1;
    return top;
  };

  AV.HEAD_COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                     "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd"];
  AV.headColour = function (index) {
    return index < AV.HEAD_COLOURS.length ? AV.HEAD_COLOURS[index] : "hsl(" + ((index * 137.5) % 360) + ",65%,45%)";
  };

  AV.fmt = function (w) { return w.toFixed(4); };
  /* a weight in a short list: two decimals, or two significant digits below 0.01 (cross-attention over
     thousands of audio frames or patches spreads weights thinner than 0.005, which two decimals show as 0.00) */
  AV.shortWeight = function (w) { return w >= 0.01 || w <= 0 ? w.toFixed(2) : w.toPrecision(2); };

  function short(label, n) { return label.length <= n ? label : label.slice(0, n - 1) + "\u2026"; }
  AV.short = short;

  /* Thinned label positions: every step-th, and always the first and the last. */
  AV.labelIndices = function (count, step) {
    var out = [];
    for (var i = 0; i < count; i += step) out.push(i);
    if (out[out.length - 1] !== count - 1) {
      if (count - 1 - out[out.length - 1] < step / 2 && out.length > 1) out.pop();
      out.push(count - 1);
    }
    return out;
  };

  /* Draw one [query, key] block (weights at offset) into a small canvas, each cell one pixel. */
  AV.thumbnail = function (canvas, weights, offset, nq, nk, visible, scale) {
    canvas.width = nk; canvas.height = nq;
    var ctx = canvas.getContext("2d"), image = ctx.createImageData(nk, nq), vmax = 0, i, k;
    for (i = 0; i < nq; i++) for (k = 0; k < nk; k++) vmax = Math.max(vmax, weights[offset + i * nk + k]);
    for (i = 0; i < nq; i++) {
      for (k = 0; k < nk; k++) {
        var masked = visible && k >= visible[i];
        var rgb = masked ? AV.MASKED : AV.colour(AV.scaled(weights[offset + i * nk + k], vmax, scale));
        var p = 4 * (i * nk + k);
        image.data[p] = rgb[0]; image.data[p + 1] = rgb[1]; image.data[p + 2] = rgb[2]; image.data[p + 3] = 255;
      }
    }
    ctx.putImageData(image, 0, 0);
  };

  /* A full heatmap with token labels and a readout of the weight under the pointer.
     opts: queries, keys, weights (Float32Array), offset, visible (per-row key counts or null), scale, title,
     maxSize (px of the cell area). Returns the wrapper element. */
  AV.heatmap = function (opts) {
    var nq = opts.queries.length, nk = opts.keys.length, offset = opts.offset || 0;
    var cell = Math.max(2, Math.min(26, Math.floor((opts.maxSize || 720) / Math.max(nq, nk))));
    var font = 11, labelChars = 14, minGap = 12;
    var step = Math.max(1, Math.ceil(minGap / cell));
    var measure = document.createElement("canvas").getContext("2d");
    measure.font = font + "px sans-serif";
    var widest = function (labels) {
      return labels.reduce(function (m, l) { return Math.max(m, measure.measureText(short(l, labelChars)).width); }, 0);
    };
    var left = Math.ceil(widest(opts.queries)) + 10, top = Math.ceil(widest(opts.keys)) + 10;
    var width = left + nk * cell + 4, height = top + nq * cell + 4;
    var ratio = window.devicePixelRatio || 1;
    var canvas = AV.el("canvas", {"class": "heatmap", "data-left": left, "data-top": top, "data-cell": cell,
                                  "data-queries": nq, "data-keys": nk});
    canvas.width = Math.round(width * ratio); canvas.height = Math.round(height * ratio);
    canvas.style.width = width + "px"; canvas.style.height = height + "px";
    var ctx = canvas.getContext("2d");
    ctx.scale(ratio, ratio);
    var vmax = 0, i, k, w;
    for (i = 0; i < nq; i++) for (k = 0; k < nk; k++) {
      w = opts.weights[offset + i * nk + k];
      if (w > vmax) vmax = w;
    }
    for (i = 0; i < nq; i++) {
      for (k = 0; k < nk; k++) {
        var masked = opts.visible && k >= opts.visible[i];
        w = opts.weights[offset + i * nk + k];
        ctx.fillStyle = AV.css(masked ? AV.MASKED : w !== w ? AV.DROPPED : AV.colour(AV.scaled(w, vmax, opts.scale)));
        ctx.fillRect(left + k * cell, top + i * cell, cell, cell);
      }
    }
    ctx.fillStyle = "#222"; ctx.font = font + "px sans-serif"; ctx.textBaseline = "middle";
    ctx.textAlign = "right";
    AV.labelIndices(nq, step).forEach(function (q) {
      ctx.fillText(short(opts.queries[q], labelChars), left - 5, top + (q + 0.5) * cell);
    });
    ctx.save(); ctx.rotate(-Math.PI / 2); ctx.textAlign = "left";
    AV.labelIndices(nk, step).forEach(function (key) {
      ctx.fillText(short(opts.keys[key], labelChars), -(top - 5), left + (key + 0.5) * cell);
    });
    ctx.restore();

    var readout = AV.el("div", {"class": "readout", text: "point at a cell to read its weight"});
    var cursor = AV.el("div", {"class": "cursor"});
    canvas.addEventListener("mousemove", function (event) {
      var box = canvas.getBoundingClientRect();
      var key = Math.floor((event.clientX - box.left - left) / cell), q = Math.floor((event.clientY - box.top - top) / cell);
      if (q < 0 || key < 0 || q >= nq || key >= nk) { cursor.style.display = "none"; return; }
      var masked = opts.visible && key >= opts.visible[q], value = opts.weights[offset + q * nk + key];
      readout.setAttribute("data-query", q); readout.setAttribute("data-key", key);
      readout.setAttribute("data-weight", masked ? "masked" : value !== value ? "dropped" : value);
      var text = masked ? "masked (cannot be seen)" : value !== value ? (opts.missing ? opts.missing(q, key) : "not kept")
        : (opts.cellNote ? opts.cellNote(value) : AV.fmt(value));
      readout.textContent = "from \u201c" + opts.queries[q] + "\u201d (" + q + ") to \u201c" + opts.keys[key] + "\u201d (" +
        key + "): " + text;
      if (opts.onpoint) opts.onpoint(q, key);
      cursor.style.display = "block";
      cursor.style.left = (left + key * cell - 1) + "px"; cursor.style.top = (top + q * cell - 1) + "px";
      cursor.style.width = cell + "px"; cursor.style.height = cell + "px";
    });
    canvas.addEventListener("mouseleave", function () { cursor.style.display = "none"; });
    var stage = AV.el("div", {"class": "stage"}, [canvas, cursor]);
    var wrapper = AV.el("div", {"class": "heatmap-box"}, [
      opts.title ? AV.el("div", {"class": "heatmap-title", text: opts.title}) : AV.el("span"),
      opts.note ? AV.el("p", {"class": "hint", text: opts.note}) : AV.el("span"),
      readout, stage, AV.legend(vmax, opts.scale, !!opts.visible, opts.dropped)]);
    if (opts.onclick) {
      canvas.style.cursor = "zoom-in";
      canvas.addEventListener("click", function (event) {
        var box = canvas.getBoundingClientRect();
        var key = Math.floor((event.clientX - box.left - left) / cell), q = Math.floor((event.clientY - box.top - top) / cell);
        if (q >= 0 && key >= 0 && q < nq && key < nk) opts.onclick(q, key);
      });
    }
    return wrapper;
  };

  /* colour legend: gradient from 0 to vmax on the chosen scale, and the masked swatch */
  AV.legend = function (vmax, scale, masked, dropped) {
    var bar = AV.el("canvas", {"class": "legend-bar", width: 160, height: 10});
    var ctx = bar.getContext("2d");
    for (var x = 0; x < 160; x++) { ctx.fillStyle = AV.css(AV.colour(x / 159)); ctx.fillRect(x, 0, 1, 10); }
    var low = scale === "log" ? AV.fmt(vmax / 1000) : "0";
    var parts = [AV.el("span", {text: low}), bar, AV.el("span", {text: AV.fmt(vmax) + " (" + scale + " scale)"})];
    if (masked) {
      parts.push(AV.el("span", {"class": "swatch masked"}));
      parts.push(AV.el("span", {text: "masked: the query cannot see this key"}));
    }
    if (dropped) {
      parts.push(AV.el("span", {"class": "swatch dropped"}));
      parts.push(AV.el("span", {text: "not kept: below the row's kept weights (point at it for the bound)"}));
    }
    return AV.el("div", {"class": "legend"}, parts);
  };

  AV.select = function (label, options, value, onchange, attrs) {
    var select = AV.el("select", attrs || {});
    options.forEach(function (option) {
      var node = AV.el("option", {value: option[0], text: option[1]});
      if (String(option[0]) === String(value)) node.selected = true;
      select.appendChild(node);
    });
    select.addEventListener("change", function () { onchange(select.value); });
    return AV.el("label", {"class": "control"}, [label + " ", select]);
  };

  return AV;
})();
