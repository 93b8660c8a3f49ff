"""One table says which side each attention stack reads; lengths, tokens and causality all follow it."""

from __future__ import annotations

import pytest

from attnviz.core.stacks import STACKS, stack_of
from attnviz.models.base import EncodedBatch

SOURCE, TARGET = ["a", "b", "c"], ["x", "y"]


@pytest.mark.parametrize(
    ("name", "queries", "keys", "causal_in_lm", "causal_in_encoder"),
    [
        ("self", SOURCE, SOURCE, True, False),
        ("encoder", SOURCE, SOURCE, False, False),
        ("decoder", TARGET, TARGET, True, True),
        ("cross", TARGET, SOURCE, False, False),
    ],
)
def test_stack_sides_and_causality(name, queries, keys, causal_in_lm, causal_in_encoder):
    stack = stack_of(name)
    assert stack.pick(SOURCE, TARGET) == (queries, keys)
    assert stack.is_causal(causal_model=True) is causal_in_lm
    assert stack.is_causal(causal_model=False) is causal_in_encoder


def test_batch_reads_lengths_and_tokens_through_the_table():
    batch = EncodedBatch(
        inputs={},
        tokens=[SOURCE],
        special=[[True, False, True]],
        word_ids=[[None, 0, None]],
        target_tokens=[TARGET],
        target_special=[[False, False]],
        target_word_ids=[[0, 1]],
    )
    assert batch.query_key_lengths("cross") == ([2], [3])
    assert batch.query_key_tokens("decoder") == ([TARGET], [TARGET])
    assert batch.key_padding_mask("cross").tolist() == [[True, True, True]]
    source_only = EncodedBatch(inputs={}, tokens=[SOURCE], special=[[False] * 3], word_ids=[[0, 1, 2]])
    with pytest.raises(ValueError, match="needs a target"):
        source_only.query_key_lengths("cross")
    assert set(STACKS) == {"self", "encoder", "decoder", "cross"}
    with pytest.raises(ValueError, match="unknown attention stack"):
        stack_of("middle")
