"""The HTML page of a circuit: the graph with a slider for the edges kept, the faithfulness curve, and the clean
prompt's attention (the head view) below, where a click on a head of the graph opens its pattern.

The graph is an inline SVG drawn by the page's own script from the node positions of
:func:`attnviz.render.circuit_graph.node_positions` and the top edges; the slider redraws the edges only (the
nodes, which link into the head view as on the ``patch`` page, stay). One self-contained file.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

from attnviz.captures.attention_capture import AttentionCapture
from attnviz.render.circuit_graph import (
    INPUT_PORTS,
    NEGATIVE,
    POSITIVE,
    draw_curve,
    node_positions,
    verification_words,
)
from attnviz.render.figures import figure_png, subplots
from attnviz.render.html_page import _script_json, write_page
from attnviz.render.html_view import attention_view_html
from attnviz.render.patch_page import HEAD_LINK_SCRIPT

#: edges the slider reaches at most
MAX_SLIDER = 400

_STYLE = (
    "#circuit-summary{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:12px 16px;color:#222}"
    "#circuit-summary p{font-size:13px;margin:4px 0}#circuit-row{display:flex;flex-wrap:wrap;gap:16px;align-items:flex-start}"
    "#circuit-graph{border:1px solid #ddd;background:#fff}#circuit-curve{width:420px;max-width:100%;height:auto}"
    "#circuit-graph a{cursor:pointer}#circuit-graph text{font-size:9px;pointer-events:none}"
)

_SCRIPT = """<script>
(function () {
  var data = JSON.parse(document.getElementById("circuit-data").textContent);
  var svg = document.getElementById("circuit-graph");
  var NS = "http://www.w3.org/2000/svg";
  var scaleX = 46, scaleY = 40, left = 60, top = 30;
  var xs = data.nodes.map(function (n) { return n.x; });
  var minX = Math.min.apply(null, xs), maxX = Math.max.apply(null, xs);
  var width = left * 2 + (maxX - minX) * scaleX, height = top * 2 + (data.layers + 1.6) * scaleY;
  svg.setAttribute("width", width); svg.setAttribute("height", height);
  svg.setAttribute("viewBox", "0 0 " + width + " " + height);
  function px(n) { return left + (n.x - minX) * scaleX; }
  function py(n) { return top + (data.layers + 0.3 - n.y) * scaleY; }
  function element(name, attributes, parent) {
    var e = document.createElementNS(NS, name);
    for (var key in attributes) { e.setAttribute(key, attributes[key]); }
    parent.appendChild(e); return e;
  }
  for (var layer = 0; layer < data.layers; layer++) {
    element("text", {x: 8, y: py({y: layer}) + 3}, svg).textContent = "layer " + layer;
  }
  var edgeLayer = element("g", {}, svg);
  var nodeLayer = element("g", {}, svg);
  data.nodes.forEach(function (n) {
    var holder = nodeLayer;
    if (n.kind === "head") {
      holder = element("a", {"class": "patch-head", "data-layer": n.layer, "data-head": n.head, href: "#app"}, nodeLayer);
      element("title", {}, holder).textContent = "layer " + n.layer + " head " + n.head + ": click for its attention";
    }
    var w = n.kind === "head" ? 34 : 44;
    element("rect", {x: px(n) - w / 2, y: py(n) - 9, width: w, height: 18, rx: 4, fill: "#f4f4f4", stroke: "#999"}, holder);
    element("text", {x: px(n), y: py(n) + 3, "text-anchor": "middle"}, holder).textContent = n.label;
  });
  var slider = document.getElementById("circuit-slider"), readout = document.getElementById("circuit-kept");
  var ports = data.ports, styles = {solid: "", dashed: "5,3", dotted: "1.5,2.5"};
  function faithfulness(k) {
    var curve = data.curve, best = null;
    for (var i = 0; i < curve.length; i++) { if (curve[i][0] <= k) { best = curve[i]; } }
    return best;
  }
  function draw() {
    var k = parseInt(slider.value, 10);
    while (edgeLayer.firstChild) { edgeLayer.removeChild(edgeLayer.firstChild); }
    var shown = data.edges.slice(0, k), largest = 0;
    shown.forEach(function (e) { largest = Math.max(largest, Math.abs(e.score)); });
    for (var i = shown.length - 1; i >= 0; i--) {
      var e = shown[i], s = data.nodes[e.sender], r = data.nodes[e.receiver], port = ports[e.input || ""];
      var line = element("line", {
        x1: px(s), y1: py(s) - 9, x2: px(r) + port[0] * 30, y2: py(r) + 9,
        stroke: e.score >= 0 ? data.positive : data.negative, "stroke-opacity": 0.75,
        "stroke-width": 0.5 + 4 * Math.abs(e.score) / (largest || 1), "stroke-dasharray": styles[port[1]]
      }, edgeLayer);
      element("title", {}, line).textContent = e.label + ": " + e.score.toFixed(4);
    }
    var point = faithfulness(k);
    readout.textContent = k + (k === 1 ? " edge" : " edges") + " kept" + (point ? " · faithfulness " +
      point[1].toFixed(3) + " at " + point[0] + (point[0] === 1 ? " edge" : " edges") +
      " (the nearest measured circuit at or below)" : "");
  }
  slider.addEventListener("input", draw);
  draw();
})();
</script>
"""


def circuit_payload(result) -> dict:
    """What the page's script draws: node positions and labels, the top edges, the faithfulness curve."""
    positions = node_positions(result)
    keys = list(positions)
    index = {key: number for number, key in enumerate(keys)}
    nodes = []
    for key in keys:
        kind, layer, head = key
        label = "MLP" if kind == "mlp" else f"H{head}" if kind == "head" else kind
        x, y = positions[key]
        nodes.append({"kind": kind, "layer": layer, "head": head, "x": x, "y": y, "label": label})
    edges = [
        {
            "sender": index[edge.sender],
            "receiver": index[edge.receiver[:3]],
            "input": edge.receiver[3],
            "score": edge.score,
            "label": edge.label,
        }
        for edge in result.edges[:MAX_SLIDER]
    ]
    return {
        "nodes": nodes,
        "edges": edges,
        "layers": result.layers,
        "curve": [[count, value] for count, value in result.faithfulness_curve],
        "ports": {(key or ""): [offset, style] for key, (offset, style) in INPUT_PORTS.items()},
        "positive": POSITIVE,
        "negative": NEGATIVE,
    }


