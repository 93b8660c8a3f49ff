"""Showing attnviz's results inline in a notebook (JupyterLab, VS Code, Colab), and saving what is shown.

Every result becomes an :class:`HtmlView`: ``.html`` is one self-contained page (scripts, styles,
data and pictures inlined, the same Content-Security-Policy as the ``attnviz heatmap`` page), and
``.save(path)`` writes it atomically. In a notebook the view shows as an
``<iframe srcdoc=… sandbox="allow-scripts">`` around that page, because that is the one form that
behaves the same in all three front ends:

* the page's scripts run inside the frame, in a document of their own: no RequireJS, no module
  loader, no CDN, nothing fetched, and the notebook's own scripts and styles cannot collide with them
  (JupyterLab styles bare tables; Colab and VS Code run each output in a frame of their own anyway);
* the page's Content-Security-Policy stays in force inside the frame (``default-src 'none'``);
* ``sandbox`` without ``allow-same-origin`` keeps the page away from the notebook's DOM and cookies.

Tables are the same rich tables the command line prints (exported as HTML with inline styles);
grids are the command line's figures as inline PNG.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from attnviz.captures.attention_capture import AttentionCapture
from attnviz.common.errors import InputError
from attnviz.common.wording import plural
from attnviz.render.html_page import HTML_SUFFIXES, write_page
from attnviz.render.html_view import attention_view_html

#: the Content-Security-Policy of attnviz's pages (see :mod:`attnviz.render.html_page`): nothing from outside
_POLICY = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:"
_STYLE = (
    "body{font-family:system-ui,-apple-system,'Segoe UI','Noto Sans','Noto Sans CJK JP','Hiragino Sans','Microsoft YaHei',sans-serif;margin:12px;color:#222}"
    "h1{font-size:17px;margin:0 0 6px}h2{font-size:15px;margin:16px 0 6px}p{margin:4px 0;font-size:13px}"
    "img{max-width:100%;height:auto}pre{margin:6px 0;font-size:12px;line-height:1.25}"
)
#: opens the attention page on its model view (the page starts on the head view), with the first head's full
#: heatmap beside the grid so that the tokens show at once
_MODEL_VIEW_START = (
    "<script>(function(){var tab=document.getElementById('tab-model');if(!tab){return;}tab.click();"
    "var cell=document.querySelector('#model-grid td.cell');if(cell){cell.click();}})();</script>\n"
)


class HtmlView:
    """A self-contained HTML page that a notebook shows inline: ``.html``, ``.save(path)``, ``_repr_html_()``."""

    def __init__(self, html_page: str, *, title: str, height: int = 600):
        self.html = html_page  # the whole page
        self.title = title
        self.height = height  # pixels of the inline frame (the user can drag it taller)

    def save(self, path: str | Path) -> Path:
        """Write the page to ``path`` (``.html``) atomically; returns the path."""
        return write_page(path, self.html)

    def _repr_html_(self) -> str:
        return (
            f'<iframe srcdoc="{html.escape(self.html, quote=True)}" sandbox="allow-scripts" '
            f'title="{html.escape(self.title, quote=True)}" '
            f'style="width:100%;height:{self.height}px;border:1px solid #ddd;resize:vertical"></iframe>'
        )

    def __repr__(self) -> str:
        return f"<attnviz view {self.title!r}: {len(self.html):,} characters of HTML; .save(path) writes it>"


def _view_height(capture: AttentionCapture) -> int:
    """Frame height that shows a head view of every token (about 22 px a token) within reason."""
    longest = max(len(capture.tokens), len(capture.target_tokens or ()))
    return int(min(900, max(480, 230 + 22 * longest)))


def head_view(capture: AttentionCapture | Any, tokens: Sequence[str] | None = None, **options: Any) -> HtmlView:
    """The attention page of ``capture`` opened on its head view; ``options`` as
    :func:`attnviz.render.html_view.attention_view_payload` (``title``, ``words``, ``layers``, ``stacks``).

    As in bertviz, ``head_view(outputs.attentions, tokens)`` also works: attentions in any form
    :meth:`AttentionCapture.from_attentions` takes, with their tokens."""
    capture = _as_capture(capture, tokens, "head_view")
    return HtmlView(attention_view_html(capture, **options), title="attention: head view", height=_view_height(capture))


def model_view(capture: AttentionCapture | Any, tokens: Sequence[str] | None = None, **options: Any) -> HtmlView:
    """The attention page of ``capture`` opened on its model view (every layer × head); options as :func:`head_view`
    (which also says how attentions and tokens are taken, as in bertviz)."""
    capture = _as_capture(capture, tokens, "model_view")
    page = attention_view_html(capture, **options)
    page = page.replace("</body>", _token_line(capture) + _MODEL_VIEW_START + "</body>", 1)
    layers = max(capture.num_layers(stack) for stack in capture.stacks)
    height = int(min(900, max(_view_height(capture), 200 + 78 * layers)))  # a row of thumbnails per layer
    return HtmlView(page, title="attention: model view", height=height)


def _as_capture(value: Any, tokens: Sequence[str] | None, view: str) -> AttentionCapture:
    """A capture, or attentions and their tokens made into one (bertviz's ``view(attention, tokens)``)."""
    if isinstance(value, AttentionCapture):
        if tokens is not None:
            raise TypeError(f"{view}(capture) takes the tokens from the capture: give no tokens with it")
        return value
    if tokens is None:
        raise TypeError(
            f"{view} takes a capture (attnviz.capture(model, text)) or, as bertviz, attentions with their tokens: "
            f"attnviz.{view}(outputs.attentions, tokenizer.convert_ids_to_tokens(inputs['input_ids'][0])); "
            f"got a {type(value).__name__} without tokens"
        )
    return AttentionCapture.from_attentions(value, tokens)


def _token_line(capture: AttentionCapture) -> str:
    """The text under the model view, whose thumbnails and heatmap show no words of their own."""
    from attnviz.common.tokens import display_token

    line = "tokens: " + " ".join(display_token(token) for token in capture.tokens)
    if capture.target_tokens is not None:
        line += " · target tokens: " + " ".join(display_token(token) for token in capture.target_tokens)
    return f'<p class="hint" id="view-tokens" style="margin:8px 16px">{html.escape(line)}</p>\n'


# -- tables and grids ------------------------------------------------------------------------------------


def document(title: str, sections: Sequence[str]) -> str:
    """A self-contained page of HTML ``sections`` (no script), under the policy of attnviz's pages."""
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{_POLICY}">\n'
        f"<title>{html.escape(title)}</title>\n<style>{_STYLE}</style>\n</head>\n<body>\n"
        f"<h1>{html.escape(title)}</h1>\n" + "\n".join(sections) + "\n</body>\n</html>\n"
    )


