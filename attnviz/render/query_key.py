"""Views of a head's queries and keys (:mod:`attnviz.heads.query_key`): terminal table, figure, offline page.

* :func:`breakdown_table` — the neuron view of one weight in the terminal: the dimensions that add most to
  the logit, and for rotary models the logit split by frequency band.
* :func:`query_key_figure` — the breakdown (bars per dimension, or per rotary band) beside the joint 2-D map,
  drawn twice: coloured by position and by token. Queries are circles, keys triangles; the strongest
  query → key weights are lines.
* :func:`query_key_html` — the same as one self-contained page (inline SVG, a few lines of script to switch
  the colouring; nothing fetched), which a notebook shows inline.
"""

from __future__ import annotations

import html
import json
from collections import Counter

from rich.table import Table

from attnviz.common.tokens import display_token
from attnviz.heads.query_key import LogitBreakdown, QueryKeyMap
from attnviz.render.figures import colormap, new_figure

#: dimensions listed in the terminal table and drawn as bars (largest |contribution| first)
TOP_DIMENSIONS = 12
#: tokens given a colour of their own when the map is coloured by token (the most frequent ones)
TOKEN_COLOURS = 10
_POLICY = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:"


def _pair_label(breakdown: LogitBreakdown) -> str:
    tokens = breakdown.tokens
    return (
        f"query {breakdown.query_position} {display_token(tokens[breakdown.query_position])!r} → "
        f"key {breakdown.key_position} {display_token(tokens[breakdown.key_position])!r}"
    )


def breakdown_lines(breakdown: LogitBreakdown) -> list[str]:
    """What the breakdown says, in a few lines of text."""
    lines = [
        f"{breakdown.model} · layer {breakdown.layer} head {breakdown.head} · {_pair_label(breakdown)}",
        (
            f"logit = {breakdown.scaling:.4g} × Σ_d q_d·k_d = {breakdown.scaling:.4g} × "
            f"{float(breakdown.products.sum()):.4f} = {breakdown.logit:.4f} → weight {breakdown.weight:.4f} "
            f"(the query's logits range {float(breakdown.logits.min()):.3f} … {float(breakdown.logits.max()):.3f})"
        ),
    ]
    if breakdown.bands:
        moving = max(breakdown.bands, key=lambda band: band.spread)
        lines.append(
            f"rotary bands: the band of wavelengths {moving.wavelength[0]:.0f}–{moving.wavelength[1]:.0f} tokens moves "
            f"the logits most from key to key (spread {moving.spread:.3f}): "
            + ("fast bands make this head positional" if moving.wavelength[1] < 64 else "slow bands: mostly content")
        )
    return lines


def breakdown_table(breakdown: LogitBreakdown) -> Table:
    """The largest contributions to the logit: per dimension, and per rotary band where there are bands."""
    table = Table(
        title=breakdown_lines(breakdown)[0],
        caption="\n".join(breakdown_lines(breakdown)[1:]),
        title_justify="left",
        caption_justify="left",
        header_style="bold",
        box=None,
    )
    for name in ("dim", "q_d", "k_d", "q_d·k_d", "× scale"):
        table.add_column(name, justify="right")
    products = breakdown.products
    for d in products.abs().argsort(descending=True)[:TOP_DIMENSIONS].tolist():
        table.add_row(
            str(d),
            f"{float(breakdown.query[d]):+.3f}",
            f"{float(breakdown.key[d]):+.3f}",
            f"{float(products[d]):+.4f}",
            f"{float(products[d]) * breakdown.scaling:+.4f}",
        )
    if breakdown.bands:
        table.add_row("", "", "", "", "")
        table.add_row("band", "pairs", "wavelength", "logit part", "spread over keys", style="bold")
        for band in breakdown.bands:
            table.add_row(
                "",
                f"{band.pairs[0]}–{band.pairs[1]}",
                f"{band.wavelength[0]:.0f}–{band.wavelength[1]:.0f}",
                f"{band.logit:+.4f}",
                f"{band.spread:.4f}",
            )
    return table


def _token_colours(mapping: QueryKeyMap) -> dict[str, str]:
    """The most frequent tokens' colours (tab10); the rest are grey."""
    frequent = [token for token, _ in Counter(mapping.tokens).most_common(TOKEN_COLOURS)]
    palette = colormap("tab10")
    return {token: _hex(palette(index % 10)) for index, token in enumerate(frequent)}


def _hex(rgba) -> str:
    return "#" + "".join(f"{round(channel * 255):02x}" for channel in rgba[:3])


def _position_colours(mapping: QueryKeyMap) -> list[str]:
    top = max(mapping.positions, default=1) or 1
    ramp = colormap("viridis")
    return [_hex(ramp(position / top)) for position in mapping.positions]


def _axis_labels(mapping: QueryKeyMap) -> tuple[str, str]:
    if mapping.explained is None:
        return f"{mapping.projection} 1", f"{mapping.projection} 2"
    return (f"PC 1 ({mapping.explained[0]:.0%} of the variance)", f"PC 2 ({mapping.explained[1]:.0%})")