def circuit_summary_html(result, *, links: bool = True) -> str:
    """The graph (with its slider), the faithfulness curve and how they were measured."""
    fig, axes = subplots(1, 1, figsize=(5.0, 3.2), squeeze=False)
    draw_curve(axes[0][0], result)
    fig.tight_layout()
    curve = base64.b64encode(figure_png(fig)).decode("ascii")
    hint = " Click a head to see its attention on the clean prompt below." if links else ""
    top = min(len(result.edges), MAX_SLIDER)
    graph = (
        f'<p><input type="range" id="circuit-slider" min="0" max="{top}" value="{min(result.circuit_edges, top)}"> '
        f'<span id="circuit-kept"></span></p>'
        '<div id="circuit-row"><svg id="circuit-graph" xmlns="http://www.w3.org/2000/svg"></svg>'
        f'<img id="circuit-curve" alt="faithfulness against edges kept" src="data:image/png;base64,{curve}"></div>'
        f'<script type="application/json" id="circuit-data">{_script_json(circuit_payload(result))}</script>'
        if result.edges
        else f'<img id="circuit-curve" alt="faithfulness against nodes kept" src="data:image/png;base64,{curve}">'
    )
    return (
        '<section id="circuit-summary">'
        f"<h1>{html.escape(result.model)}: the circuit that makes {html.escape(repr(result.answer))} "
        f"over {html.escape(repr(result.wrong))}</h1>"
        f"<p>clean: {html.escape(result.clean)} · corrupt: {html.escape(result.corrupt)}</p>"
        f"<p>logit difference: clean {result.clean_logit_diff:.3f}, corrupt {result.corrupt_logit_diff:.3f} · "
        f"{html.escape(result.summary_line() + verification_words(result))}</p>"
        "<p>Edges: red helps the answer, blue works against it; into a head, solid lines reach its query, dashed "
        f"its key, dotted its value. The slider sets how many of the top edges are kept.{hint}</p>"
        f"{graph}</section>\n"
    )


def circuit_page_html(result, capture: AttentionCapture) -> str:
    """One page: the circuit summary above the attention page of ``capture`` (the clean prompt)."""
    page = attention_view_html(capture, title=f"{result.model} · circuit · clean prompt")
    page = page.replace("</style>", _STYLE + "\n</style>", 1)
    page = page.replace('<div id="app"></div>', circuit_summary_html(result) + '<div id="app"></div>', 1)
    script = _SCRIPT if result.edges else ""
    return page.replace("</body>", script + HEAD_LINK_SCRIPT + "</body>", 1)


def circuit_view_html(result) -> str:
    """The summary alone (a notebook's inline view: no head view, the nodes do not link)."""
    body = circuit_summary_html(result, links=False) + (_SCRIPT if result.edges else "")
    return f"<style>{_STYLE}</style>{body}"


def write_circuit_page(path: str | Path, result, capture: AttentionCapture) -> Path:
    """Write :func:`circuit_page_html` to ``path`` (``.html``), atomically."""
    return write_page(path, circuit_page_html(result, capture))
