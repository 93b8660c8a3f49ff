/* attnviz attention page: a head view (query tokens joined to the keys they attend to by lines whose width and
   opacity follow the weight, with per-head colour blocks beside each key) and a model view (layers x heads
   thumbnails; click one for its heatmap). Data: the inline #attnviz-data JSON. A short input keeps every cell;
   a long one keeps, per query row, its strongest keys and its first-token weight, and per head a pooled overview
   (each cell the largest weight of its block), decoded on demand. window.attnviz exposes the data to scripts. */
(function () {
  var data = AV.data(), app = document.getElementById("app");
  var SHOW_ALL = 160;       /* columns list every token up to this many; beyond, the view is compact */
  var WINDOW = 12;          /* compact view: queries listed either side of the chosen one */
  var MAX_KEYS = 48;        /* compact view: most keys listed */
  var LINE_MIN = 0.02;      /* lines below this weight are not drawn (the blocks still show them) */
  var crossIndex = data.stacks.map(function (s) { return s.name; }).indexOf("cross");
  var state = {stack: crossIndex >= 0 ? crossIndex : 0, layer: null, view: "head", scale: "linear", query: null,
               pinned: true, off: {}, detail: null, zoom: null};
  var cache = {};

  function stack() { return data.stacks[state.stack]; }
  function defaultQuery(s) { return s.visible ? s.queries.length - 1 : 0; }  /* a causal first token sees itself only */
  function resetStack() { state.layer = stack().layers.length - 1; state.query = defaultQuery(stack()); state.detail = null; state.zoom = null; }
  resetStack();

  /* ---------------- data: one layer, decoded on demand ---------------- */
  /* Layer object: heads, nq, nk, row(h, q) -> {keys, weights, first, dropped, exact}, dense(h) -> Float32Array
     [nq * nk] (NaN where not kept) or null when too large, pooled -> {grid, queryStarts, keyStarts, weights} */
  function fullLayer(s, l) {
    var nq = s.queries.length, nk = s.keys.length, heads = l.heads.length, w = AV.decode(l, nk);
    return {heads: heads, nq: nq, nk: nk, exact: true, weights: w,
      row: function (h, q) {
        var n = s.visible ? s.visible[q] : nk, keys = [], weights = [], base = (h * nq + q) * nk;
        for (var k = 0; k < n; k++) { keys.push(k); weights.push(w[base + k]); }
        return {keys: keys, weights: weights, first: w[base], dropped: 0, exact: true};
      },
      block: function (h) { return {weights: w, offset: h * nq * nk}; }};
  }
  function rowsLayer(s, l, rawRows, rawPooled) {
    var nq = s.queries.length, nk = s.keys.length, heads = l.heads.length, top = l.top, rows = heads * nq;
    var read = AV.reader(rawRows);
    var scales = AV.bfloats(read(2, rows)), gaps = read(l.indexBytes, rows * top), codes = read(1, rows * top);
    var first = read(1, rows), dropped = read(1, rows);
    var readPooled = AV.reader(rawPooled), gq = l.grid[0], gk = l.grid[1];
    var pooledScales = AV.floats(readPooled(4, heads * gq)), pooledCodes = readPooled(1, heads * gq * gk);
    var pooled = new Float32Array(heads * gq * gk);
    for (var i = 0; i < pooled.length; i++) pooled[i] = pooledCodes[i] * pooledScales[Math.floor(i / gk)];
    return {heads: heads, nq: nq, nk: nk, exact: false, top: top,
      row: function (h, q) {
        var r = h * nq + q, scale = scales[r], keys = [], weights = [], position = 0;
        for (var j = 0; j < top; j++) {
          position += gaps[r * top + j];
          keys.push(position); weights.push(codes[r * top + j] * scale);
        }
        return {keys: keys, weights: weights, first: first[r] * scale, dropped: dropped[r] * scale, exact: false, top: top};
      },
      pooled: {grid: l.grid, queryStarts: l.queryStarts, keyStarts: l.keyStarts, weights: pooled},
      block: function (h) { return {weights: pooled, offset: h * gq * gk}; }};
  }
  var decoded = {};  /* layers ready to draw: short layers at once, long ones once inflated */
  function load(si, li) {
    var id = si + ":" + li;
    if (!cache[id]) {
      var s = data.stacks[si], l = s.layers[li];
      if (l.mode === "rows") {
        cache[id] = Promise.all([AV.inflate(l.rows), AV.inflate(l.pooled)]).then(function (raw) {
          return (decoded[id] = rowsLayer(s, l, raw[0], raw[1]));
        });
      } else {
        decoded[id] = fullLayer(s, l);
        cache[id] = Promise.resolve(decoded[id]);
      }
    }
    return cache[id];
  }
  /* for scripts and tests: await attnviz.row(stack, layerPosition, head, query) */
  window.attnviz = {data: data, load: load, row: function (si, li, h, q) { return load(si, li).then(function (L) { return L.row(h, q); }); }};

  function headLabel(l, position) {
    var id = l.heads[position];
    return "H" + id + (l.maskedHeads.indexOf(id) >= 0 ? " (masked)" : "");
  }
  /* weights of a row as a map key -> weight, with the first token always present */
  function rowMap(r) {
    var m = {};
    r.keys.forEach(function (k, j) { if (!(k in m) || r.weights[j] > m[k]) m[k] = r.weights[j]; });
    m[0] = r.first;
    return m;
  }

  var header = AV.el("header", {}, [AV.el("h1", {text: data.title})]);
  var controls = AV.el("div", {"class": "controls"});
  var notes = AV.el("div", {"class": "notes", id: "page-notes"});
  var body = AV.el("main", {});
  app.appendChild(header); app.appendChild(controls); app.appendChild(notes); app.appendChild(body);

  function renderNotes() {
    var s = stack(), l = s.layers[state.layer], parts = [
      (state.view === "head" ? "Left: the tokens attending (queries); right: the tokens attended to (keys)."
        : "Heatmaps: rows are the tokens attending (queries), columns the tokens attended to (keys).") +
      (data.words ? " Words: attention to a word is the sum over its pieces, from a word the mean." : "")];
    if (l.mode === "rows") {
      parts.push("Long input (" + s.queries.length.toLocaleString() + " \u00d7 " + s.keys.length.toLocaleString() +
        " tokens): this page keeps, for every query of every head, its " + l.top + " strongest keys and its weight on " +
        "the first token, each within 1/510 of the row's largest weight; every weight it drops is at most the row's " +
        "bound (shown with the row). Heatmaps of a whole head are pooled: each cell is the largest weight in its " +
        "block of tokens; click a cell to zoom into its rows.");
    }
    notes.textContent = "";
    parts.forEach(function (p) { notes.appendChild(AV.el("p", {"class": "hint", text: p})); });
  }

  function renderControls() {
    controls.innerHTML = "";
    ["head", "model"].forEach(function (view) {
      controls.appendChild(AV.el("button", {"class": "tab" + (state.view === view ? " active" : ""), id: "tab-" + view,
        text: view === "head" ? "Head view" : "Model view", onclick: function () { state.view = view; render(); }}));
    });
    if (data.stacks.length > 1) {
      controls.appendChild(AV.select("Attention", data.stacks.map(function (s, i) { return [i, s.label]; }), state.stack,
        function (v) { state.stack = +v; resetStack(); render(); }, {id: "stack-select"}));
    }
    if (state.view === "head") {
      controls.appendChild(AV.select("Layer", stack().layers.map(function (l, i) { return [i, "layer " + l.layer]; }),
        state.layer, function (v) { state.layer = +v; render(); }, {id: "layer-select"}));
      var s = stack();
      controls.appendChild(AV.el("label", {"class": "control"}, ["Query ", AV.el("input", {type: "number", id: "query-input",
        min: 0, max: s.queries.length - 1, value: state.query, style: "width: 6em",
        onchange: function (event) {
          var q = Math.max(0, Math.min(s.queries.length - 1, Math.round(+event.target.value) || 0));
          state.query = q; state.pinned = true; render();
        }})]));
    }
    controls.appendChild(AV.select("Colour scale", [["linear", "linear"], ["sqrt", "square root"], ["log", "log"]],
      state.scale, function (v) { state.scale = v; render(); }, {id: "scale-select"}));
  }

  /* ---------------- head view ---------------- */
  function headView(L) {
    var s = stack(), l = s.layers[state.layer], nq = s.queries.length, nk = s.keys.length, heads = l.heads.length;
    var offKey = state.stack + ":" + state.layer, off = state.off[offKey] || {};
    var toggles = AV.el("div", {"class": "head-toggles"}, [AV.el("span", {text: "Heads (click: show/hide, double-click: only this one):"})]);
    for (var h = 0; h < heads; h++) {
      (function (h) {
        var on = !off[h];
        toggles.appendChild(AV.el("button", {"class": "head-toggle" + (on ? " on" : ""), "data-head": h,
          "aria-pressed": on ? "true" : "false", style: "--head:" + AV.headColour(h), text: headLabel(l, h),
          onclick: function () { off[h] = !off[h]; state.off[offKey] = off; render(); },
          ondblclick: function () {
            for (var i = 0; i < heads; i++) off[i] = i !== h;
            state.off[offKey] = off; render();
          }}));
      })(h);
    }
    toggles.appendChild(AV.el("button", {"class": "small", id: "heads-all", text: "all", onclick: function () {
      state.off[offKey] = {}; render(); }}));
    toggles.appendChild(AV.el("button", {"class": "small", id: "heads-none", text: "none", onclick: function () {
      var o = {}; for (var i = 0; i < heads; i++) o[i] = true; state.off[offKey] = o; render(); }}));
    var shown = [];
    for (h = 0; h < heads; h++) if (!off[h]) shown.push(h);

    var compact = nq > SHOW_ALL || nk > SHOW_ALL;
    var readout = AV.el("div", {"class": "readout", id: "head-readout"});
    var svgBox = AV.el("div", {"class": "head-box"});
    var table = AV.el("div", {"class": "top-keys", id: "top-keys"});
    var legend = AV.el("p", {"class": "hint", text: "Lines: width and opacity by weight (none below " + LINE_MIN + " unless within a quarter of the head's strongest). " +
      "Blocks beside each key: one per head in its colour, solid where that head attends most from this query " +
      "(point at a block for the weight). Point at or click a query on the left."});
    body.appendChild(AV.el("section", {id: "head-view"}, [toggles, legend, readout, AV.el("div", {"class": "head-split"}, [svgBox, table])]));

    function draw(query) {
      svgBox.innerHTML = ""; table.innerHTML = "";
      var rows = shown.map(function (h) { return L.row(h, query); }), maps = rows.map(rowMap);
      /* the query column: every query, or a window around the chosen one */
      var queryList = [];
      if (!compact) for (var i = 0; i < nq; i++) queryList.push(i);
      else for (i = Math.max(0, query - WINDOW); i <= Math.min(nq - 1, query + WINDOW); i++) queryList.push(i);
      /* the key column: every key, or the strongest keys of the shown heads with gaps marked */
      var keyList = [];
      if (!compact) for (i = 0; i < nk; i++) keyList.push(i);
      else {
        var best = {};
        maps.forEach(function (m) { Object.keys(m).forEach(function (k) { best[k] = Math.max(best[k] || 0, m[k]); }); });
        keyList = Object.keys(best).map(Number).filter(function (k) { return best[k] > 0 && k !== 0; })
          .sort(function (a, b) { return best[b] - best[a]; }).slice(0, MAX_KEYS - 1);
        keyList.push(0);  /* the first token (the usual attention sink) is always listed */
        keyList.sort(function (a, b) { return a - b; });
      }
      var keyRows = [], previous = -1;  /* key column rows: {key} or {gap: count} */
      keyList.forEach(function (k) {
        if (compact && k > previous + 1) keyRows.push({gap: k - previous - 1});
        keyRows.push({key: k}); previous = k;
      });
      if (compact && previous < nk - 1) keyRows.push({gap: nk - 1 - previous});

      var rowHeight = 20, pad = 8, labelWidth = 150;
      var width = Math.max(560, Math.min(1400, (body.clientWidth || 1200) - 380));
      var blockWidth = Math.min(140, Math.max(36, 14 * shown.length));
      var leftX = labelWidth, rightX = width - labelWidth - blockWidth - 6;
      var height = Math.max(queryList.length, keyRows.length) * rowHeight + 2 * pad;
      var svg = AV.svg("svg", {"class": "head-view", width: width, height: height, viewBox: "0 0 " + width + " " + height});
      function y(row) { return pad + (row + 0.5) * rowHeight; }
      var keyRow = {};
      keyRows.forEach(function (r, j) { if (r.key !== undefined) keyRow[r.key] = j; });
      var queryRow = queryList.indexOf(query);

      /* lines: one per head and kept key, width and opacity by weight, fanned within the key's row */
      var lines = AV.svg("g", {"class": "lines"});
      svg.appendChild(lines);
      shown.forEach(function (h, j) {
        var m = maps[j], fan = shown.length > 1 ? (j / (shown.length - 1) - 0.5) * (rowHeight - 6) : 0;
        var peak = Object.keys(m).reduce(function (a, k) { return Math.max(a, m[k]); }, 0);
        Object.keys(m).forEach(function (key) {
          var k = +key, weight = m[key];
          /* a diffuse row (long inputs) still shows its strongest keys */
          if (!(k in keyRow) || weight < Math.min(LINE_MIN, peak / 4)) return;
          lines.appendChild(AV.svg("line", {"class": "att", x1: leftX, y1: y(queryRow), x2: rightX, y2: y(keyRow[k]) + fan,
            stroke: AV.headColour(h), "stroke-width": (0.6 + 7 * weight).toFixed(2),
            "stroke-opacity": Math.min(1, 0.08 + Math.sqrt(weight)).toFixed(3), "stroke-linecap": "round",
            "data-head": h, "data-key": k, "data-weight": weight}));
        });
      });
      /* query tokens */
      queryList.forEach(function (q, row) {
        var text = AV.svg("text", {"class": "tok q" + (q === query ? " active" : ""), x: leftX - 8, y: y(row),
          "text-anchor": "end", "data-index": q});
        text.textContent = (compact ? q + " " : "") + AV.short(s.queries[q], 18);
        text.addEventListener("mouseenter", function () { if (!state.pinned) { state.query = q; draw(q); } });
        text.addEventListener("click", function () {
          state.pinned = !(state.pinned && state.query === q); state.query = q; syncInput(); draw(q);
        });
        svg.appendChild(text);
      });
      /* key tokens with one colour block per shown head: opacity by the weight this query gives the key */
      var visibleKeys = s.visible ? s.visible[query] : nk;
      keyRows.forEach(function (r, row) {
        if (r.gap !== undefined) {
          var gap = AV.svg("text", {"class": "tok gap", x: rightX + blockWidth + 12, y: y(row), "text-anchor": "start"});
          gap.textContent = "\u22ee " + r.gap.toLocaleString() + " token" + (r.gap === 1 ? "" : "s");
          svg.appendChild(gap);
          return;
        }
        var k = r.key, cell = blockWidth / Math.max(shown.length, 1);
        shown.forEach(function (h, j) {
          var weight = maps[j][k], known = weight !== undefined, peak = rows[j].weights.reduce(function (a, b) { return Math.max(a, b); }, rows[j].first);
          var rect = AV.svg("rect", {"class": "block", x: rightX + 4 + j * cell, y: y(row) - rowHeight / 2 + 2, width: Math.max(1, cell - 1),
            height: rowHeight - 4, fill: AV.headColour(h), "fill-opacity": known ? Math.max(0.04, AV.scaled(weight, peak, state.scale)) : 0,
            stroke: known ? "none" : "#ddd", "data-head": h, "data-key": k});
          var tip = AV.svg("title", {});
          tip.textContent = headLabel(l, h) + ": " + (k >= visibleKeys ? "masked" : known ? AV.fmt(weight) :
            "not kept (\u2264 " + AV.fmt(rows[j].dropped) + ")");
          rect.appendChild(tip);
          svg.appendChild(rect);
        });
        var text = AV.svg("text", {"class": "tok k" + (k >= visibleKeys ? " masked" : ""), x: rightX + blockWidth + 12, y: y(row),
          "text-anchor": "start", "data-index": k});
        text.textContent = (compact ? k + " " : "") + AV.short(s.keys[k], 18);
        svg.appendChild(text);
      });
      svg.addEventListener("mouseleave", function () { if (!state.pinned) { state.query = defaultQuery(s); draw(state.query); } });
      svgBox.appendChild(svg);

      /* readout and the strongest keys per head */
      readout.setAttribute("data-query", query);
      var drop = rows.reduce(function (m, r) { return Math.max(m, r.dropped); }, 0);
      readout.textContent = "from \u201c" + s.queries[query] + "\u201d (" + query + ") \u00b7 " + shown.length + " of " + heads +
        " heads" + (visibleKeys < nk ? " \u00b7 it can see " + visibleKeys + " of " + nk + " keys" : "") +
        (L.exact ? "" : " \u00b7 kept: the " + L.top + " strongest keys and the first token per head; every other weight \u2264 " + AV.fmt(drop)) +
        (state.pinned ? " \u00b7 pinned (click it again to follow the pointer)" : "");
      var rowsTable = AV.el("table", {"class": "heads"}, [AV.el("tr", {}, [AV.el("th", {text: "head"}),
        AV.el("th", {text: "strongest keys"}), AV.el("th", {text: L.exact ? "" : "dropped \u2264"})])]);
      shown.forEach(function (h, j) {
        var m = maps[j], order = Object.keys(m).map(Number).sort(function (a, b) { return m[b] - m[a]; }).slice(0, 3);
        rowsTable.appendChild(AV.el("tr", {"data-head": h}, [
          AV.el("td", {"class": "text"}, [AV.el("span", {"class": "swatch", style: "background:" + AV.headColour(h)}), " " + headLabel(l, h)]),
          AV.el("td", {"class": "text", text: order.map(function (k) { return AV.short(s.keys[k], 12) + " " + AV.shortWeight(m[k]); }).join(", ")}),
          AV.el("td", {text: L.exact ? "" : AV.fmt(rows[j].dropped)})]));
      });
      table.appendChild(rowsTable);
    }
    function syncInput() { var input = document.getElementById("query-input"); if (input) input.value = state.query; }
    draw(state.query);
  }

  /* ---------------- model view ---------------- */
  function modelView(layers) {
    var s = stack(), nq = s.queries.length, nk = s.keys.length;
    var maxHeads = s.layers.reduce(function (m, l) { return Math.max(m, l.heads.length); }, 0);
    var grid = AV.el("table", {"class": "model-grid", id: "model-grid"});
    var head = AV.el("tr", {}, [AV.el("th", {})]);
    for (var h = 0; h < maxHeads; h++) head.appendChild(AV.el("th", {text: "head " + h}));
    grid.appendChild(head);
    function pooledVisible(p) {  /* causal: a pooled row sees the key blocks that start at or before its last query */
      if (!s.visible) return null;
      return p.queryStarts.map(function (start, r) {
        var last = (r + 1 < p.queryStarts.length ? p.queryStarts[r + 1] : nq) - 1, seen = s.visible[last];
        return p.keyStarts.filter(function (k) { return k < seen; }).length;
      });
    }
    s.layers.forEach(function (l, li) {
      var row = AV.el("tr", {}, [AV.el("th", {text: "layer " + l.layer})]), L = layers[li];
      for (var h = 0; h < l.heads.length; h++) {
        var canvas = AV.el("canvas", {"class": "thumb"}), thumb = Math.max(36, Math.min(80, Math.floor(900 / Math.max(maxHeads, 1))));
        canvas.style.width = thumb + "px"; canvas.style.height = thumb + "px";
        if (L.exact) AV.thumbnail(canvas, L.weights, h * nq * nk, nq, nk, s.visible, state.scale);
        else {
          var p = L.pooled;
          AV.thumbnail(canvas, p.weights, h * p.grid[0] * p.grid[1], p.grid[0], p.grid[1], pooledVisible(p), state.scale);
        }
        var masked = l.maskedHeads.indexOf(l.heads[h]) >= 0;
        (function (li, h) {
          var selected = state.detail && state.detail[0] === li && state.detail[1] === h;
          row.appendChild(AV.el("td", {"class": "cell" + (selected ? " selected" : "") + (masked ? " masked-head" : ""),
            "data-layer": li, "data-head": h, title: "layer " + l.layer + ", " + headLabel(l, h) + " \u2014 click for its heatmap",
            onclick: function () { state.detail = [li, h]; state.zoom = null; render(); }},
            [canvas, l.heads[h] !== h || masked ? AV.el("div", {"class": "tag", text: headLabel(l, h)}) : AV.el("span")]));
        })(li, h);
      }
      grid.appendChild(row);
    });
    var detail = AV.el("div", {"class": "detail", id: "detail"});
    if (state.detail) {
      var l = s.layers[state.detail[0]], L = layers[state.detail[0]], hd = state.detail[1];
      var title = s.label + " \u00b7 layer " + l.layer + " \u00b7 " + headLabel(l, hd);
      if (L.exact) {
        detail.appendChild(AV.heatmap({queries: s.queries, keys: s.keys, weights: L.weights,
          offset: hd * nq * nk, visible: s.visible, scale: state.scale, title: title}));
      } else {
        var p = L.pooled, span = function (starts, r, n) {
          var end = (r + 1 < starts.length ? starts[r + 1] : n) - 1;
          return end > starts[r] ? starts[r] + "\u2013" + end : String(starts[r]);
        };
        detail.appendChild(AV.heatmap({queries: p.queryStarts.map(function (_, r) { return span(p.queryStarts, r, nq); }),
          keys: p.keyStarts.map(function (_, c) { return span(p.keyStarts, c, nk); }), weights: p.weights,
          offset: hd * p.grid[0] * p.grid[1], visible: pooledVisible(p), scale: state.scale, maxSize: 640,
          title: title + " \u00b7 pooled " + p.grid[0] + " \u00d7 " + p.grid[1],
          note: "Each cell is the largest weight in its block of tokens. Click a cell to zoom into its rows.",
          cellNote: function (w) { return "largest weight in the block " + AV.fmt(w); },
          onclick: function (r, c) { state.zoom = [r, c]; render(); }}));
        if (state.zoom) detail.appendChild(zoomView(L, hd, title));
      }
    } else {
      detail.appendChild(AV.el("p", {"class": "hint", text: "Click a thumbnail to open that head as a heatmap."}));
    }
    body.appendChild(AV.el("section", {id: "model-view", "class": "split"}, [AV.el("div", {"class": "scroll grid-box"}, [grid]), detail]));
  }

  /* the rows of one pooled block, cell by cell from each row's kept keys (the rest drawn as not kept) */
  function zoomView(L, h, title) {
    var s = stack(), p = L.pooled, r = state.zoom[0], c = state.zoom[1], nq = s.queries.length, nk = s.keys.length;
    var q0 = p.queryStarts[r], q1 = r + 1 < p.queryStarts.length ? p.queryStarts[r + 1] : nq;
    var kc0 = p.keyStarts[c], kc1 = c + 1 < p.keyStarts.length ? p.keyStarts[c + 1] : nk;
    var width = Math.max(kc1 - kc0, Math.min(64, nk)), k0 = Math.max(0, Math.min(nk - width, Math.round((kc0 + kc1 - width) / 2)));
    var k1 = Math.min(nk, k0 + width), cols = k1 - k0, rowsN = q1 - q0, weights = new Float32Array(rowsN * cols), bounds = [];
    for (var q = q0; q < q1; q++) {
      var row = L.row(h, q), m = rowMap(row);
      bounds.push(row.dropped);
      for (var k = k0; k < k1; k++) weights[(q - q0) * cols + k - k0] = k in m ? m[k] : NaN;
    }
    var visible = s.visible ? s.visible.slice(q0, q1).map(function (v) { return Math.max(0, Math.min(cols, v - k0)); }) : null;
    var box = AV.heatmap({queries: s.queries.slice(q0, q1).map(function (t, i) { return (q0 + i) + " " + t; }),
      keys: s.keys.slice(k0, k1).map(function (t, i) { return (k0 + i) + " " + t; }), weights: weights, visible: visible,
      scale: state.scale, maxSize: 640, dropped: true, title: "zoom: queries " + q0 + "\u2013" + (q1 - 1) + ", keys " + k0 + "\u2013" + (k1 - 1),
      missing: function (qi) { return "not kept: \u2264 " + AV.fmt(bounds[qi]); }});
    box.id = "zoom";
    return box;
  }

  var generation = 0;
  function render() {
    var mine = ++generation;
    document.body.setAttribute("data-ready", "false");
    renderControls(); renderNotes();
    var s = stack(), wanted = state.view === "head" ? [state.layer] : s.layers.map(function (_, i) { return i; });
    function draw(layers) {
      if (mine !== generation) return;  /* a later render replaced this one */
      body.innerHTML = "";
      if (state.view === "head") headView(layers[0]); else modelView(layers);
      document.body.setAttribute("data-ready", "true");
    }
    var pending = wanted.map(function (li) { return load(state.stack, li); });
    var ready = wanted.map(function (li) { return decoded[state.stack + ":" + li]; });
    if (ready.every(function (L) { return L; })) { draw(ready); return; }  /* drawn at once: scripts may click next */
    Promise.all(pending).then(draw).catch(function (error) {
      body.textContent = "This page could not decode its data: " + error;
      console.error(error);
    });
  }
  render();
})();
