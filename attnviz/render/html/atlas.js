/* attnviz head atlas: a sortable, filterable table of every head, a layer x head grid coloured by one column,
   and the selected head's pattern on a few example texts. Data: the inline #attnviz-data JSON. */
(function () {
  var data = AV.data(), app = document.getElementById("app");
  var state = {stack: data.stacks[0].name, sort: null, descending: true, filter: "", flag: "", gridColumn: 0, selected: null};
  var cache = {};
  var columns = data.columns;

  function rowsOfStack() { return data.heads.filter(function (r) { return r.stack === state.stack; }); }
  function allFlags() {
    var seen = {};
    data.heads.forEach(function (r) { r.flags.forEach(function (f) { seen[f] = true; }); });
    return Object.keys(seen).sort();
  }
  function fmt(value) {
    if (value === null || value === undefined) return "";
    return typeof value === "number" ? (Math.abs(value) >= 100 ? value.toFixed(1) : value.toFixed(3)) : String(value);
  }
  function matches(row) {
    if (state.flag && row.flags.indexOf(state.flag) < 0) return false;
    if (!state.filter) return true;
    var words = ("L" + row.layer + " H" + row.head + " " + row.flags.join(" ")).toLowerCase().split(" ");
    var text = words.join(" ");
    /* "L3" / "H7" name one layer or head exactly (not L30); any other term matches part of a flag */
    return state.filter.toLowerCase().split(/\s+/).every(function (term) {
      if (!term) return true;
      return /^[lh]\d+$/.test(term) ? words.indexOf(term) >= 0 : text.indexOf(term) >= 0;
    });
  }

  app.appendChild(AV.el("header", {}, [
    AV.el("h1", {text: "Head atlas \u00b7 " + data.title}),
    AV.el("p", {"class": "hint", text: "Statistics are means over " + data.numExamples + " examples (" + data.numTokens +
      " query positions per layer), as attnviz stats computes them. Click a head in the grid or the table to see its pattern on example texts."})]));
  var controls = AV.el("div", {"class": "controls"});
  var main = AV.el("main", {});
  app.appendChild(controls); app.appendChild(main);
  var gridBox = AV.el("section", {id: "grid-box"}), detail = AV.el("section", {id: "head-detail"});
  var tableBox = AV.el("section", {id: "table-box", "class": "scroll"});
  main.appendChild(AV.el("div", {"class": "split"}, [gridBox, detail]));
  main.appendChild(tableBox);

  function renderControls() {
    controls.innerHTML = "";
    if (data.stacks.length > 1) {
      controls.appendChild(AV.select("Attention", data.stacks.map(function (s) { return [s.name, s.label]; }), state.stack,
        function (v) { state.stack = v; state.selected = null; render(); }, {id: "stack-select"}));
    }
    controls.appendChild(AV.select("Grid colour", columns.map(function (c, i) { return [i, c.name]; })
      .filter(function (o) { return columns[o[0]].kind === "number"; }), state.gridColumn,
      function (v) { state.gridColumn = +v; renderGrid(); }, {id: "grid-stat"}));
    var filter = AV.el("input", {id: "filter", type: "search", placeholder: "e.g. L3  or  sink", value: state.filter});
    filter.addEventListener("input", function () { state.filter = filter.value; renderTable(); });
    controls.appendChild(AV.el("label", {"class": "control"}, ["Filter ", filter]));
    controls.appendChild(AV.select("Flag", [["", "any"]].concat(allFlags().map(function (f) { return [f, f]; })), state.flag,
      function (v) { state.flag = v; renderTable(); }, {id: "flag-filter"}));
  }

  function renderGrid() {
    gridBox.innerHTML = "";
    var stack = data.stacks.filter(function (s) { return s.name === state.stack; })[0];
    var rows = rowsOfStack(), c = state.gridColumn, lo = Infinity, hi = -Infinity;
    rows.forEach(function (r) { var v = r.values[c]; if (typeof v === "number") { lo = Math.min(lo, v); hi = Math.max(hi, v); } });
    var table = AV.el("table", {"class": "model-grid", id: "atlas-grid"});
    var header = AV.el("tr", {}, [AV.el("th", {})]);
    for (var h = 0; h < stack.numHeads; h++) header.appendChild(AV.el("th", {text: "H" + h}));
    table.appendChild(header);
    var byLayer = {};
    rows.forEach(function (r) { (byLayer[r.layer] = byLayer[r.layer] || []).push(r); });
    for (var layer = 0; layer < stack.numLayers; layer++) {
      var tr = AV.el("tr", {}, [AV.el("th", {text: "L" + layer})]);
      var cells = (byLayer[layer] || []).slice().sort(function (a, b) { return a.head - b.head; });
      var byHead = {};
      cells.forEach(function (r) { byHead[r.head] = r; });
      var width = Math.max(stack.numHeads, cells.length ? cells[cells.length - 1].head + 1 : 0);
      for (h = 0; h < width; h++) {
        var r = byHead[h];
        if (!r) { tr.appendChild(AV.el("td", {"class": "gone", title: "removed by pruning", text: "\u2013"})); continue; }
        var v = r.values[c], t = hi > lo ? (v - lo) / (hi - lo) : 0.5, rgb = AV.colour(t);
        var light = 0.2126 * rgb[0] + 0.7152 * rgb[1] + 0.0722 * rgb[2] > 120;
        (function (r) {
          var selected = state.selected === r;
          tr.appendChild(AV.el("td", {"class": "cell value" + (selected ? " selected" : ""), "data-layer": r.layer, "data-head": r.head,
            style: "background:" + (typeof v === "number" ? AV.css(rgb) : "#eee") + ";color:" + (light ? "#000" : "#fff"),
            title: "L" + r.layer + " H" + r.head + ": " + columns[c].name + " " + fmt(v) + (r.flags.length ? " \u00b7 " + r.flags.join(", ") : ""),
            text: typeof v === "number" ? v.toFixed(2) : "", onclick: function () { select(r); }}));
        })(r);
      }
      table.appendChild(tr);
    }
    gridBox.appendChild(AV.el("h2", {text: columns[c].name + " by layer and head"}));
    gridBox.appendChild(AV.el("p", {"class": "hint", text: columns[c].help + " \u00b7 colour from " + fmt(lo) + " to " + fmt(hi)}));
    gridBox.appendChild(table);
  }

  function renderTable() {
    tableBox.innerHTML = "";
    var rows = data.heads.filter(function (r) { return r.stack === state.stack && matches(r); });
    if (state.sort !== null) {
      var k = state.sort, sign = state.descending ? -1 : 1;
      rows.sort(function (a, b) {
        var x = k < 0 ? (k === -1 ? a.layer * 1000 + a.head : a.flags.join()) : a.values[k];
        var y = k < 0 ? (k === -1 ? b.layer * 1000 + b.head : b.flags.join()) : b.values[k];
        if (x === null || x === undefined) return 1;
        if (y === null || y === undefined) return -1;
        return x < y ? -sign : x > y ? sign : 0;
      });
    }
    var table = AV.el("table", {"class": "heads", id: "heads-table"});
    var header = AV.el("tr", {});
    function th(label, key, help) {
      var arrow = state.sort === key ? (state.descending ? " \u25bc" : " \u25b2") : "";
      header.appendChild(AV.el("th", {"data-sort": key, title: help || "click to sort", text: label + arrow, onclick: function () {
        if (state.sort === key) state.descending = !state.descending; else { state.sort = key; state.descending = key >= 0; }
        renderTable();
      }}));
    }
    th("head", -1, "layer and head (original numbering)");
    columns.forEach(function (c, i) { th(c.name, i, c.help); });
    th("flags", -2, "labels from attnviz stats' thresholds");
    table.appendChild(header);
    rows.forEach(function (r) {
      var tr = AV.el("tr", {"class": state.selected === r ? "selected" : "", "data-layer": r.layer, "data-head": r.head,
        onclick: function () { select(r); }});
      tr.appendChild(AV.el("td", {"class": "text", text: "L" + r.layer + " H" + r.head}));
      r.values.forEach(function (v, i) {
        tr.appendChild(AV.el("td", {"class": columns[i].kind === "text" ? "text" : "", "data-value": v === null ? "" : v, text: fmt(v)}));
      });
      tr.appendChild(AV.el("td", {"class": "text flags", text: r.flags.join(", ")}));
      table.appendChild(tr);
    });
    tableBox.appendChild(AV.el("p", {"class": "hint", id: "row-count", text: rows.length + " heads shown"}));
    tableBox.appendChild(table);
  }

  function decoded(exampleIndex, stackIndex, layerPosition) {
    var id = exampleIndex + ":" + stackIndex + ":" + layerPosition;
    if (!cache[id]) {
      var s = data.examples[exampleIndex].stacks[stackIndex];
      cache[id] = AV.decode(s.layers[layerPosition], s.keys.length);
    }
    return cache[id];
  }

  function renderDetail() {
    detail.innerHTML = "";
    var r = state.selected;
    if (!r) { detail.appendChild(AV.el("p", {"class": "hint", text: "Click a head to see its pattern on example texts."})); return; }
    detail.appendChild(AV.el("h2", {id: "detail-title", text: "layer " + r.layer + ", head " + r.head +
      (data.stacks.length > 1 ? " (" + r.stack + ")" : "")}));
    detail.appendChild(AV.el("p", {"class": "hint", text: r.flags.length ? "flags: " + r.flags.join(", ") : "no flags"}));
    var examples = AV.el("div", {"class": "examples"});
    data.examples.forEach(function (example, e) {
      example.stacks.forEach(function (s, si) {
        if (s.name !== r.stack) return;
        var position = -1;
        s.layers.forEach(function (l, li) { if (l.layer === r.layer) position = li; });
        if (position < 0) return;
        var head = s.layers[position].heads.indexOf(r.head);
        if (head < 0) return;
        var nq = s.queries.length, nk = s.keys.length;
        var box = AV.heatmap({queries: s.queries, keys: s.keys, weights: decoded(e, si, position), offset: head * nq * nk,
          visible: s.visible, scale: "linear", maxSize: 300, title: "example " + (e + 1)});
        box.setAttribute("data-example", e);
        examples.appendChild(box);
      });
    });
    detail.appendChild(examples);
  }

  function select(row) { state.selected = row; renderGrid(); renderTable(); renderDetail(); }
  function render() { renderControls(); renderGrid(); renderTable(); renderDetail(); }
  render();
})();
