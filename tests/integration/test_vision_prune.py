"""``attnviz prune`` on vision classifiers: judged by the KL divergence from the unpruned model's own predictions.

Tiny random ViT, DeiT (with teacher) and DINOv2-with-registers classifiers (``tiny_vision.build_tiny_classifier``),
the shipped ``toy-odd-patch``, and the refusals (towers and bare models, text for a vision model, images for a
text model, a folder without images, a file that is not an image).
"""

from __future__ import annotations

import json

import pytest
import torch
from cli_helpers import assert_clean_error, run_cli
from tiny_vision import CLASSIFIERS, build_tiny_classifier, sample_images

from attnviz.core import AttentionSite, HeadMask
from attnviz.models.head_sets import removal_mask
from attnviz.models.specs import PRUNED_MARKER, load_model
from attnviz.prune.cost import forward_output, parameter_count
from attnviz.prune.importance import gradient_importance
from attnviz.prune.judging import image_judging_batches
from attnviz.prune.pipeline import PruneConfig, prune_checkpoint

PRUNED_FAMILIES = ("vit", "deit", "dinov2_registers")
#: heads removed by hand: two of layer 0, one of layer 1 (of 4 each)
REMOVED = {AttentionSite("self", 0): [1, 3], AttentionSite("self", 1): [0]}


@pytest.fixture(scope="module")
def classifier_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-classifiers")
    return {family: build_tiny_classifier(family, root / family, seed=3) for family in CLASSIFIERS}


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("prune-images")
    for index, image in enumerate(sample_images(12, seed=5)):
        image.save(folder / f"photo-{index:02d}.png")
    return folder


@pytest.mark.parametrize("family", PRUNED_FAMILIES)
def test_masked_model_equals_physically_pruned_model(family, classifier_dirs):
    loaded = load_model(str(classifier_dirs[family]), device="cpu")
    loaded.check_objective()
    pruned, plans = loaded.remove_heads(REMOVED)
    assert {site: plan.sliced for site, plan in plans.items()} == REMOVED  # every head sliced out, none masked
    assert pruned.layout() == {AttentionSite("self", 0): 2, AttentionSite("self", 1): 3}
    assert parameter_count(pruned.model) < parameter_count(loaded.model)
    batch = loaded.encode_images(sample_images(6, seed=8))
    masked = forward_output(loaded, batch, loaded.context(head_mask=removal_mask(loaded.layout(), REMOVED)))
    after = forward_output(pruned, batch)
    assert masked.shape == (6, 5)
    assert float((masked - after).abs().max()) <= 1e-5
    # and removing heads changed the logits (the comparison is not between two unchanged models)
    assert float((forward_output(loaded, batch) - after).abs().max()) > 1e-3


def test_kl_objective_equals_hand_computation(classifier_dirs):
    """Loss = mean KL(p ‖ q) and metric = share of unchanged top classes, against plain transformers (eager)."""
    import transformers

    path = classifier_dirs["vit"]
    loaded = load_model(str(path), device="cpu")
    images = sample_images(10, seed=12)
    objective = loaded.objective(image_judging_batches(loaded, images, batch_size=4))  # batches of 4, 4, 2
    assert objective.kind == "prediction" and objective.total_units() == 10
    before = objective.evaluate()
    assert before.loss == 0.0 and before.metric == 1.0 and before.metric_name == "agreement"

    # reference: transformers' own eager model, the removed heads' output-projection columns zeroed by hand
    original = transformers.ViTForImageClassification.from_pretrained(path, attn_implementation="eager").eval()
    masked = transformers.ViTForImageClassification.from_pretrained(path, attn_implementation="eager").eval()
    head_dim = masked.config.hidden_size // masked.config.num_attention_heads
    with torch.no_grad():
        for site, heads in REMOVED.items():
            weight = masked.vit.layers[site.layer].attention.o_proj.weight  # [hidden, heads·head_dim]
            for head in heads:
                weight[:, head * head_dim : (head + 1) * head_dim] = 0
        pixels = loaded.encode_images(images).inputs["pixel_values"]
        p = torch.softmax(original(pixel_values=pixels).logits.double(), -1)  # [10, 5]
        q = torch.softmax(masked(pixel_values=pixels).logits.double(), -1)  # [10, 5]
    kl = float((p * (p.log() - q.log())).sum(-1).mean())
    agreement = float((p.argmax(-1) == q.argmax(-1)).double().mean())
    after = objective.evaluate(removal_mask(loaded.layout(), REMOVED))
    assert kl > 1e-4
    assert after.loss == pytest.approx(kl, rel=1e-4, abs=1e-9)
    assert after.metric == pytest.approx(agreement)


