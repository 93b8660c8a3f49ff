"""Attention rollout against hand computations; Jensen–Shannon head similarity."""

from __future__ import annotations

import math

import pytest
import torch

from attnviz.captures.attention_capture import AttentionCapture
from attnviz.heads.propagation import rollout
from attnviz.heads.similarity import embedding_2d, head_similarity, pairwise_js


def capture_of(layers: list[torch.Tensor], causal: bool) -> AttentionCapture:
    n = layers[0].shape[-1]
    return AttentionCapture(model="hand", tokens=[f"t{i}" for i in range(n)], causal=causal, patterns={"self": layers})


def test_rollout_two_tokens_three_layers_by_hand():
    # Each layer: two heads whose mean puts weight a on token 0 from query 1 (query 0 sees only itself).
    # Â = ½A + ½I = [[1, 0], [a/2, 1 − a/2]], rows already sum to 1, so R[1, 0] = 1 − Π(1 − a/2).
    layers = []
    for a_head0, a_head1 in ((0.0, 0.4), (0.5, 0.7), (1.0, 1.0)):  # means a = 0.2, 0.6, 1.0
        layers.append(torch.tensor([[[1.0, 0.0], [a_head0, 1 - a_head0]], [[1.0, 0.0], [a_head1, 1 - a_head1]]]))
    result = rollout(capture_of(layers, causal=True))
    expected_10 = 1 - (1 - 0.1) * (1 - 0.3) * (1 - 0.5)  # 0.685
    torch.testing.assert_close(result, torch.tensor([[1.0, 0.0], [expected_10, 1 - expected_10]]))
    assert result.dtype == torch.float32


def test_rollout_three_tokens_three_layers_matches_the_definition_step_by_step():
    torch.manual_seed(0)
    layers = [torch.rand(2, 3, 3).softmax(-1) for _ in range(3)]  # bidirectional, [head, q, k]
    hats = []
    for pattern in layers:
        mean = [[(pattern[0, i, j] + pattern[1, i, j]) / 2 for j in range(3)] for i in range(3)]
        hat = [[0.5 * mean[i][j] + (0.5 if i == j else 0.0) for j in range(3)] for i in range(3)]
        hats.append([[hat[i][j] / sum(hat[i]) for j in range(3)] for i in range(3)])

    def matmul(a, b):
        return [[sum(a[i][m] * b[m][j] for m in range(3)) for j in range(3)] for i in range(3)]

    expected = matmul(hats[2], matmul(hats[1], hats[0]))  # Â₃ Â₂ Â₁
    result = rollout(capture_of(layers, causal=False))
    torch.testing.assert_close(result, torch.tensor(expected), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(result.sum(-1), torch.ones(3))


def test_js_divergence_by_hand_symmetric_zero_on_itself():
    torch.manual_seed(1)
    patterns = torch.rand(5, 4, 6).softmax(-1)  # [heads, query, key]
    patterns[4] = patterns[2]  # a head identical to another
    sums = pairwise_js(patterns)  # [5, 5] summed over the 4 queries
    assert torch.equal(sums, sums.T)
    assert float(sums.diagonal().abs().max()) == 0.0
    assert float(sums[2, 4]) == pytest.approx(0.0, abs=1e-5)
    p, q = patterns[0], patterns[3]
    m = (p + q) / 2
    by_hand = 0.5 * (p * (p / m).log()).sum() + 0.5 * (q * (q / m).log()).sum()  # over all 4 queries
    assert float(sums[0, 3]) == pytest.approx(float(by_hand), rel=1e-4)
    one_hot = torch.zeros(2, 1, 2)
    one_hot[0, 0, 0] = one_hot[1, 0, 1] = 1.0
    assert float(pairwise_js(one_hot)[0, 1]) == pytest.approx(math.log(2), rel=1e-5)  # disjoint: ln 2
    causal = torch.rand(3, 5, 5).tril()
    causal /= causal.sum(-1, keepdim=True)
    torch.testing.assert_close(pairwise_js(causal, causal=True), pairwise_js(causal), atol=1e-5, rtol=1e-4)


def test_head_similarity_on_a_model_and_its_embedding(tiny_model_dirs):
    from attnviz.models.hf import load_hf_model

    loaded = load_hf_model(str(tiny_model_dirs["llama"]), device="cpu")
    similarity = head_similarity(loaded, texts=["The cat sat on the mat.", "Bees dance."], max_tokens=6)
    n = len(similarity.heads)
    assert n == 2 * 8 and similarity.source == "corpus" and similarity.examples == 2
    matrix = similarity.divergence
    assert torch.equal(matrix, matrix.T) and float(matrix.diagonal().abs().max()) == 0.0
    assert float(matrix.min()) >= 0.0 and float(matrix.max()) <= math.log(2) + 1e-6
    # classical MDS of a configuration that is exactly 1-D: points on a line at 0, 1, 3
    positions = torch.tensor([0.0, 1.0, 3.0])
    squared = (positions[:, None] - positions[None, :]) ** 2
    coordinates = embedding_2d(squared)
    recovered = torch.cdist(coordinates, coordinates) ** 2
    torch.testing.assert_close(recovered, squared, atol=1e-4, rtol=1e-4)


def test_capture_file_keeps_the_rollout(tmp_path):
    torch.manual_seed(2)
    capture = capture_of([torch.rand(2, 4, 4).softmax(-1) for _ in range(3)], causal=False)
    capture.extras["rollout"] = rollout(capture)
    path = capture.save(tmp_path / "c.safetensors")
    loaded = AttentionCapture.load(path)
    torch.testing.assert_close(loaded.extras["rollout"], rollout(capture))
    assert loaded.num_layers() == 3


def test_attention_flow_by_hand_and_refusal_of_long_inputs():
    from attnviz.common.errors import InputError
    from attnviz.heads.propagation import MAX_FLOW_TOKENS, attention_flow

    torch.manual_seed(3)
    one = [torch.rand(2, 3, 3).softmax(-1)]
    hat = 0.5 * one[0].double().mean(0) + 0.5 * torch.eye(3, dtype=torch.float64)
    hat = hat / hat.sum(-1, keepdim=True)
    # one layer: one edge per pair, so the flow is its capacity Â[i, j]
    torch.testing.assert_close(attention_flow(capture_of(one, causal=False)), hat.float(), atol=2e-6, rtol=0)
    # two layers, two tokens: the paths i → k → j (k = 0, 1) share no edge, so flow = Σₖ min(Â₂[i, k], Â₁[k, j])
    two = [torch.tensor([[[0.9, 0.1], [0.3, 0.7]]]), torch.tensor([[[0.2, 0.8], [0.6, 0.4]]])]
    hats = [0.5 * layer[0].double() + 0.5 * torch.eye(2, dtype=torch.float64) for layer in two]  # rows sum to 1
    expected = torch.tensor(
        [[sum(min(hats[1][i, k], hats[0][k, j]) for k in range(2)) for j in range(2)] for i in range(2)]
    )
    torch.testing.assert_close(attention_flow(capture_of(two, causal=False)), expected.float(), atol=2e-6, rtol=0)
    long = [torch.rand(1, MAX_FLOW_TOKENS + 1, MAX_FLOW_TOKENS + 1).softmax(-1)]
    with pytest.raises(InputError, match="at most 32 tokens"):
        attention_flow(capture_of(long, causal=False))
