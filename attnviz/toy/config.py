"""The one configuration dataclass of attnviz's toy transformers.

A :class:`ToyConfig` fully describes the architecture (not the weights): it is
stored as JSON inside every toy checkpoint. :meth:`ToyConfig.validate` turns a
configuration that cannot work into an :class:`~attnviz.common.errors.InputError`
whose message says what to change.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from attnviz.common.errors import InputError
from attnviz.common.resources import available_memory, require_memory

#: encoder: bidirectional self-attention; decoder: causal LM; encoder-decoder: both plus cross-attention
ARCHITECTURES = ("encoder", "decoder", "encoder-decoder")

#: every attention variant a toy model can use (see :mod:`attnviz.toy.variants` for the formulas)
VARIANT_NAMES = (
    "scaled-dot",
    "dot",
    "general",
    "additive",
    "relative",
    "local",
    "strided",
    "longformer",
    "bigbird",
    "linear",
    "performer",
)


@dataclass
class ToyConfig:
    """Architecture of a toy transformer (pre-LayerNorm blocks, learned embeddings, untied output head)."""

    # "encoder" (bidirectional), "decoder" (causal language model) or "encoder-decoder"
    architecture: str = "decoder"
    # number of token ids, special tokens included (taken from the tokenizer)
    vocab_size: int = 16
    # longest sequence, per side, the learned position table covers
    max_positions: int = 32
    # d_model: width of the residual stream
    width: int = 64
    # heads per attention layer as built; head_dim = width // num_heads
    num_heads: int = 4
    # layers of the encoder (encoder-only, encoder-decoder) or of the decoder (decoder-only)
    num_layers: int = 2
    # decoder layers of an encoder-decoder model (None: same as num_layers)
    num_decoder_layers: int | None = None
    # heads left at each site after pruning, per stack ({"cross": [4, 2], ...}); None: num_heads everywhere
    heads_per_layer: dict[str, list[int]] | None = None
    # hidden width of each MLP (None: 4 × width; 0: no MLP, an attention-only transformer)
    mlp_width: int | None = None
    # attention variant, one of VARIANT_NAMES
    attention: str = "scaled-dot"
    # local / strided / longformer / bigbird: self-attention keys with |i − j| ≤ window are visible
    window: int = 2
    # strided: keys with (i − j) a multiple of stride are visible too (Sparse Transformer)
    stride: int = 4
    # longformer / bigbird: the first global_tokens positions see, and are seen by, every position
    global_tokens: int = 1
    # bigbird: tokens per block of the random block pattern
    block_size: int = 4
    # bigbird: random key blocks each query block sees (drawn once from `seed`)
    random_blocks: int = 1
    # relative: key offsets j − i are clipped to [−max_relative_position, +max_relative_position]
    max_relative_position: int = 8
    # additive: hidden width of vᵀ·tanh(W·q + U·k) per head (None: head_dim)
    additive_width: int | None = None
    # performer: positive random features per head
    num_features: int = 32
    # seeds the random parts of a variant (bigbird's random blocks, performer's features)
    seed: int = 0
    # dropout on attention weights and residual branches, while training only
    dropout: float = 0.0
    # add learned absolute position embeddings (turn off to let the relative variant stand alone)
    absolute_positions: bool = True

    # -- derived sizes ------------------------------------------------------------------------

    @property
    def head_dim(self) -> int:
        return self.width // self.num_heads

    @property
    def decoder_layers(self) -> int:
        return self.num_layers if self.num_decoder_layers is None else self.num_decoder_layers

    @property
    def hidden_width(self) -> int:
        return 4 * self.width if self.mlp_width is None else self.mlp_width

    @property
    def causal(self) -> bool:
        return self.architecture == "decoder"

    def parameter_estimate(self) -> int:
        """About how many parameters this configuration builds (within a few percent; from the sizes alone)."""
        w, sides = self.width, 2 if self.architecture == "encoder-decoder" else 1
        per_layer = 4 * w * w + 2 * w * self.hidden_width + 8 * w  # q, k, v, output; the MLP; norms and biases
        per_layer += 2 * w * (self.additive_width or 0) + self.num_features * w  # additive, performer
        per_layer += (2 * self.max_relative_position + 1) * w  # relative position embeddings
        layers = self.num_layers + (self.decoder_layers if sides == 2 else 0)
        cross = (4 * w * w) * self.decoder_layers if sides == 2 else 0
        embeddings = (2 * self.vocab_size + sides * self.max_positions) * w  # tokens, output head, positions
        return layers * per_layer + cross + embeddings

    def stacks(self) -> tuple[str, ...]:
        """Attention stacks in the order they run (site names of :class:`attnviz.core.AttentionSite`)."""
        return ("encoder", "decoder", "cross") if self.architecture == "encoder-decoder" else ("self",)

    def layers_of(self, stack: str) -> int:
        if stack in ("self", "encoder"):
            return self.decoder_layers if self.architecture == "decoder" else self.num_layers
        return self.decoder_layers

    def heads_at(self, stack: str, layer: int) -> int:
        """Heads at one site: ``num_heads`` unless pruning left fewer."""
        if self.heads_per_layer and stack in self.heads_per_layer:
            return self.heads_per_layer[stack][layer]
        return self.num_heads

    # -- validation and (de)serialisation -------------------------------------------------------

    def validate(self, *, check_memory: bool = True) -> ToyConfig:
        """Raise :class:`InputError` for a configuration that cannot be built; return ``self``.

        ``check_memory``: also refuse weights that cannot fit in memory, naming the size to lower
        (:func:`require_weights_memory`); a checkpoint's loader checks that itself, since a saved model's sizes
        are no option of the command that loads it.
        """
        if self.architecture not in ARCHITECTURES:
            raise InputError(f"unknown architecture {self.architecture!r}: use one of {', '.join(ARCHITECTURES)}")
        if self.attention not in VARIANT_NAMES:
            raise InputError(f"unknown attention variant {self.attention!r}: use one of {', '.join(VARIANT_NAMES)}")
        for name in ("vocab_size", "max_positions", "width", "num_heads", "num_layers", "stride", "block_size"):
            _require(getattr(self, name) >= 1, f"{name} must be at least 1 (got {getattr(self, name)})")
        if check_memory:
            require_weights_memory(self)
        if self.width % self.num_heads:
            divisors = [h for h in range(1, min(self.width, 16) + 1) if self.width % h == 0]
            raise InputError(
                f"{self.num_heads} heads do not divide the width {self.width}: choose a head count that "
                f"divides it (e.g. {', '.join(map(str, divisors[-4:]))}) or change the width"
            )
        _require(
            self.window >= 0, f"window must be 0 or more (got {self.window}): it is the largest |i − j| a query sees"
        )
        for name in ("global_tokens", "random_blocks", "max_relative_position"):
            _require(getattr(self, name) >= 0, f"{name} must be 0 or more (got {getattr(self, name)})")
        _require(self.num_features >= 1, f"num_features must be at least 1 (got {self.num_features})")
        if self.num_decoder_layers is not None:
            _require(
                self.num_decoder_layers >= 1, f"num_decoder_layers must be at least 1 (got {self.num_decoder_layers})"
            )
        if self.mlp_width is not None:
            _require(self.mlp_width >= 0, f"mlp_width must be 0 (no MLP) or more (got {self.mlp_width})")
        if self.additive_width is not None:
            _require(self.additive_width >= 1, f"additive_width must be at least 1 (got {self.additive_width})")
        _require(0.0 <= self.dropout < 1.0, f"dropout must be in [0, 1) (got {self.dropout})")
        if self.heads_per_layer is not None:
            for stack, heads in self.heads_per_layer.items():
                _require(
                    stack in self.stacks(),
                    f"heads_per_layer names stack {stack!r}; this model has {', '.join(self.stacks())}",
                )
                _require(
                    isinstance(heads, list) and len(heads) == self.layers_of(stack),
                    f"heads_per_layer[{stack!r}] needs one head count per layer ({self.layers_of(stack)})",
                )
                _require(
                    all(isinstance(h, int) and 0 <= h <= self.num_heads for h in heads),
                    f"heads_per_layer[{stack!r}] = {heads}: each count must be between 0 and "
                    f"num_heads ({self.num_heads})",
                )
        return self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any], *, check_memory: bool = True) -> ToyConfig:
        """Build and validate a config from JSON values; unknown or mistyped fields raise :class:`InputError`."""
        if not isinstance(values, dict):
            raise InputError("a toy config must be a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise InputError(f"unknown toy config field(s): {', '.join(unknown)}")
        config = cls(**values)
        for f in fields(cls):
            value = getattr(config, f.name)
            expected = _FIELD_TYPES.get(f.name)
            if expected is not None and not (value is None and f.name in _OPTIONAL) and not _is_type(value, expected):
                raise InputError(f"toy config field {f.name} has the wrong type ({value!r})")
        return config.validate(check_memory=check_memory)


_OPTIONAL = {"num_decoder_layers", "heads_per_layer", "mlp_width", "additive_width"}
_FIELD_TYPES: dict[str, type | tuple[type, ...]] = {
    "architecture": str,
    "attention": str,
    "dropout": (int, float),
    "absolute_positions": bool,
    "heads_per_layer": dict,
    **{
        name: int
        for name in [
            "vocab_size",
            "max_positions",
            "width",
            "num_heads",
            "num_layers",
            "num_decoder_layers",
            "mlp_width",
            "window",
            "stride",
            "global_tokens",
            "block_size",
            "random_blocks",
            "max_relative_position",
            "additive_width",
            "num_features",
            "seed",
        ]
    },
}


#: the sizes a configuration may be too large in, in the order they are blamed when several are
_SIZE_FIELDS = (
    "width",
    "num_layers",
    "num_decoder_layers",
    "mlp_width",
    "vocab_size",
    "max_positions",
    "num_features",
    "additive_width",
    "max_relative_position",
)
#: float32 weights
BYTES_PER_PARAMETER = 4


def require_weights_memory(config: ToyConfig, copies: int = 1) -> None:
    """Refuse a configuration whose weights (``copies`` of them: 4 while training with AdamW) cannot fit in memory,
    naming the size that makes it so, before anything is built (a toy checkpoint's marker is read before its weights)."""
    needed = config.parameter_estimate() * BYTES_PER_PARAMETER * copies
    if needed <= (available_memory() or needed):
        return
    default = ToyConfig(architecture=config.architecture)
    # the field whose default value would shrink the model most is the one to blame
    blamed = max(
        (name for name in _SIZE_FIELDS if getattr(config, name) is not None),
        key=lambda name: needed - replace(config, **{name: getattr(default, name)}).parameter_estimate(),
    )
    require_memory(blamed, getattr(config, blamed), needed, "the weights of this toy model")


def _is_type(value: Any, expected: type | tuple[type, ...]) -> bool:
    if expected is int or expected == (int, float):
        return isinstance(value, expected) and not isinstance(value, bool)
    return isinstance(value, expected)


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise InputError(message)


__all__ = ["ARCHITECTURES", "VARIANT_NAMES", "ToyConfig", "require_weights_memory"]
