"""The circuit of a :class:`~attnviz.circuit.CircuitResult` as a layered drawing, beside its faithfulness curve.

Layers run bottom to top (the embeddings below layer 0, the logits above the last layer); each layer's heads
sit in a row with its MLP at the right end. An edge runs from its sender to its receiver, red where it helps
the answer (a positive score) and blue where it works against it, as wide as its share of the largest |score|;
an edge into a head ends at the left, middle or right of the head's box for its query, key or value input, and
is drawn solid, dashed or dotted in that order.
"""

from __future__ import annotations

from typing import Any

from attnviz.common.wording import plural
from attnviz.render.figures import subplots, titled

#: edges drawn at most (the circuit may be larger: the strongest are drawn)
MAX_DRAWN = 150
#: where an edge into a head ends (x offset from its centre, in head widths) and its line style, per input
INPUT_PORTS = {"q": (-0.28, "solid"), "k": (0.0, "dashed"), "v": (0.28, "dotted"), None: (0.0, "solid")}
POSITIVE, NEGATIVE = "#c0392b", "#2e6fb5"


def node_positions(result) -> dict[tuple[str, int | None, int | None], tuple[float, float]]:
    """``(kind, layer, head)`` -> ``(x, y)``: heads at ``(head, layer)``, each MLP one step right of its layer's
    last head, the embeddings and logits centred below and above."""
    heads: dict[int, int] = {}
    for node in result.nodes:
        if node.kind == "head" and node.layer is not None and node.head is not None:
            heads[node.layer] = max(heads.get(node.layer, 0), node.head + 1)
    width = max(heads.values(), default=1)
    positions: dict[tuple[str, int | None, int | None], tuple[float, float]] = {}
    for node in result.nodes:
        if node.kind == "head":
            positions[("head", node.layer, node.head)] = (float(node.head or 0), float(node.layer or 0))
        elif node.kind == "mlp":
            positions[("mlp", node.layer, None)] = (float(width) + 0.4, float(node.layer or 0))
    centre = (width - 1) / 2
    positions[("embed", None, None)] = (centre, -1.2)
    positions[("logits", None, None)] = (centre, result.layers + 0.2)
    return positions


def draw_circuit(ax: Any, result, count: int) -> None:
    """The top ``count`` edges (at most :data:`MAX_DRAWN`) of ``result`` on ``ax``, over every node."""
    positions = node_positions(result)
    edges = result.edges[: min(count, MAX_DRAWN)]
    largest = max((abs(edge.score) for edge in edges), default=1.0) or 1.0
    used = {edge.sender for edge in edges} | {edge.receiver[:3] for edge in edges}
    for key, (x, y) in positions.items():
        kind = key[0]
        active = key in used
        if kind == "head":
            ax.add_patch(_box(x, y, 0.8, 0.5, "#fdebd0" if active else "#f2f2f2", active))
        else:
            ax.add_patch(_box(x, y, 1.1 if kind != "mlp" else 0.7, 0.5, "#d5f5e3" if active else "#f2f2f2", active))
            label = "MLP" if kind == "mlp" else kind
            ax.text(x, y, label, ha="center", va="center", fontsize=6, color="#333")
    for edge in reversed(edges):  # the strongest last, on top
        x0, y0 = positions[edge.sender]
        x1, y1 = positions[edge.receiver[:3]]
        offset, style = INPUT_PORTS.get(edge.receiver[3], (0.0, "solid"))
        colour = POSITIVE if edge.score >= 0 else NEGATIVE
        ax.annotate(
            "",
            xy=(x1 + offset * 0.8, y1 - 0.25),
            xytext=(x0, y0 + 0.25),
            arrowprops={
                "arrowstyle": "-|>",
                "color": colour,
                "linewidth": 0.4 + 3.2 * abs(edge.score) / largest,
                "linestyle": style,
                "alpha": 0.75,
                "shrinkA": 0,
                "shrinkB": 0,
                "connectionstyle": "arc3,rad=0.08",
            },
        )
    for key, (x, y) in positions.items():
        if key[0] == "head" and key in used:
            ax.text(x, y, f"{key[2]}", ha="center", va="center", fontsize=5.5, color="#222")
    xs = [x for x, _ in positions.values()]
    ax.set_xlim(min(xs) - 1, max(xs) + 1)
    ax.set_ylim(-1.9, result.layers + 0.9)
    ax.set_yticks(range(result.layers))
    ax.set_ylabel("layer", fontsize=8)
    ax.set_xticks([])
    ax.tick_params(labelsize=7)
    for side in ("top", "right", "bottom"):
        ax.spines[side].set_visible(False)