def _draw_map(axes, mapping: QueryKeyMap, colours: list[str], title: str, *, shape_legend: bool = True) -> None:
    xy = mapping.coordinates
    for query, key, weight in mapping.links:
        axes.plot(
            [float(xy[query, 0]), float(xy[key, 0])],
            [float(xy[query, 1]), float(xy[key, 1])],
            color="#888888",
            linewidth=0.4 + 1.2 * weight,
            alpha=0.35,
            zorder=1,
        )
    for kind, marker in (("query", "o"), ("key", "^")):
        index = [n for n, k in enumerate(mapping.kinds) if k == kind]
        axes.scatter(
            xy[index, 0].numpy(),
            xy[index, 1].numpy(),
            c=[colours[n] for n in index],
            marker=marker,
            s=22,
            linewidths=0.3,
            edgecolors="white",
            label=("queries" if kind == "query" else "keys") if shape_legend else None,
            zorder=2,
        )
    x_label, y_label = _axis_labels(mapping)
    axes.set(title=title, xlabel=x_label, ylabel=y_label)
    if shape_legend:
        axes.legend(loc="best", fontsize=8)


def query_key_figure(breakdown: LogitBreakdown | None, mapping: QueryKeyMap | None):
    """The breakdown (if given) and the map (if given, coloured by position and by token) side by side."""
    panels = (breakdown is not None) + 2 * (mapping is not None)
    figure = new_figure(figsize=(5.2 * panels, 4.6), layout="constrained")
    axes = list(figure.subplots(1, panels, squeeze=False)[0])
    if breakdown is not None:
        _draw_breakdown(axes.pop(0), breakdown)
    if mapping is not None:
        _draw_map(axes[0], mapping, _position_colours(mapping), "coloured by position (dark: early)")
        token_colours = _token_colours(mapping)
        colours = [token_colours.get(t, "#c8c8c8") for t in mapping.tokens]
        _draw_map(axes[1], mapping, colours, "coloured by token (grey: the rest)", shape_legend=False)
        for token, colour in list(token_colours.items())[:TOKEN_COLOURS]:
            axes[1].scatter([], [], c=colour, s=22, label=display_token(token))
        axes[1].legend(loc="best", fontsize=7, ncols=2)
        figure.suptitle(
            f"{mapping.model} · layer {mapping.layer} head {mapping.head} · queries and keys "
            f"({len(mapping.kinds) // 2} tokens, {mapping.projection.upper()}); lines: strongest weights"
        )
    return figure


def _draw_breakdown(axes, breakdown: LogitBreakdown) -> None:
    if breakdown.bands:
        labels = [f"{b.wavelength[0]:.0f}–{b.wavelength[1]:.0f}" for b in breakdown.bands]
        positions = range(len(labels))
        axes.bar([p - 0.2 for p in positions], [b.logit for b in breakdown.bands], 0.4, label="part of this logit")
        axes.bar([p + 0.2 for p in positions], [b.spread for b in breakdown.bands], 0.4, label="spread over keys")
        axes.set_xticks(list(positions), labels, rotation=45, fontsize=8)
        axes.set_xlabel("rotary band: wavelength (tokens)")
        axes.legend(fontsize=8)
    else:
        products = breakdown.products * breakdown.scaling
        chosen = products.abs().argsort(descending=True)[:TOP_DIMENSIONS].tolist()
        axes.bar(range(len(chosen)), [float(products[d]) for d in chosen], color="#3b528b")
        axes.set_xticks(range(len(chosen)), [str(d) for d in chosen], fontsize=8)
        axes.set_xlabel("dimension d (largest |q_d·k_d| first)")
    axes.axhline(0, color="#444444", linewidth=0.6)
    axes.set_ylabel("contribution to the logit")
    axes.set_title(f"{_pair_label(breakdown)}\nlogit {breakdown.logit:.3f} → weight {breakdown.weight:.3f}", fontsize=9)


def query_key_html(breakdown: LogitBreakdown | None, mapping: QueryKeyMap | None) -> str:
    """One self-contained page: the breakdown's table and the map as SVG (colouring switchable)."""
    sections = []
    if breakdown is not None:
        sections.append(_breakdown_section(breakdown))
    if mapping is not None:
        sections.append(_map_section(mapping))
    title = "attnviz · why a head attends"
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{_POLICY}">\n<title>{title}</title>\n'
        "<style>body{font-family:system-ui,sans-serif;margin:16px;color:#222}table{border-collapse:collapse;"
        "font-size:13px}td,th{padding:2px 8px;text-align:right}th{border-bottom:1px solid #ccc}p{font-size:13px}"
        "svg text{font-size:11px}</style>\n</head>\n<body>\n<h1 style='font-size:18px'>"
        + title
        + "</h1>\n"
        + "\n".join(sections)
        + "\n</body>\n</html>\n"
    )