def rich_html(*renderables: Any, width: int = 140) -> str:
    """Rich tables / texts as HTML with inline styles (what the command line prints, in colour)."""
    from rich.console import Console

    # force_jupyter=False: inside a notebook rich would display the table itself instead of recording it
    console = Console(
        file=io.StringIO(), record=True, width=width, color_system="truecolor", force_terminal=True, force_jupyter=False
    )
    for renderable in renderables:
        console.print(renderable)
    return console.export_html(inline_styles=True, code_format="<pre>{code}</pre>")


def figure_html(figure: Any, alt: str) -> str:
    """A matplotlib figure as an inline PNG ``<img>`` (the page's policy allows ``data:`` images only)."""
    from attnviz.render.figures import figure_png

    encoded = base64.b64encode(figure_png(figure)).decode("ascii")
    return f'<img alt="{html.escape(alt, quote=True)}" src="data:image/png;base64,{encoded}">'


def paragraph(text: str) -> str:
    return f"<p>{html.escape(text)}</p>"


def heading(text: str) -> str:
    return f"<h2>{html.escape(text)}</h2>"


def _table_view(title: str, sections: list[str], *, height: int) -> HtmlView:
    return HtmlView(document(title, sections), title=title, height=height)


def statistics_view(stats: Any, detection: Any = None) -> HtmlView:
    """Per-head statistics: the layer × head grids of every statistic (flags marked) and the flagged heads."""
    from attnviz.render.stats_plots import head_statistics_figure
    from attnviz.stats.detect import detect_heads
    from attnviz.stats.tables import head_rows, head_table, layer_summary

    detection = detection or detect_heads(stats)
    sections = [paragraph(f"{plural(stats.num_examples, 'example')}, {plural(stats.num_tokens, 'token')}")]
    for stack in stats.stacks:
        sections.append(heading(f"{stack} attention"))
        sections.append(paragraph(" · ".join(layer_summary(stats, detection, stack=stack))))
        figure = head_statistics_figure(stats, detection, stack=stack)
        sections.append(figure_html(figure, f"{stack} attention: statistics per layer and head"))
        rows = head_rows(stats, detection, stack=stack, flagged_only=True)
        if rows:
            sections.append(rich_html(head_table(stats, rows, stack=stack)))
    return _table_view(f"{stats.model}: head statistics", sections, height=900)


