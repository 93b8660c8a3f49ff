"""``attnviz patch`` from the command line: the JSON contract, the figure's numbers, the HTML page, bad input."""

from __future__ import annotations

import json

import pytest
from cli_helpers import assert_clean_error, run_cli
from figure_helpers import read_svg

CLEAN = "when mary and john went to the store, john gave a drink to"
CORRUPT = "when mary and john went to the store, mary gave a drink to"
PAIR = ["--clean", CLEAN, "--corrupt", CORRUPT, "--answer", " mary", "--wrong", " john"]
HEAD_KEYS = {"layer", "head", "patched_logit_diff", "normalized_effect", "direct_logit_attribution", "ablation_effect"}


def test_json_figure_and_terminal_agree(capsys, tmp_path, tiny_dirs):
    json_path, svg = tmp_path / "patch.json", tmp_path / "patch.svg"
    result = run_cli(
        capsys, "patch", tiny_dirs["gpt2"], *PAIR, "--ablate", "zero", "--json", json_path, "--out", svg, "--terminal"
    )
    assert result.exit_code == 0, result.stderr
    record = json.loads(json_path.read_text())
    assert set(record) == {"clean_logit_diff", "corrupt_logit_diff", "heads"}
    assert [(h["layer"], h["head"]) for h in record["heads"]] == [(l, h) for l in range(2) for h in range(4)]
    assert all(set(h) == HEAD_KEYS for h in record["heads"])
    clean, corrupt = record["clean_logit_diff"], record["corrupt_logit_diff"]
    for head in record["heads"]:
        assert head["normalized_effect"] == pytest.approx((head["patched_logit_diff"] - corrupt) / (clean - corrupt))

    # every panel annotates its top 5 heads (largest |value| first) with two decimals
    figure = read_svg(svg)
    expected = []
    for field in ("normalized_effect", "direct_logit_attribution", "ablation_effect"):
        top = sorted(record["heads"], key=lambda h: abs(h[field]), reverse=True)[:5]
        expected.extend(round(h[field], 2) for h in top)
    assert figure.annotations() == pytest.approx(expected, abs=0.0051)
    assert "patching: normalised effect" in figure.texts and "direct logit attribution" in figure.texts
    best = max(record["heads"], key=lambda h: abs(h["normalized_effect"]))
    label = f"L{best['layer']} H{best['head']}"
    assert any(label in text for text in figure.texts)  # the top heads are named under the figure
    shown = result.stdout + result.stderr  # the table goes to the console
    assert label in shown and f"{best['normalized_effect']:+.3f}" in shown  # and in the terminal


def test_html_page_links_top_heads_to_the_clean_prompts_head_view(capsys, tmp_path, tiny_dirs, open_page):
    page_path = tmp_path / "patch.html"
    result = run_cli(capsys, "patch", tiny_dirs["llama"], *PAIR, "--out", page_path, "--top", "3")
    assert result.exit_code == 0, result.stderr
    run = open_page(page_path)
    run.assert_clean()
    links = run.page.locator("a.patch-head")
    assert links.count() == 3
    layer, head = links.nth(0).get_attribute("data-layer"), links.nth(0).get_attribute("data-head")
    links.nth(0).click()
    chosen = run.page.locator("#layer-select option:checked").inner_text()
    assert chosen == f"layer {layer}"
    shown = run.page.locator(".head-toggle.on").all_inner_texts()
    assert shown == [f"H{head}"]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--answer", " marigold"], "--answer must be one token; ' marigold' is 2 tokens: 'mari' + '##gold'"),
        (["--corrupt", CORRUPT + " now"], "the clean prompt has 16 tokens and the corrupt prompt 17"),
        (["--positions", "middle"], "--positions must be all, last or a token position"),
        (["--positions", "²"], "--positions must be all, last or a token position (0, 1, …), not '²'"),
        (["--positions", "40"], "--positions 40 is outside the prompt's 16 tokens"),
        (["--ablate", "mean"], "mean ablation needs a corpus"),
        (["--data", "notes.txt"], "--data is the corpus of --ablate mean"),
        (["--direction", "sideways"], "direction"),
        (["--out", "patch.txt"], "unsupported output file type"),
    ],
)
def test_bad_input_is_one_error_line(capsys, tmp_path, monkeypatch, tiny_dirs, args, fragment):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("the cat sat.\n")
    values = dict(zip(PAIR[::2], PAIR[1::2]))
    values.update(dict(zip(args[::2], args[1::2])))
    result = run_cli(capsys, "patch", tiny_dirs["llama"], *[part for pair in values.items() for part in pair])
    assert_clean_error(result, fragment)
    assert len(result.error_lines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_an_encoder_decoder_is_patched_and_names_each_heads_stack(capsys, tiny_model_dirs, tmp_path):
    json_path = tmp_path / "bart.json"
    result = run_cli(capsys, "patch", tiny_model_dirs["bart"], *PAIR, "--json", json_path)
    assert result.exit_code == 0, result.stderr
    heads = json.loads(json_path.read_text())["heads"]
    assert {head["stack"] for head in heads} == {"encoder", "decoder", "cross"}
    assert len(heads) == 3 * 2 * 4  # three stacks of 2 layers × 4 heads


def test_models_attnviz_cannot_patch_are_refused_by_name(capsys, tiny_model_dirs, tiny_dirs):
    result = run_cli(capsys, "patch", tiny_dirs["bert"], *PAIR)
    assert_clean_error(result, "has no language-model head")
    result = run_cli(capsys, "patch", tiny_dirs["llama"], "--clean", CLEAN)
    assert_clean_error(result, "give --corrupt")


def test_the_result_displays_inline_in_a_notebook(tiny_models):
    from attnviz.patching import patch_heads

    result = patch_heads(tiny_models["llama"], clean=CLEAN, corrupt=CORRUPT, answer=" mary", wrong=" john")
    shown = result._repr_html_()
    assert shown.startswith("<iframe") and 'sandbox="allow-scripts"' in shown
    best = result.top_heads(1)[0]
    assert "top-heads" in shown and best.label in shown and f"{best.normalized_effect:+.3f}" in shown
    assert "data:image/png;base64," in shown