def _breakdown_section(breakdown: LogitBreakdown) -> str:
    lines = "".join(f"<p>{html.escape(line)}</p>" for line in breakdown_lines(breakdown))
    products = breakdown.products
    rows = "".join(
        f"<tr><td>{d}</td><td>{float(breakdown.query[d]):+.3f}</td><td>{float(breakdown.key[d]):+.3f}</td>"
        f"<td>{float(products[d]):+.4f}</td><td>{float(products[d]) * breakdown.scaling:+.4f}</td></tr>"
        for d in products.abs().argsort(descending=True)[:TOP_DIMENSIONS].tolist()
    )
    table = (
        "<table id='dimensions'><tr><th>dim</th><th>q_d</th><th>k_d</th><th>q_d·k_d</th><th>× scale</th></tr>"
        + rows
        + "</table>"
    )
    bands = ""
    if breakdown.bands:
        band_rows = "".join(
            f"<tr><td>{b.pairs[0]}–{b.pairs[1]}</td><td>{b.wavelength[0]:.0f}–{b.wavelength[1]:.0f}</td>"
            f"<td>{b.logit:+.4f}</td><td>{b.spread:.4f}</td></tr>"
            for b in breakdown.bands
        )
        bands = (
            "<h3 style='font-size:14px'>by rotary frequency band</h3><table id='bands'><tr><th>pairs</th>"
            "<th>wavelength (tokens)</th><th>part of this logit</th><th>spread over keys</th></tr>"
            + band_rows
            + "</table>"
        )
    return f"<section id='breakdown'><h2 style='font-size:16px'>one weight</h2>{lines}{table}{bands}</section>"


def _map_section(mapping: QueryKeyMap, size: int = 560) -> str:
    xy = mapping.coordinates
    low, high = xy.min(0).values, xy.max(0).values
    span = (high - low).clamp(min=1e-9)

    def place(n: int) -> tuple[float, float]:
        x = 20 + (size - 40) * float((xy[n, 0] - low[0]) / span[0])
        y = size - 20 - (size - 40) * float((xy[n, 1] - low[1]) / span[1])
        return round(x, 1), round(y, 1)

    by_position, token_colours = _position_colours(mapping), _token_colours(mapping)
    shapes = []
    for query, key, weight in mapping.links:
        (x1, y1), (x2, y2) = place(query), place(key)
        shapes.append(
            f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="#888" stroke-opacity="0.4" '
            f'stroke-width="{0.5 + 1.5 * weight:.2f}"/>'
        )
    for n, kind in enumerate(mapping.kinds):
        x, y = place(n)
        label = html.escape(
            f"{kind} · {display_token(mapping.tokens[n])!r} · position {mapping.positions[n]} · "
            f"text {mapping.examples[n] + 1}"
        )
        colours = f'data-position="{by_position[n]}" data-token="{token_colours.get(mapping.tokens[n], "#c8c8c8")}"'
        if kind == "query":
            shape = f'<circle class="point" cx="{x}" cy="{y}" r="4" fill="{by_position[n]}" {colours}>'
            shapes.append(shape + f"<title>{label}</title></circle>")
        else:
            corners = f"{x},{y - 5} {x - 4.5},{y + 3.5} {x + 4.5},{y + 3.5}"
            shapes.append(
                f'<polygon class="point" points="{corners}" fill="{by_position[n]}" {colours}><title>{label}</title></polygon>'
            )
    legend = " ".join(
        f"<span style='color:{colour}'>■</span> {html.escape(display_token(token))}"
        for token, colour in token_colours.items()
    )
    x_label, y_label = _axis_labels(mapping)
    switch = (
        "<script>function recolour(by){document.querySelectorAll('.point').forEach(function(p){"
        "p.setAttribute('fill',p.getAttribute('data-'+by));});"
        "document.getElementById('token-legend').style.display=by==='token'?'':'none';}</script>"
    )
    summary = json.dumps({"points": len(mapping.kinds), "links": len(mapping.links)})
    return (
        f"<section id='map' data-summary='{html.escape(summary)}'><h2 style='font-size:16px'>queries and keys of layer "
        f"{mapping.layer} head {mapping.head} ({len(mapping.kinds) // 2} tokens, {mapping.projection.upper()})</h2>"
        "<p>Circles are queries, triangles keys; a query lands near the keys it attends to (keys moved to the queries' "
        "centre and both scaled to the same mean norm, which changes no weight). Lines: the strongest weights. "
        "Hover a point for its token.</p>"
        "<p><label>colour by <select id='colour-by' onchange='recolour(this.value)'>"
        "<option value='position'>position (dark: early)</option><option value='token'>token</option>"
        f"</select></label> <span id='token-legend' style='display:none'>{legend}</span></p>"
        f'<svg width="{size}" height="{size}" viewBox="0 0 {size} {size}" role="img" '
        f'aria-label="{html.escape(x_label)} by {html.escape(y_label)}" style="border:1px solid #ddd">'
        + "".join(shapes)
        + f"</svg><p>x: {html.escape(x_label)} · y: {html.escape(y_label)}</p>{switch}</section>"
    )