def detection_view(detection: Any) -> HtmlView:
    """Flags of every head as a layer × head grid (one letter per flag) per stack."""
    from rich.table import Table

    from attnviz.stats.detect import FLAGS

    letters = {flag: flag[0].upper() if flag != "first-token-sink" else "S" for flag in FLAGS}
    letters["special-token"] = "T"
    sections = [paragraph("  ".join(f"{letter} = {flag}" for flag, letter in letters.items()))]
    for stack in dict.fromkeys(site.stack for site in detection.flags):
        sites = sorted(site for site in detection.flags if site.stack == stack)
        width = max(len(detection.flags[site]) for site in sites)
        table = Table(title=f"{stack} attention: flags per head", title_justify="left", header_style="bold")
        table.add_column("layer", justify="right")
        for head in range(width):
            table.add_column(str(head), justify="center")
        for site in sites:
            cells = ["".join(letters[f] for f in flags) or "·" for flags in detection.flags[site]]
            table.add_row(str(site.layer), *cells)
        sections.append(rich_html(table))
    return _table_view("head flags", sections, height=500)


def functions_view(result: Any) -> HtmlView:
    """Head functions: the probe-score grids (labelled heads marked) and the labelled heads, best first."""
    from attnviz.heads.tables import head_rows, head_table, label_grid, summary_line
    from attnviz.render.heads_plots import probe_scores_figure

    sections = []
    for stack in result.stacks:
        sections.append(heading(f"{stack} attention"))
        sections.append(paragraph(summary_line(result, stack=stack)))
        sections.append(figure_html(probe_scores_figure(result, stack=stack), f"{stack} attention: probe scores"))
        sections.append(rich_html(label_grid(result, stack=stack)))
        rows = head_rows(result, stack=stack, labelled_only=True)
        if rows:
            sections.append(rich_html(head_table(result, rows, stack=stack)))
    if result.similarity is not None:
        sections.append(similarity_section(result.similarity, result.model))
    return _table_view(f"{result.model}: head functions", sections, height=900)


def similarity_section(similarity: Any, model: str = "") -> str:
    from attnviz.render.heads_plots import head_similarity_figure

    return heading("head similarity") + figure_html(head_similarity_figure(similarity, model=model), "head similarity")


def similarity_view(similarity: Any) -> HtmlView:
    """Head similarity: the clustered divergence heatmap and its 2-D map."""
    return _table_view("head similarity", [similarity_section(similarity)], height=760)


def prune_view(outcome_or_report: Any) -> HtmlView:
    """A pruning run: quality, size and speed before and after, and every head's importance (removed ones marked)."""
    from attnviz.prune.export import importance_table, summary_lines, summary_table

    report = getattr(outcome_or_report, "report", outcome_or_report)
    sections = [rich_html(summary_table(report)), *(paragraph(line) for line in summary_lines(report))]
    sections.append(rich_html(importance_table(report)))
    return _table_view(f"{report.model}: pruning", sections, height=620)


