"""The HTML page of a patching run: the figure, the top heads, and the clean prompt's attention (the head view).

The page is the attention page of :mod:`attnviz.render.html_view` for a capture of the clean prompt, with
the patching summary above it: each top head is a link that opens its layer in the head view and shows
that head alone. One self-contained file, under the same Content-Security-Policy.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

from attnviz.captures.attention_capture import AttentionCapture
from attnviz.render.figures import figure_png
from attnviz.render.html_page import write_page
from attnviz.render.html_view import attention_view_html
from attnviz.render.patch_plots import TOP_HEADS, number, patch_figure

_STYLE = (
    "#patch-summary{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:12px 16px;color:#222}"
    "#patch-summary img{max-width:100%;height:auto}#patch-summary table{border-collapse:collapse;font-size:13px}"
    "#patch-summary td,#patch-summary th{padding:2px 10px;text-align:right}"
    "#patch-summary td:nth-child(2),#patch-summary th:nth-child(2){text-align:left}"
    "#patch-summary p{font-size:13px;margin:4px 0}"
)

#: a click on a top head opens its layer in the head view and shows that head alone (the view's own controls)
_SCRIPT = """<script>
(function () {
  function show(layer, head) {
    var select = document.getElementById("layer-select");
    if (!select) { return; }
    for (var i = 0; i < select.options.length; i++) {
      if (select.options[i].text === "layer " + layer) { select.value = select.options[i].value; }
    }
    select.dispatchEvent(new Event("change"));
    var buttons = document.querySelectorAll(".head-toggle");
    for (var j = 0; j < buttons.length; j++) {
      if (buttons[j].textContent.split(" ")[0] === "H" + head) {
        buttons[j].dispatchEvent(new MouseEvent("dblclick", {bubbles: true}));
      }
    }
    document.getElementById("app").scrollIntoView();
  }
  var links = document.querySelectorAll("a.patch-head");
  for (var k = 0; k < links.length; k++) {
    links[k].addEventListener("click", function (event) {
      event.preventDefault();
      show(this.getAttribute("data-layer"), this.getAttribute("data-head"));
    });
  }
})();
</script>
"""


#: the same links for other pages whose head links (``a.patch-head`` with ``data-layer``/``data-head``) open the view
HEAD_LINK_SCRIPT = _SCRIPT


def patch_summary_html(result, *, top: int = TOP_HEADS, links: bool = True) -> str:
    """The figure (inline PNG), how it was measured, and the top heads (links into the head view when ``links``)."""
    encoded = base64.b64encode(figure_png(patch_figure(result, top=top))).decode("ascii")
    rows = []
    for rank, effect in enumerate(result.top_heads(top), start=1):
        label = html.escape(effect.label)
        if links:
            label = (
                f'<a href="#app" class="patch-head" data-layer="{effect.layer}" data-head="{effect.head}">{label}</a>'
            )
        cells = [
            number(effect.normalized_effect),
            number(effect.patched_logit_diff),
            number(effect.direct_logit_attribution),
            number(effect.ablation_effect),
        ]
        rows.append(f"<tr><td>{rank}</td><td>{label}</td>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    header = "".join(
        f"<th>{name}</th>"
        for name in ("#", "head", "normalised effect", "patched logit diff", "direct logit attribution", "ablation")
    )
    hint = " Click a head to see its attention on the clean prompt below." if links else ""
    return (
        '<section id="patch-summary">'
        f"<h1>{html.escape(result.model)}: which heads make {html.escape(repr(result.answer))} "
        f"over {html.escape(repr(result.wrong))}</h1>"
        f"<p>clean: {html.escape(result.clean)!s} · corrupt: {html.escape(result.corrupt)}</p>"
        f"<p>logit difference: clean {result.clean_logit_diff:.3f}, corrupt {result.corrupt_logit_diff:.3f} · "
        f"{html.escape(result.settings_line())}</p>"
        f'<img alt="normalised patching effect and direct logit attribution per layer and head" '
        f'src="data:image/png;base64,{encoded}">'
        f'<p>Top heads by normalised effect.{hint}</p><table id="top-heads"><tr>{header}</tr>{"".join(rows)}</table>'
        "</section>\n"
    )


def patch_page_html(result, capture: AttentionCapture, *, top: int = TOP_HEADS) -> str:
    """One page: the patching summary above the attention page of ``capture`` (the clean prompt)."""
    page = attention_view_html(capture, title=f"{result.model} · clean prompt")
    page = page.replace("</style>", _STYLE + "\n</style>", 1)
    page = page.replace('<div id="app"></div>', patch_summary_html(result, top=top) + '<div id="app"></div>', 1)
    return page.replace("</body>", _SCRIPT + "</body>", 1)


def write_patch_page(path: str | Path, result, capture: AttentionCapture, *, top: int = TOP_HEADS) -> Path:
    """Write :func:`patch_page_html` to ``path`` (``.html``), atomically."""
    return write_page(path, patch_page_html(result, capture, top=top))