def test_gradient_importance_uses_fisher_probes(classifier_dirs):
    """The KL's own gradient at the unpruned model is zero; the probes' squared gradient is its curvature."""
    loaded = load_model(str(classifier_dirs["deit"]), device="cpu")
    layout = loaded.layout()
    probes = 400
    objective = loaded.objective(image_judging_batches(loaded, sample_images(8, seed=4), batch_size=8), probes=probes)
    sites = sorted(layout)

    def variables():
        return {site: torch.ones(layout[site], dtype=torch.float32, requires_grad=True) for site in sites}

    xi = variables()
    loss, _ = objective.batch_loss(0, loaded.context(head_mask=HeadMask(xi)))
    gradient = torch.cat(torch.autograd.grad(loss, [xi[site] for site in sites]))
    assert float(gradient.abs().max()) < 1e-6  # KL is minimal at ξ = 1

    # reference curvature: Σᵢ Jᵢᵀ F J with Jᵢ = ∂ log qᵢ / ∂ξ and F = diag(p) − p pᵀ, by explicit Jacobians
    xi = variables()
    log_q = torch.log_softmax(
        loaded.forward(objective.batches[0], loaded.context(head_mask=HeadMask(xi)), logits=True).logits.double(), -1
    )  # [8, c]
    p = log_q.detach().exp()
    images, classes = log_q.shape
    jacobian = torch.zeros(images, classes, sum(layout.values()), dtype=torch.float64)
    for i in range(images):
        for c in range(classes):
            rows = torch.autograd.grad(log_q[i, c], [xi[site] for site in sites], retain_graph=True)
            jacobian[i, c] = torch.cat(rows).double()
    fisher = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]  # [8, c, c]
    curvature = torch.einsum("ich,icd,idh->h", jacobian, fisher, jacobian) / images**2  # [heads]

    xi = variables()
    losses = objective.gradient_losses(0, loaded.context(head_mask=HeadMask(xi)))
    assert len(losses) == probes
    squares = torch.zeros(sum(layout.values()), dtype=torch.float64)
    for number, probe_loss in enumerate(losses):
        grads = torch.autograd.grad(probe_loss, [xi[site] for site in sites], retain_graph=number < probes - 1)
        squares += torch.cat(grads).double() ** 2 / probes
    assert bool((curvature > 0).all())
    # the mean of 400 squared Gaussians is within ~20 % of their variance (3 standard errors of √(2/400))
    assert torch.allclose(squares, curvature, rtol=0.25), (squares, curvature)
    scores = gradient_importance(objective, layout, normalize=False)
    assert all(bool((values > 0).all()) for values in scores.values())


def test_prune_writes_a_checkpoint_that_reloads(classifier_dirs, image_folder, tmp_path, capsys):
    path, out = classifier_dirs["dinov2_registers"], tmp_path / "pruned"
    images = sorted(image_folder.glob("*.png"))
    config = PruneConfig(count=3, importance="ablation", latency_repeats=1)
    outcome = prune_checkpoint(
        str(path), out, config, images=images[:8], eval_images=images[8:] * 2, transformers_copy=True
    )
    report = outcome.report
    assert report.objective == "prediction" and report.metric == "agreement" and report.unit == "images"
    assert report.metric_before == 1.0 and report.loss_before == 0.0
    assert (report.scoring_units, report.evaluation_units) == (8, 8)
    assert report.max_abs_diff <= 1e-5 and report.params_after < report.params_before
    # the removed heads are recorded per layer, and the image processor travels with the weights
    marker = json.loads((out / PRUNED_MARKER).read_text())
    removed = {(item["layer"], item["head"]) for item in report.pruned}
    assert len(removed) == 3
    for site in marker["sites"]:
        gone = sorted(head for layer, head in removed if layer == site["layer"])
        assert site["removed_heads"] == gone and site["heads"] == 4 - len(gone) and site["original_heads"] == 4
    assert (out / "preprocessor_config.json").is_file() and not (out / "tokenizer.json").exists()
    assert (out / "transformers-masked" / "preprocessor_config.json").is_file()
    # reloaded, it is the pruned model: same heads, same logits
    reloaded = load_model(str(out), device="cpu")
    assert reloaded.layout() == outcome.pruned.layout() and reloaded.extra_kinds == ("cls", "register", "register")
    batch = reloaded.encode_images(sample_images(5, seed=30))
    assert float((forward_output(reloaded, batch) - forward_output(outcome.pruned, batch)).abs().max()) <= 1e-6
    # the plain-transformers copy (full size, zeroed output weights) computes the same
    import transformers

    plain = transformers.AutoModelForImageClassification.from_pretrained(out / "transformers-masked").eval()
    with torch.no_grad():
        logits = plain(pixel_values=batch.inputs["pixel_values"]).logits.double()
    assert float((logits - forward_output(reloaded, batch)).abs().max()) <= 1e-4
    # attnviz draws the pruned model on an image
    figure = tmp_path / "overlay.png"
    result = run_cli(capsys, "heatmap", "--image", images[0], "--model", out, "--out", figure)
    assert result.exit_code == 0, result.stderr
    assert figure.is_file()