def strips_view(rows: Any) -> HtmlView:
    """One query's attention: the strips figure, and each strip's strongest key."""
    from attnviz.render.query_strip import query_strip

    labels = rows.labels()
    strongest = [top[0] for top in rows.top_keys(1)]
    matrix = rows.matrix()  # [strip, key]
    lines = [
        f"{label}: {rows.key_tokens[key]!r} (key {key}) {float(matrix[strip, key]):.3f}"
        for strip, (label, key) in enumerate(zip(labels, strongest))
    ]
    header = f"query {rows.query} ({rows.query_token!r}) over {len(rows.key_tokens)} keys; strongest key per strip:"
    sections = [
        figure_html(query_strip(rows), "one query's attention over every key, a strip per head"),
        paragraph(header),
        *(paragraph(line) for line in lines),
    ]
    return _table_view(f"{rows.model}: query strips", sections, height=min(900, 320 + 60 * len(labels)))


def query_key_view(result: Any) -> HtmlView:
    """Why a head attends: one weight's query–key breakdown, or the joint map of a head's queries and keys."""
    from attnviz.heads.query_key import LogitBreakdown
    from attnviz.render.query_key import query_key_html

    breakdown = result if isinstance(result, LogitBreakdown) else None
    page = query_key_html(breakdown, None if breakdown is not None else result)
    return HtmlView(page, title="why a head attends", height=480 if breakdown is not None else 780)


def patch_view(result: Any) -> HtmlView:
    """A patching run: the grids of patching effects and direct logit attributions, and the top heads."""
    from attnviz.render.patch_page import patch_summary_html

    title = f"{result.model}: activation patching"
    return _table_view(title, [patch_summary_html(result, links=False)], height=min(1100, 420 + 14 * result.layers))


def circuit_view(result: Any) -> HtmlView:
    """A circuit: the graph with its slider for the edges kept, and the faithfulness curve."""
    from attnviz.render.circuit_page import circuit_view_html

    title = f"{result.model}: circuit"
    return _table_view(title, [circuit_view_html(result)], height=min(1200, 480 + 40 * result.layers))


def show(result: Any) -> HtmlView:
    """The inline view of any attnviz result: a capture (head and model view; an image's or a captioned image's
    own page; what a model wrote shows its capture), statistics, flags, head functions, head similarity, a pruning outcome or report, one query's
    strips, a head's query–key breakdown or map, a patching run, a circuit, or a view already made."""
    if isinstance(result, HtmlView):
        return result
    if type(result).__name__ == "Generation":  # what a model wrote: the view of its capture
        result = result.capture
    if isinstance(result, AttentionCapture):
        from attnviz.render.caption_overlay import is_caption_capture

        if is_caption_capture(result):  # a captioned image: click a word, see where it looked
            from attnviz.render.caption_view import caption_view_html

            return HtmlView(caption_view_html(result), title="attention: caption view", height=640)
        if result.image_grid is not None:  # an image: point at a patch, see where it looks
            from attnviz.render.image_view import image_view_html

            return HtmlView(image_view_html(result), title="attention: image view", height=640)
        return head_view(result)
    kind = type(result).__name__
    builders: dict[str, Callable[[Any], HtmlView]] = {
        "HeadStatistics": statistics_view,
        "Detection": detection_view,
        "HeadFunctions": functions_view,
        "HeadSimilarity": similarity_view,
        "PruneOutcome": prune_view,
        "PruneReport": prune_view,
        "QueryRows": strips_view,
        "LogitBreakdown": query_key_view,
        "QueryKeyMap": query_key_view,
        "PatchResult": patch_view,
        "CircuitResult": circuit_view,
    }
    if kind not in builders:
        raise InputError(f"attnviz has no inline view of a {kind}")
    return builders[kind](result)


def notebook_html(result: Any) -> str:
    """What a notebook shows for ``result`` (the ``_repr_html_`` of :mod:`attnviz.common.display`)."""
    return show(result)._repr_html_()


__all__ = ["HTML_SUFFIXES", "HtmlView", "head_view", "model_view", "notebook_html", "show"]
