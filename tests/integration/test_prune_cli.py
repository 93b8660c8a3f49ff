"""``attnviz prune`` end to end on tiny models: outputs, report, and bad input."""

from __future__ import annotations

import json

import pytest
import torch
from cli_helpers import assert_clean_error, run_cli
from figure_helpers import read_svg
from tiny_models import TEXTS, main_output
from transformers import AutoModelForCausalLM

from attnviz.models.head_sets import removal_mask
from attnviz.models.specs import PRUNED_MARKER, TOY_MARKER, load_model
from attnviz.prune.cost import parameter_count

# fixtures shared by the pruning tests (tiny BERT, GPT-2 and LLaMA models)

REQUIRED_FIELDS = {
    "importance": list,
    "pruned": list,
    "metric": str,
    "metric_before": float,
    "metric_after": float,
    "params_before": int,
    "params_after": int,
    "latency_before_ms": float,
    "latency_after_ms": float,
}


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "texts.txt"
    path.write_text("\n".join(TEXTS) + "\n")
    return path


def _prune(capsys, model_dir, out, *extra):
    return run_cli(capsys, "prune", model_dir, "--out", out, "--latency-tokens", "16", "--latency-repeats", "1", *extra)


def test_prune_llama_writes_checkpoint_and_report(capsys, tiny_dirs, tiny_models, data_file, tmp_path):
    out, report_path = tmp_path / "pruned", tmp_path / "report.json"
    result = _prune(
        capsys,
        tiny_dirs["llama"],
        out,
        "--ratio",
        "0.3",
        "--data",
        data_file,
        "--json",
        report_path,
        "--transformers-copy",
    )
    assert result.exit_code == 0, result.stderr
    marker = json.loads((out / PRUNED_MARKER).read_text())
    assert marker["transformers_copy"] == "transformers-masked"
    report = json.loads(report_path.read_text())
    for name, kind in REQUIRED_FIELDS.items():
        assert isinstance(report[name], kind), name
    assert report["metric"] == "perplexity" and report["objective"] == "language_model"
    assert len(report["importance"]) == 16 and {"layer", "head", "score"} <= set(report["importance"][0])
    assert len(report["pruned"]) == round(0.3 * 16) and {"layer", "head"} <= set(report["pruned"][0])
    assert report["params_after"] < report["params_before"]
    assert report["max_abs_diff"] <= 1e-5
    # the reported "after" metric is the reloaded checkpoint's perplexity on the same data
    original, reloaded = tiny_models["llama"], load_model(str(out), device="cpu")
    # heads left per layer: the weights keep a removed GQA head whose key/value group survives (output zeroed)
    assert [len(site["kept_heads"]) for site in marker["sites"]] == list(reloaded.layout().values())
    left = [
        {"stack": "self", "layer": site["layer"], "heads": site["original_heads"] - len(site["removed_heads"])}
        for site in marker["sites"]
    ]
    assert report["heads_per_layer_after"] == left and report["heads_after"] == 16 - len(report["pruned"])
    assert parameter_count(reloaded.model) == report["params_after"]
    removed = {}
    for item in report["pruned"]:
        removed.setdefault(next(s for s in original.layout() if s.layer == item["layer"]), []).append(item["head"])
    batch = original.encode(TEXTS)
    valid = batch.inputs["attention_mask"].bool()
    masked = main_output(original, batch, original.context(head_mask=removal_mask(original.layout(), removed)))
    assert (masked[valid] - main_output(reloaded, batch)[valid]).abs().max() <= 1e-5
    # the plain-transformers copy (removed heads' output weights zeroed) gives the same logits without attnviz
    plain = AutoModelForCausalLM.from_pretrained(out / "transformers-masked", attn_implementation="eager").eval()
    with torch.no_grad():
        plain_logits = plain(**batch.inputs).logits.double()
    assert (masked[valid] - plain_logits[valid]).abs().max() <= 1e-5
    assert "head importance" in result.stderr and "latency" in result.stderr
    # the importance table marks exactly the removed heads with "*" (visible without colour)
    importance_rows = result.stderr.split("head importance", 1)[1].split("* removed", 1)[0]
    assert importance_rows.count("*") == len(report["pruned"])


