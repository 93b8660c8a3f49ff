"""attnviz.stats.measure: what ``attnviz stats`` runs per checkpoint equals the steps done by hand."""

from __future__ import annotations

import torch

from attnviz.models.specs import load_model
from attnviz.stats import compute_statistics, detect_heads, preset_thresholds
from attnviz.stats.measure import measure_checkpoints

TEXTS = ["The cat sat on the mat.", "Bees can dance to tell where flowers are.", "A short one."]


def test_measuring_specs_equals_loading_computing_and_detecting(tiny_model_dirs):
    specs = [str(tiny_model_dirs["bert"]), str(tiny_model_dirs["gpt2"])]
    thresholds = preset_thresholds("seed")
    results = measure_checkpoints(specs, TEXTS, thresholds=thresholds, local_window=1, batch_size=2)
    assert len(results) == 2
    for spec, (stats, detection) in zip(specs, results):
        reference = compute_statistics(load_model(spec), TEXTS, local_window=1, batch_size=2, progress=False)
        for name in ("entropy", "max_weight", "local_ratio"):
            assert torch.allclose(stats.matrix(name), reference.matrix(name), atol=1e-6)
        assert detection.flags == detect_heads(reference, thresholds).flags
        assert detection.thresholds == thresholds
