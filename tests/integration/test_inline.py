"""Inline display: views with ``.html``/``.save``/``_repr_html_``, every result shown in a frame in Chromium,
and figures that leave matplotlib's backend and rcParams alone."""

from __future__ import annotations

import html
import re

import matplotlib
import pytest
import torch
from inline_helpers import text_in_frame
from tiny_models import TEXTS

import attnviz
from attnviz.common.errors import OutputError
from attnviz.heads import ProbeSettings


@pytest.fixture(scope="module")
def bert(tiny_model_dirs):
    return attnviz.load_model(str(tiny_model_dirs["bert"]), device="cpu")


@pytest.fixture(scope="module")
def results(bert):
    """Every kind of result a notebook displays, from one tiny BERT."""
    capture = attnviz.capture(bert, TEXTS[0])
    stats = attnviz.compute_statistics(bert, TEXTS, progress=False)
    probe = ProbeSettings(length=6, sequences=2)
    functions = attnviz.head_functions(bert, probe=probe, similarity=True)
    return {
        "capture": capture,
        "head view": attnviz.head_view(capture),
        "model view": attnviz.model_view(capture),
        "statistics": stats,
        "detection": attnviz.detect_heads(stats),
        "head functions": functions,
        "head similarity": functions.similarity,
        "atlas": attnviz.head_atlas(bert, TEXTS[:3], examples=1),
        "query strips": attnviz.query_rows(bert, TEXTS[0], "last", layers=[0]),
    }


def srcdoc(fragment: str) -> str:
    """The page inside an ``<iframe srcdoc=…>`` fragment."""
    match = re.fullmatch(r'<iframe srcdoc="([^"]*)" sandbox="allow-scripts" .*></iframe>', fragment, re.DOTALL)
    assert match, fragment[:200]
    return html.unescape(match.group(1))


def test_every_result_is_a_sandboxed_frame_around_its_self_contained_page(results):
    for name, result in results.items():
        fragment = result._repr_html_()
        page = srcdoc(fragment)
        assert page == attnviz.show(result).html, name
        assert "default-src 'none'" in page, name  # the page's Content-Security-Policy stays
        assert not re.search(r"""(src|href)=["']?(https?:)?//""", page), name  # nothing fetched
        assert "require(" not in page and "requirejs" not in page.lower(), name


def test_views_save_atomically_and_refuse_other_suffixes(results, tmp_path):
    view = results["head view"]
    path = view.save(tmp_path / "view.html")
    assert path.read_text(encoding="utf-8") == view.html
    with pytest.raises(OutputError):
        view.save(tmp_path / "view.png")
    assert "characters of HTML" in repr(view)
    capture = results["capture"]
    assert repr(capture).startswith("AttentionCapture(model=") and "tensor" not in repr(capture)


def test_model_view_opens_on_its_tab_and_head_view_on_its_own(results, tmp_path, open_page):
    for name, expected in (("head view", "tab-head"), ("model view", "tab-model")):
        path = tmp_path / f"{name.replace(' ', '-')}.html"
        results[name].save(path)
        run = open_page(path)
        assert run.page.locator(f"#{expected}.active").count() == 1, name
        run.assert_clean()


def test_inline_frames_render_their_content_in_chromium(results, tmp_path, open_page):
    """What a notebook shows: each output's fragment in a page; inside its frame, its tokens or tables."""
    expected = {
        "capture": "sat",
        "head view": "sat",
        "model view": "sat",
        "statistics": "head statistics",
        "detection": "head flags",
        "head functions": "head functions",
        "head similarity": "head similarity",
        "atlas": "atlas",
        "query strips": "query strips",
    }
    for name, result in results.items():
        text = text_in_frame(open_page, tmp_path / f"{name.replace(' ', '-')}-output.html", result._repr_html_())
        assert expected[name].lower() in text.lower(), (name, text[:300])


def test_prune_outcome_displays_its_tables(tiny_dirs):
    loaded = attnviz.load_model(str(tiny_dirs["bert"]), device="cpu")
    outcome = attnviz.prune_model(
        loaded, attnviz.PruneConfig(count=2, latency_repeats=1, latency_tokens=16), texts=TEXTS
    )
    page = attnviz.show(outcome).html
    assert "head importance" in page and "parameters" in page
    assert srcdoc(outcome.report._repr_html_()) == page


def _matplotlib_state():
    # the backend without resolving it (reading rcParams["backend"] would pick one)
    params = {key: value for key, value in matplotlib.rcParams.items() if key != "backend"}
    return matplotlib.rcParams._get_backend_or_none(), params


def test_figures_leave_backend_and_rcparams_alone(results, bert):
    from matplotlib.figure import Figure

    from attnviz.heads.propagation import rollout
    from attnviz.render.align_plot import alignment_grid_figure
    from attnviz.render.heads_plots import capture_rollout_figure, head_similarity_figure, probe_scores_figure
    from attnviz.render.stats_plots import head_statistics_evolution_figure, head_statistics_figure

    capture, stats = results["capture"], results["statistics"]
    plots = {
        "heatmap": lambda: attnviz.heatmap(capture),
        "statistics": lambda: head_statistics_figure(stats, results["detection"]),
        "evolution": lambda: head_statistics_evolution_figure([stats, stats]),
        "probe scores": lambda: probe_scores_figure(results["head functions"]),
        "similarity": lambda: head_similarity_figure(results["head similarity"]),
        "rollout": lambda: capture_rollout_figure(capture),
        "alignment": lambda: alignment_grid_figure(torch.rand(2, 5), title="AER"),
    }
    assert rollout(capture).shape[0] == len(capture.tokens)
    before = _matplotlib_state()
    for name, plot in plots.items():
        figure = plot()
        assert isinstance(figure, Figure), name
        assert _matplotlib_state() == before, name
        assert figure.canvas.manager is None, name  # not registered with pyplot: a notebook shows it once
    import sys

    assert "matplotlib.pyplot" not in sys.modules or before[0] is not None


def test_query_strips_name_each_strips_strongest_key(results):
    """The strips' inline view lists, per strip, the key of largest weight of the recorded row (a hand argmax)."""
    rows = results["query strips"]
    page = srcdoc(rows._repr_html_())
    matrix = rows.matrix()  # [strip, key]
    assert matrix.shape[0] == len(rows.labels()) > 1
    for strip, label in enumerate(rows.labels()):
        key = int(matrix[strip].argmax())
        line = f"{label}: {rows.key_tokens[key]!r} (key {key}) {float(matrix[strip, key]):.3f}"
        assert html.escape(line) in page, line
    assert "data:image/png;base64," in page
