"""What :func:`attnviz.patching.patch_heads` finds: one :class:`HeadEffect` per head, and how it was measured."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from attnviz.common.display import NotebookDisplay
from attnviz.common.tokens import display_token
from attnviz.outputs import files
from attnviz.patching.choices import Ablation, Direction, Patched

#: what :meth:`PatchResult.top_heads` ranks by: each number of a :class:`HeadEffect`, and short names for them
RANKINGS = {
    "normalized_effect": "normalized_effect",
    "patched_logit_diff": "patched_logit_diff",
    "direct_logit_attribution": "direct_logit_attribution",
    "ablation_effect": "ablation_effect",
    "effect": "normalized_effect",
    "attribution": "direct_logit_attribution",
    "ablation": "ablation_effect",
}


@dataclass(frozen=True)
class HeadEffect:
    """One head's numbers (``layer``/``head`` as the model numbers them: a pruned model's original head ids).

    ``patched_logit_diff``: logit(answer) − logit(wrong) of the run with this head patched;
    ``normalized_effect``: (patched − unpatched run) / (clean − corrupt): in denoising the share of the clean
    difference this head alone restores (1: all of it), in noising the share it destroys (−1: all of it);
    ``direct_logit_attribution``: the head's own term of the clean logit difference (None where the model has
    no linear readout); ``ablation_effect``: the change of the clean logit difference when the head is ablated
    (None unless ablation was asked for).
    """

    layer: int
    head: int
    patched_logit_diff: float
    normalized_effect: float
    direct_logit_attribution: float | None
    ablation_effect: float | None = None
    #: the attention stack: ``"self"``, or an encoder-decoder's ``"encoder"``, ``"decoder"`` or ``"cross"``
    stack: str = "self"

    @property
    def label(self) -> str:
        return f"L{self.layer} H{self.head}" if self.stack == "self" else f"{self.stack} L{self.layer} H{self.head}"

    def record(self) -> dict:
        return {
            **({} if self.stack == "self" else {"stack": self.stack}),
            "layer": self.layer,
            "head": self.head,
            "patched_logit_diff": self.patched_logit_diff,
            "normalized_effect": self.normalized_effect,
            "direct_logit_attribution": self.direct_logit_attribution,
            "ablation_effect": self.ablation_effect,
        }


@dataclass
class PatchResult(NotebookDisplay):
    """Every head's patching effect, direct logit attribution and ablation effect on one prompt pair."""

    model: str
    clean: str
    corrupt: str
    answer: str  # the answer text; ``answer_token`` the one token it is
    wrong: str
    answer_token: str
    wrong_token: str
    tokens: list[str]  # the clean prompt's tokens
    position: int  # the position whose logits are read (the last token; an encoder's mask token)
    clean_logit_diff: float
    corrupt_logit_diff: float
    direction: Direction
    patched: Patched  # what was patched: "output" or "pattern"
    positions: list[int]  # query positions patched
    heads: list[HeadEffect] = field(default_factory=list)  # in model order
    ablation: Ablation | None = None
    ablation_source: str = ""  # what the mean was taken over ("zero" when zeroed)
    forwards: int = 0  # patched and ablated forward passes run
    seconds: float = 0.0
    #: an encoder-decoder's decoder tokens: ``position`` is then a decoder position (None for other models)
    decoder_tokens: list[str] | None = None

    def top_heads(self, count: int = 5, by: str = "normalized_effect") -> list[HeadEffect]:
        """The ``count`` heads with the largest absolute ``by`` (``normalized_effect``, ``direct_logit_attribution``,
        ``ablation_effect``, ``patched_logit_diff``; or ``effect``, ``attribution``, ``ablation``), largest first;
        heads without that number are left out. :class:`ValueError` for any other ``by``."""

        by = RANKINGS.get(by, by) if isinstance(by, str) else by
        if by not in RANKINGS.values():
            raise ValueError(f"by must be one of {', '.join(sorted(set(RANKINGS.values())))}, got {by!r}")

        def size(effect: HeadEffect) -> float:
            value = getattr(effect, by)
            return -1.0 if value is None or math.isnan(value) else abs(value)

        ranked = sorted((h for h in self.heads if getattr(h, by) is not None), key=size, reverse=True)
        return ranked[:count]

    @property
    def rows(self) -> list[tuple[str, int]]:
        """The grid's rows: ``(stack, layer)`` in model order (one stack, the layers 0 … n−1, for most models)."""
        if all(h.stack == "self" for h in self.heads):
            return [("self", layer) for layer in range(1 + max((h.layer for h in self.heads), default=-1))]
        return list(dict.fromkeys((h.stack, h.layer) for h in self.heads))

    def row(self, effect: HeadEffect) -> int:
        """The grid row of ``effect``'s layer."""
        return self.rows.index((effect.stack, effect.layer))

    @property
    def layers(self) -> int:
        return len(self.rows)

    @property
    def width(self) -> int:
        """Columns of the layer × head grid: the largest head number plus one."""
        return 1 + max((h.head for h in self.heads), default=-1)

    def grid(self, by: str) -> list[list[float]]:
        """``[layer][head]`` of ``by`` (NaN where a layer has no such head, or the number is None)."""
        rows = [[math.nan] * self.width for _ in range(self.layers)]
        index = {row: number for number, row in enumerate(self.rows)}
        for effect in self.heads:
            value = getattr(effect, by)
            rows[index[effect.stack, effect.layer]][effect.head] = math.nan if value is None else float(value)
        return rows

    @property
    def has_attribution(self) -> bool:
        return any(h.direct_logit_attribution is not None for h in self.heads)

    def record(self) -> dict:
        """The JSON document: ``clean_logit_diff``, ``corrupt_logit_diff`` and ``heads`` (see :class:`HeadEffect`)."""
        return {
            "clean_logit_diff": self.clean_logit_diff,
            "corrupt_logit_diff": self.corrupt_logit_diff,
            "heads": [effect.record() for effect in self.heads],
        }

    def save_json(self, path: str | os.PathLike) -> Path:
        """Write :meth:`record` to ``path`` atomically; returns the path."""
        text = json.dumps(self.record(), indent=1, allow_nan=False) + "\n"
        return files.write_text_atomic(path, text)

    def settings_line(self) -> str:
        """How the numbers were measured, in one line."""
        where = "every position" if len(self.positions) == len(self.tokens) else f"position {self.positions[0]}"
        line = (
            f"{self.direction} {self.patched} patching at {where}; logit({self.answer!r}) − "
            f"logit({self.wrong!r}) at {'decoder ' if self.decoder_tokens is not None else ''}position {self.position} "
            f"({display_token((self.decoder_tokens or self.tokens)[self.position])!r})"
        )
        if self.ablation is not None:
            line += f"; {self.ablation_source}"
        return line
