/* attnviz diff page: what changed between two models (a divergence grid and a sortable table of every head)
   or between two inputs on one model (A, B and B - A side by side for a chosen head). Uses common.js (AV). */
(function () {
  var data = AV.data();
  var app = document.getElementById("app");

  /* difference -> colour on a blue - white - red scale centred on 0 (t in [-1, 1]) */
  function diverging(t) {
    t = Math.max(-1, Math.min(1, t));
    var blue = [33, 102, 172], red = [178, 24, 43], white = [247, 247, 247];
    var end = t < 0 ? blue : red, a = Math.abs(t);
    return AV.css(white.map(function (w, i) { return w + (end[i] - w) * a; }));
  }

  function number(value, digits) { return value === null || value === undefined ? "\u2013" : value.toFixed(digits); }

  function header() {
    app.appendChild(AV.el("header", {}, [
      AV.el("h1", {text: data.title}),
      AV.el("p", {class: "hint", text: data.hint})
    ]));
  }

  /* ---- two models: layer x head grid of one column, and the table of every head ---- */
  function models() {
    var state = {column: 0, sort: 0, descending: true};
    var main = AV.el("main", {}), controls = AV.el("div", {class: "controls"});
    app.appendChild(controls);
    app.appendChild(main);
    var gridBox = AV.el("div", {class: "grid-box", id: "diff-grid"}), tableBox = AV.el("div", {class: "scroll", id: "table-box"});
    main.appendChild(AV.el("h2", {text: "by layer and head"}));
    main.appendChild(gridBox);
    main.appendChild(AV.el("h2", {text: "every head (click a column to sort)"}));
    main.appendChild(tableBox);
    controls.appendChild(AV.select("colour by", data.columns.map(function (c, i) { return [String(i), c.name]; }),
      "0", function (value) { state.column = +value; grid(); }, {id: "grid-column"}));

    function grid() {
      gridBox.innerHTML = "";
      var column = data.columns[state.column];
      var values = data.heads.map(function (h) { return h.values[state.column]; }).filter(function (v) { return v !== null; });
      var top = values.reduce(function (m, v) { return Math.max(m, Math.abs(v)); }, 0) || 1;
      var layers = {}, width = 0;
      data.heads.forEach(function (h) { (layers[h.stack + " " + h.layer] = layers[h.stack + " " + h.layer] || []).push(h); width = Math.max(width, h.head + 1); });
      var table = AV.el("table", {class: "model-grid"});
      var top_row = AV.el("tr", {}, [AV.el("th", {text: "layer \\ head"})]);
      for (var c = 0; c < width; c++) top_row.appendChild(AV.el("th", {text: String(c)}));
      table.appendChild(top_row);
      Object.keys(layers).forEach(function (key) {
        var row = AV.el("tr", {}, [AV.el("th", {text: key})]);
        var byHead = {};
        layers[key].forEach(function (h) { byHead[h.head] = h; });
        for (var c = 0; c < width; c++) {
          var h = byHead[c];
          if (!h) { row.appendChild(AV.el("td", {class: "value gone", text: ""})); continue; }
          var v = h.values[state.column];
          if (h.status !== "matched" || v === null) {
            row.appendChild(AV.el("td", {class: "value gone", "data-status": h.status, text: h.status === "only_a" ? "A" : h.status === "only_b" ? "B" : "\u2013"}));
            continue;
          }
          var colour = column.signed ? diverging(v / top) : AV.css(AV.colour(Math.abs(v) / top));
          var dark = !column.signed && Math.abs(v) / top < 0.6;
          row.appendChild(AV.el("td", {class: "value", title: column.name + " " + v, "data-value": String(v),
            style: "background:" + colour + ";color:" + (dark ? "#fff" : "#000"), text: (v * column.scale).toFixed(2)}));
        }
        table.appendChild(row);
      });
      gridBox.appendChild(table);
      gridBox.appendChild(AV.el("p", {class: "hint", text: column.name + " \u00d7 " + column.scale + "; A / B: head in one model only"}));
    }

    function rows() {
      tableBox.innerHTML = "";
      var table = AV.el("table", {class: "heads", id: "heads-table"});
      var head = AV.el("tr", {});
      var fixed = ["stack", "layer", "head", "status"];
      fixed.forEach(function (name) { head.appendChild(AV.el("th", {text: name})); });
      data.columns.forEach(function (c, i) {
        var arrow = state.sort === i ? (state.descending ? " \u25bc" : " \u25b2") : "";
        head.appendChild(AV.el("th", {"data-sort": String(i), title: c.help, text: c.name + arrow, onclick: function () {
          if (state.sort === i) state.descending = !state.descending; else { state.sort = i; state.descending = true; }
          rows();
        }}));
      });
      table.appendChild(head);
      var sorted = data.heads.slice().sort(function (a, b) {
        var x = a.values[state.sort], y = b.values[state.sort];
        if (x === null && y === null) return 0;
        if (x === null) return 1;
        if (y === null) return -1;
        return state.descending ? Math.abs(y) - Math.abs(x) : Math.abs(x) - Math.abs(y);
      });
      sorted.forEach(function (h) {
        var tr = AV.el("tr", {"data-head": h.stack + "." + h.layer + "." + h.head}, [
          AV.el("td", {class: "text", text: h.stack}), AV.el("td", {text: String(h.layer)}),
          AV.el("td", {text: String(h.head)}), AV.el("td", {class: "text", text: h.status})]);
        h.values.forEach(function (v) { tr.appendChild(AV.el("td", {text: number(v, 5)})); });
        table.appendChild(tr);
      });
      tableBox.appendChild(table);
    }
    grid();
    rows();
  }

  /* ---- two inputs: A, B and B - A of one head ---- */
  function inputs() {
    if (!data.sites.length) {
      app.appendChild(AV.el("main", {}, [AV.el("p", {class: "hint", id: "no-grid", text: "The two inputs share no word: only their statistics are compared (see the JSON)."})]));
      return;
    }
    var state = {site: 0, head: data.best.head};
    data.sites.forEach(function (s, i) { if (s.stack === data.best.stack && s.layer === data.best.layer) state.site = i; });
    var controls = AV.el("div", {class: "controls"}), main = AV.el("main", {});
    app.appendChild(controls);
    app.appendChild(main);
    var readout = AV.el("div", {class: "readout", id: "readout"});
    controls.appendChild(AV.select("layer", data.sites.map(function (s, i) { return [String(i), s.stack + " " + s.layer]; }),
      String(state.site), function (value) { state.site = +value; draw(); }, {id: "layer-select"}));
    var heads = [];
    for (var h = 0; h < data.sites[0].a.length; h++) heads.push([String(h), "head " + data.sites[0].heads[h]]);
    controls.appendChild(AV.select("head", heads, String(state.head), function (value) { state.head = +value; draw(); }, {id: "head-select"}));

    /* each side's own tokens; the difference shows both where they differ ("are/is") */
    var both = data.labelsA.map(function (label, i) { return label === data.labelsB[i] ? label : label + "/" + data.labelsB[i]; });

    function panel(title, matrix, signed, top, labels) {
      var table = AV.el("table", {class: "model-grid diff-panel"});
      var first = AV.el("tr", {}, [AV.el("th", {text: ""})]);
      labels.forEach(function (label) { first.appendChild(AV.el("th", {text: label})); });
      table.appendChild(first);
      matrix.forEach(function (row, q) {
        var tr = AV.el("tr", {}, [AV.el("th", {text: labels[q]})]);
        row.forEach(function (v, k) {
          var colour = signed ? diverging(v / top) : AV.css(AV.colour(v / top));
          var dark = signed ? Math.abs(v) / top > 0.6 : v / top < 0.6;
          tr.appendChild(AV.el("td", {class: "value", "data-value": String(v), style: "background:" + colour + ";color:" + (dark ? "#fff" : "#000"),
            text: v.toFixed(2), onmouseenter: function () {
              readout.textContent = title + ": " + labels[q] + " \u2192 " + labels[k] + " = " + v.toFixed(4);
            }}));
        });
        table.appendChild(tr);
      });
      return AV.el("div", {}, [AV.el("div", {class: "heatmap-title", text: title}), table]);
    }

    function draw() {
      main.innerHTML = "";
      var site = data.sites[state.site];
      var a = site.a[state.head], b = site.b[state.head];
      var difference = a.map(function (row, q) { return row.map(function (v, k) { return b[q][k] - v; }); });
      var top = 0, largest = 0;
      a.concat(b).forEach(function (row) { row.forEach(function (v) { top = Math.max(top, v); }); });
      difference.forEach(function (row) { row.forEach(function (v) { largest = Math.max(largest, Math.abs(v)); }); });
      main.appendChild(AV.el("p", {class: "hint", id: "head-summary", text: site.stack + " layer " + site.layer + " head " + site.heads[state.head] +
        ": mean JS " + number(site.js[state.head], 5) + " nats, mean total variation " + number(site.tv[state.head], 5)}));
      main.appendChild(AV.el("div", {class: "split"}, [
        panel("A: " + data.textA, a, false, top || 1, data.labelsA),
        panel("B: " + data.textB, b, false, top || 1, data.labelsB),
        panel("B \u2212 A", difference, true, largest || 1, both)
      ]));
      main.appendChild(readout);
    }
    draw();
  }

  header();
  if (data.kind === "inputs") inputs(); else models();
})();