def test_the_pruned_folder_is_smaller_than_the_model_it_read(capsys, tiny_dirs, data_file, tmp_path, monkeypatch):
    """By default only the smaller model is written; the full-size transformers copy is an option."""
    from attnviz.models.inventory import directory_size

    source = tiny_dirs["bert"]
    out = tmp_path / "pruned"
    result = _prune(capsys, source, out, "--ratio", "0.5", "--data", data_file)
    assert result.exit_code == 0, result.stderr
    assert not (out / "transformers-masked").exists()
    assert json.loads((out / PRUNED_MARKER).read_text())["transformers_copy"] is None
    assert directory_size(out) < directory_size(source), (directory_size(out), directory_size(source))
    assert (out / "model.safetensors").stat().st_size < (source / "model.safetensors").stat().st_size
    monkeypatch.setenv("COLUMNS", "400")  # the option's help on one line
    help_text = " ".join(run_cli(capsys, "prune", "--help").stdout.split())
    assert "--transformers-copy" in help_text and "as large as the model read (88 MB more for minilm)" in help_text


def test_pruned_checkpoint_works_with_heatmap_and_stats(capsys, tiny_dirs, data_file, tmp_path):
    out = tmp_path / "pruned"
    assert _prune(capsys, tiny_dirs["bert"], out, "--count", "3", "--data", data_file).exit_code == 0
    kept = {site["layer"]: site["kept_heads"] for site in json.loads((out / PRUNED_MARKER).read_text())["sites"]}
    assert sum(len(heads) for heads in kept.values()) == 2 * 4 - 3
    figure = tmp_path / "heat.svg"
    result = run_cli(capsys, "heatmap", TEXTS[0], "--model", out, "--layer", "0", "--out", figure)
    assert result.exit_code == 0, result.stderr
    assert read_svg(figure).panel_titles() == [(0, head) for head in kept[0]]  # the kept heads, original numbers
    stats_json = tmp_path / "stats.json"
    result = run_cli(capsys, "stats", out, "--data", data_file, "--json", stats_json)
    assert result.exit_code == 0, result.stderr
    record = json.loads(stats_json.read_text())
    assert [(h["layer"], h["head"]) for h in record["heads"]] == [(l, h) for l in (0, 1) for h in kept[l]]
    assert record["num_examples"] == len(TEXTS)


def test_force_replaces_and_iterative_per_layer_options(capsys, tiny_dirs, data_file, tmp_path):
    out, report_path = tmp_path / "pruned", tmp_path / "report.json"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    result = _prune(
        capsys,
        tiny_dirs["gpt2"],
        out,
        "--ratio",
        "0.25",
        "--data",
        data_file,
        "--iterative",
        "--steps",
        "2",
        "--strategy",
        "per-layer",
        "--importance",
        "ablation",
        "--force",
        "--no-transformers-copy",
        "--json",
        report_path,
    )
    assert result.exit_code == 0, result.stderr
    assert not (out / "stale.txt").exists() and not (out / "transformers-masked").exists()
    report = json.loads(report_path.read_text())
    assert report["strategy"]["iterative"] and report["strategy"]["scope"] == "per-layer"
    assert [item["heads"] for item in report["heads_per_layer_after"]] == [3, 3]
    assert len(report["steps"]) == 2 and report["importance_method"] == "ablation"


def test_min_score_alone_prunes_until_quality_limit(capsys, tiny_dirs, data_file, tmp_path):
    report_path = tmp_path / "report.json"
    result = _prune(
        capsys,
        tiny_dirs["bert"],
        tmp_path / "out",
        "--min-score",
        "0.98",
        "--data",
        data_file,
        "--json",
        report_path,
        "--no-transformers-copy",
    )
    assert result.exit_code == 0, result.stderr
    report = json.loads(report_path.read_text())
    assert report["metric"] == "cosine_similarity" and report["metric_before"] == pytest.approx(1.0, abs=1e-6)
    assert report["metric_after"] >= 0.98 * report["metric_before"] - 1e-6
    assert report["strategy"]["min_score"] == 0.98