def draw_curve(ax: Any, result) -> None:
    """Faithfulness against edges (nodes) kept, on a log scale, with the target and the circuit marked."""
    counts = [max(count, 0.5) for count, _ in result.faithfulness_curve]
    values = [value for _, value in result.faithfulness_curve]
    ax.plot(counts, values, marker="o", markersize=3, color="#333", linewidth=1.2)
    ax.axhline(result.target, color="#999", linewidth=0.8, linestyle="--")
    ax.plot([max(result.circuit_edges, 0.5)], [result.circuit_faithfulness], marker="*", color=POSITIVE, markersize=10)
    ax.set_xscale("log")
    ax.set_xlabel(f"{result.kept} kept (0 drawn at 0.5)", fontsize=8)
    ax.set_ylabel("faithfulness", fontsize=8)
    ax.set_title("faithfulness curve", fontsize=9)
    ax.tick_params(labelsize=7)


def circuit_figure(result, *, count: int | None = None):
    """The circuit (``count`` top edges; default: the smallest circuit reaching the target) beside its curve."""
    shown = result.circuit_edges if count is None else count
    width = max(6.0, 1.2 + 0.5 * max((n.head or 0 for n in result.nodes), default=1))
    height = max(4.0, 1.6 + 0.38 * result.layers)
    if not result.edges:  # atp: no edges, only the curve and the node scores
        fig, axes = subplots(1, 1, figsize=(6.0, 3.6), squeeze=False)
        draw_curve(axes[0][0], result)
    else:
        fig, axes = subplots(1, 2, figsize=(width + 4.2, height), squeeze=False)
        draw_circuit(axes[0][0], result, shown)
        axes[0][0].set_title(
            f"{min(shown, MAX_DRAWN)} of {len(result.edges)} edges · red helps the answer, blue works against it · "
            "q solid, k dashed, v dotted",
            fontsize=8,
        )
        draw_curve(axes[0][1], result)
    return titled(
        fig,
        f"{result.model} · {result.answer!r} over {result.wrong!r} · circuit of {plural(result.circuit_edges, result.kept[:-1])}: "
        f"faithfulness {result.circuit_faithfulness:.2f}",
        fontsize=10,
        top=0.95,
    )


def _box(x: float, y: float, width: float, height: float, colour: str, active: bool):
    from matplotlib.patches import FancyBboxPatch

    return FancyBboxPatch(
        (x - width / 2, y - height / 2),
        width,
        height,
        boxstyle="round,pad=0.02",
        facecolor=colour,
        edgecolor="#555" if active else "#ccc",
        linewidth=0.6,
    )


def top_table(result, *, top: int = 10) -> Any:
    """The top nodes and edges as a rich table (the terminal view)."""
    from rich.table import Table

    table = Table(
        title=f"{result.model}: the circuit that makes {result.answer!r} over {result.wrong!r}",
        title_justify="left",
        header_style="bold",
        caption=(
            f"logit difference: clean {result.clean_logit_diff:.3f}, corrupt {result.corrupt_logit_diff:.3f} · "
            f"{result.summary_line()}{verification_words(result)}"
        ),
        caption_justify="left",
    )
    table.add_column("#", justify="right")
    table.add_column("edge" if result.edges else "node")
    table.add_column("score", justify="right")
    items = result.edges[:top] if result.edges else result.top_nodes(top)
    for rank, item in enumerate(items, start=1):
        score = item.score if result.edges else item.attribution
        table.add_row(str(rank), item.label, f"{score:+.4f}")
    return table


def verification_words(result) -> str:
    """`` · path patching of the top K: Pearson r, same sign in S%`` when scores were verified, else nothing."""
    verification = result.verification()
    if verification is None:
        return ""
    pearson = verification["pearson"]
    correlation = "n/a" if pearson is None else f"{pearson:.2f}"
    return (
        f" · exact path patching of the top {len(verification['items'])}: Pearson {correlation} with the scores, "
        f"same sign in {verification['sign_agreement']:.0%}"
    )
