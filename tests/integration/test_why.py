"""Why a head attends and what it moves, through the command line: norm-based attention on MiniLM against
forward hooks, stats that say what they computed, and the query–key page in a browser."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from cli_helpers import assert_clean_error, run_cli
from tiny_models import TEXTS

from attnviz.common.texts import load_texts
from attnviz.stats.definitions import STATISTIC_NAMES

#: held-out sentences shipped with attnviz (never in the default corpus)
HELDOUT = Path(__file__).resolve().parents[2] / "attnviz" / "sample_data" / "heldout.txt"


def _minilm_norm_reference(minilm_dir, text: str) -> torch.Tensor:
    """``[layer, head, q, k]`` α·‖(x W_V + b_V) W_O^h‖ from eager weights and a hook on each value projection."""
    import transformers

    model = transformers.BertModel.from_pretrained(str(minilm_dir), attn_implementation="eager").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(minilm_dir))
    values: dict[int, torch.Tensor] = {}
    hooks = [
        layer.attention.self.value.register_forward_hook(lambda m, i, out, n=n: values.__setitem__(n, out))
        for n, layer in enumerate(model.encoder.layer)
    ]
    with torch.no_grad():
        attentions = model(**tokenizer(text, return_tensors="pt"), output_attentions=True).attentions
    for hook in hooks:
        hook.remove()
    maps = []
    for n, weights in enumerate(attentions):  # [1, h, q, k]
        heads, size = weights.shape[1], 384 // weights.shape[1]
        w_o = model.encoder.layer[n].attention.output.dense.weight.detach()  # [hidden, h·d]
        norms = torch.stack(
            [
                (values[n][0, :, h * size : (h + 1) * size] @ w_o[:, h * size : (h + 1) * size].T).norm(dim=-1)
                for h in range(heads)
            ]
        )  # [h, k]
        maps.append(weights[0] * norms[:, None, :])
    return torch.stack(maps)


def test_minilm_norm_capture_matches_hooks_and_the_sinks_fade(capsys, minilm_dir, tmp_path):
    """Held-out sentences: capture --weighting norm = the hook computation (≤ 1e-5 relative); the [CLS]+[SEP]
    share of each row, averaged over heads and queries, falls from the weights to the norms (Kobayashi et al.)."""
    from attnviz.captures.attention_capture import AttentionCapture

    shares = {}
    for number, text in enumerate([*load_texts(HELDOUT)[:2], "The cat sat on the mat."]):
        path = tmp_path / f"norm{number}.safetensors"
        result = run_cli(capsys, "capture", text, "--weighting", "norm", "--out", str(path))
        assert result.exit_code == 0, result.stderr
        captured = AttentionCapture.load(path)
        assert captured.weighting == "norm"
        ours, reference = captured.stacked(), _minilm_norm_reference(minilm_dir, text)
        assert torch.allclose(ours, reference, rtol=1e-5, atol=1e-5 * float(reference.max()))
        weights = AttentionCapture.load(
            run_cli(capsys, "capture", text, "--out", str(tmp_path / f"w{number}.safetensors")).stdout.strip()
        ).stacked()
        special = torch.tensor(captured.special)
        rows = ours / ours.sum(-1, keepdim=True)
        shares[text] = (float(weights[..., special].sum(-1).mean()), float(rows[..., special].sum(-1).mean()))
    by_weights, by_norms = shares["The cat sat on the mat."]
    assert by_weights == pytest.approx(0.59, abs=0.02) and by_norms == pytest.approx(0.21, abs=0.02)
    assert all(norm < 0.5 * weight for weight, norm in shares.values())


def test_heatmap_and_diff_say_they_show_norms(capsys, tiny_dirs, tiny_model_dirs, tmp_path):
    from figure_helpers import read_svg

    figure = tmp_path / "norm.svg"
    result = run_cli(
        capsys, "heatmap", TEXTS[0], "--model", str(tiny_dirs["bert"]), "--weighting", "norm", "--out", figure
    )
    assert result.exit_code == 0, result.stderr
    texts = " ".join(read_svg(figure).texts)
    assert "norm-based" in texts and "weight × value norm" in texts
    report = tmp_path / "diff.json"
    plain, sharp = str(tiny_model_dirs["bert"]), str(tiny_dirs["bert"])
    result = run_cli(capsys, "diff", plain, sharp, "--text", TEXTS[0], "--weighting", "norm", "--json", report)
    assert result.exit_code == 0, result.stderr
    record = json.loads(report.read_text())
    assert record["weighting"] == "norm" and record["heads"][0]["js_divergence"] > 0
    assert set(record["heads"][0]["delta"]) == set(STATISTIC_NAMES)


@pytest.mark.parametrize("family", ["t5", "bart", "gpt_neo"])
def test_norm_weighting_works_on_encoder_decoders_and_eager_attention_families(
    capsys, tiny_model_dirs, tmp_path, family
):
    from attnviz.captures.attention_capture import AttentionCapture

    path = tmp_path / f"{family}.safetensors"
    result = run_cli(capsys, "capture", TEXTS[0], "--model", str(tiny_model_dirs[family]), "--weighting", "norm",
                     "--out", str(path))  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert "physically prune" not in result.stderr
    captured = AttentionCapture.load(path)
    assert captured.weighting == "norm"
    stack = "self" if family == "gpt_neo" else "encoder"
    rows = captured.layer(0, stack)  # [h, q, k]: α·‖f(x_j)‖, not rows of weights summing to 1
    assert not torch.allclose(rows.sum(-1), torch.ones_like(rows.sum(-1)))


def test_explain_page_opens_offline_and_switches_colours(capsys, browser, tmp_path):
    from browser import PageRun
    from PIL import Image

    page, figure = tmp_path / "why.html", tmp_path / "why.png"
    result = run_cli(
        capsys, "explain", "minilm", "The cat sat on the mat.", "--layer", "2", "--head", "9", "--query", "3",
        "--key", "0", "--out", page, "--out", figure,
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert "logit =" in " ".join(result.stderr.split()) or "logit =" in result.stdout
    assert Image.open(figure).size[0] > 1000
    run = PageRun(browser, page)
    try:
        run.assert_clean()
        points = run.page.eval_on_selector_all(".point", "ps => ps.length")
        assert points == 2 * 9  # a query and a key per token
        before = run.page.eval_on_selector_all(".point", "ps => ps.map(p => p.getAttribute('fill'))")
        run.page.select_option("#colour-by", "token")
        after = run.page.eval_on_selector_all(".point", "ps => ps.map(p => p.getAttribute('fill'))")
        assert before != after
        assert run.page.eval_on_selector_all("#dimensions tr", "rows => rows.length") > 1
    finally:
        run.close()


def test_stats_command_says_what_it_computed(capsys, tiny_dirs, tmp_path):
    import csv

    out = tmp_path / "norm.json"
    table = tmp_path / "norm.csv"
    result = run_cli(
        capsys, "stats", str(tiny_dirs["bert"]), "--text", TEXTS[0], "--weighting", "norm",
        "--json", str(out), "--csv", str(table),
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    record = json.loads(out.read_text())
    assert record["weighting"] == "norm"
    head = record["heads"][0]
    assert 0 <= head["first_token_norm_share"] <= 1 and head["first_value_norm"] > 0
    rows = list(csv.DictReader(table.open()))
    assert float(rows[0]["first_token_norm_share"]) == pytest.approx(head["first_token_norm_share"])
    said = " ".join((result.stdout + result.stderr).split())
    assert "rows renormalised to sum 1" in said and "of the norm-weighted mass" in said
    bad = run_cli(capsys, "stats", str(tiny_dirs["bert"]), "--text", TEXTS[0], "--weighting", "value")
    assert bad.exit_code != 0 and "unknown weighting 'value'" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.parametrize(
    ("arguments", "fragments"),
    [
        (["--layer", "9", "--head", "0"], ("--layer 9 is out of range", "2 layers")),
        (["--layer", "0", "--head", "8"], ("--head 8 is out of range", "8 heads")),
        (["--layer", "0", "--head", "0", "--query", "first"], ("--query must be a token position or 'last'",)),
        (["--layer", "0", "--head", "0", "--query", "1", "--key", "3"], ("--key 3 is after the query 1",)),
        (["--layer", "0", "--head", "0", "--projection", "umap"], ("unknown projection 'umap'",)),
        (["--layer", "0", "--head", "0", "--out", "map.jpg"], (".jpg",)),
        (
            ["--layer", "0", "--head", "0", "--projection", "tsne", "--seed", "4294967296"],
            ("--seed must be a whole number from 0 to 4,294,967,295, got 4294967296",),
        ),
        (["--layer", "0", "--head", "0", "--seed", "-1"], ("--seed must be a whole number from 0 to 4,294,967,295",)),
    ],
)
def test_bad_explain_input_gives_one_error_line(capsys, tiny_dirs, tmp_path, monkeypatch, arguments, fragments):
    monkeypatch.chdir(tmp_path)
    result = run_cli(capsys, "explain", str(tiny_dirs["llama"]), "The cat sat on the mat.", *arguments)
    assert_clean_error(result, *fragments)
    assert list(tmp_path.iterdir()) == []