def test_prune_toy_checkpoint(capsys, tmp_path):
    from attnviz.toy import build_toy_model, save_toy_model

    torch.manual_seed(0)
    toy = build_toy_model("previous-token", architecture="encoder", num_heads=4, width=32, num_layers=2)
    save_toy_model(toy, tmp_path / "toy")
    out, report_path = tmp_path / "pruned-toy", tmp_path / "report.json"
    result = _prune(capsys, tmp_path / "toy", out, "--count", "3", "--json", report_path, "--toy-examples", "64")
    assert result.exit_code == 0, result.stderr
    assert (out / TOY_MARKER).is_file()
    report = json.loads(report_path.read_text())
    assert report["objective"] == "task" and report["metric"] == "accuracy"
    assert report["transformers_copy"] is None and report["max_abs_diff"] <= 1e-5
    reloaded = load_model(str(out), device="cpu")
    assert sum(reloaded.layout().values()) == 5
    assert parameter_count(reloaded.model) == report["params_after"] < report["params_before"]


# -- bad input: one clear error, non-zero exit, nothing written ---------------------------------------


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--ratio", "0"], ["--ratio", "between 0 and 1"]),
        (["--ratio", "1"], ["--ratio", "between 0 and 1"]),
        (["--ratio", "1.5"], ["--ratio", "between 0 and 1"]),
        (["--ratio", "-0.2"], ["--ratio"]),
        (["--count", "16"], ["--count 16", "16 heads"]),
        (["--count", "40"], ["--count 40"]),
        (["--count", "15"], ["every layer keeps one"]),
        (["--ratio", "0.3", "--count", "3"], ["either --ratio or --count"]),
        ([], ["how much to prune"]),
        (["--ratio", "0.3", "--importance", "magic"], ["--importance"]),
        (["--ratio", "0.3", "--strategy", "sideways"], ["--strategy", "per-layer"]),
        (["--ratio", "0.3", "--min-score", "2"], ["--min-score"]),
    ],
)
def test_bad_options_write_nothing(capsys, tiny_dirs, data_file, tmp_path, args, fragments):
    out, report_path = tmp_path / "out", tmp_path / "report.json"
    result = _prune(capsys, tiny_dirs["llama"], out, "--data", data_file, "--json", report_path, *args)
    assert_clean_error(result, *fragments)
    assert not out.exists() and not report_path.exists()
    assert [p.name for p in tmp_path.iterdir()] == []


def test_data_too_short_to_score(capsys, tiny_dirs, tmp_path):
    result = _prune(capsys, tiny_dirs["gpt2"], tmp_path / "out", "--ratio", "0.3", "--text", "hi")
    assert_clean_error(result, "scoring data", "--data")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("family, fragment", [("bart", "encoder-decoder"), ("gpt_neo", "attention interface")])
def test_unsupported_models(capsys, tiny_model_dirs, data_file, tmp_path, family, fragment):
    result = _prune(capsys, tiny_model_dirs[family], tmp_path / "out", "--ratio", "0.3", "--data", data_file)
    assert_clean_error(result, fragment)
    assert list(tmp_path.iterdir()) == []


def test_existing_output_needs_force_and_input_is_never_overwritten(capsys, tiny_dirs, data_file, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    result = _prune(capsys, tiny_dirs["bert"], out, "--ratio", "0.3", "--data", data_file)
    assert_clean_error(result, "not empty", "--force")
    assert [p.name for p in out.iterdir()] == ["keep.txt"]

    before = sorted(p.name for p in tiny_dirs["bert"].iterdir())
    result = _prune(capsys, tiny_dirs["bert"], tiny_dirs["bert"], "--ratio", "0.3", "--data", data_file, "--force")
    assert_clean_error(result, "overwrite the input")
    assert sorted(p.name for p in tiny_dirs["bert"].iterdir()) == before


def test_missing_out_is_a_clear_error(capsys, tiny_dirs):
    assert_clean_error(run_cli(capsys, "prune", tiny_dirs["bert"], "--ratio", "0.3"), "--out")