def test_toy_odd_patch_keeps_its_answers(capsys, tmp_path):
    """Two of the toy's eight heads removed by ablation; the held-out task images keep their top class."""
    out, report_path = tmp_path / "pruned-toy", tmp_path / "report.json"
    result = run_cli(
        capsys,
        "prune",
        "toy-odd-patch",
        "--count",
        "2",
        "--importance",
        "ablation",
        "--latency-repeats",
        "2",
        "--json",
        report_path,
        "--out",
        out,
    )
    assert result.exit_code == 0, result.stderr
    report = json.loads(report_path.read_text())
    assert report["objective"] == "prediction" and report["metric"] == "agreement"
    assert report["metric_before"] == 1.0 and report["loss_before"] == 0.0
    assert report["evaluation_units"] == 256 and report["heads_after"] == 6
    assert report["metric_after"] >= 0.9, report
    assert report["metric_masked"] == pytest.approx(report["metric_after"])
    assert report["params_after"] < report["params_before"] and report["max_abs_diff"] <= 1e-5
    assert "agreement" in result.stderr and str(out) in result.stdout.splitlines()
    # the pruned toy still knows its task: it draws its own images and answers them
    reloaded = load_model(str(out), device="cpu")
    from attnviz.toy.odd_patch import odd_patch_images

    images, labels = odd_patch_images(200, seed=77)
    with torch.no_grad():
        predicted = reloaded.forward(reloaded.encode_images(images), logits=True).logits.argmax(-1)
    assert reloaded.own_images(2, 0) is not None
    assert float((predicted == torch.tensor(labels)).float().mean()) >= 0.9


# -- refusals: one error line, nothing written --------------------------------------------------------


@pytest.fixture(scope="module")
def refusal_inputs(tmp_path_factory, image_folder, classifier_dirs):
    import transformers
    from tiny_vision import tiny_vision_config

    root = tmp_path_factory.mktemp("refusals")
    _, config, processor = tiny_vision_config("vit")
    bare = root / "bare-vit"
    transformers.ViTModel(config).save_pretrained(bare)
    processor.save_pretrained(bare)
    empty = root / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("no pictures here")
    broken = root / "broken"
    broken.mkdir()
    for source in sorted(image_folder.glob("*.png"))[:8]:
        (broken / source.name).write_bytes(source.read_bytes())
    (broken / "photo-99.png").write_text("hello, I am not a picture")
    return {"bare": bare, "empty": empty, "broken": broken}


def test_refusals(capsys, tmp_path, tiny_vision_dirs, classifier_dirs, image_folder, refusal_inputs):
    vit = classifier_dirs["vit"]
    cases = [
        ((tiny_vision_dirs["clip"], "--images", image_folder), ("has no classifier", "ForImageClassification")),
        ((refusal_inputs["bare"], "--images", image_folder), ("has no classifier", "ForImageClassification")),
        ((vit, "--text", "a cat sat on the mat"), ("is a vision model", "--images")),
        ((vit, "--images", image_folder, "--eval-data", refusal_inputs["empty"] / "notes.txt"), ("is a vision model",)),
        (("minilm", "--images", image_folder), ("is a text model", "vision classifier")),
        ((vit, "--images", refusal_inputs["empty"]), ("holds no image files",)),
        ((vit, "--images", refusal_inputs["broken"]), ("photo-99.png", "not an image")),
        ((vit,), ("is a vision model", "--images")),
        ((vit, "--image", image_folder / "photo-00.png"), ("only 1 image", "at least 8", "--images")),
        (("toy-odd-patch", "--toy-examples", "1000000000000"), ("--toy-examples", "memory")),
    ]
    for arguments, fragments in cases:
        out = tmp_path / "pruned"
        result = run_cli(capsys, "prune", *arguments, "--count", "1", "--out", out)
        assert_clean_error(result, *fragments)
        assert len(result.error_lines()) == 1, result.stderr
        assert not out.exists(), arguments
    assert list(tmp_path.iterdir()) == []


def test_a_pruned_vision_model_is_summarised_with_the_heads_it_has(classifier_dirs, image_folder, tmp_path, capsys):
    """Layer 0 keeps 2 of 4 heads, layer 1 all 4: heatmap and capture say so, not "2 layers × 2 heads"."""
    from attnviz.models.base import PrunedCopy

    loaded = load_model(str(classifier_dirs["vit"]), device="cpu")
    removed = {AttentionSite("self", 0): [1, 3]}
    pruned, plans = loaded.remove_heads(removed)
    out = tmp_path / "pruned-vit"
    loaded.save_pruned(out, PrunedCopy(pruned, removed, plans), source="vit", transformers_copy=False)
    image = image_folder / "photo-00.png"
    for command in (["heatmap", "--out", tmp_path / "h.png"], ["capture", "--out", tmp_path / "c.safetensors"]):
        result = run_cli(capsys, *command, "--image", image, "--model", out)
        assert result.exit_code == 0, result.stderr
        summary = " ".join(result.stderr.split())
        assert "2 layers, 2–4 heads (6 in all)" in summary, summary
        assert "× 2 heads" not in summary
