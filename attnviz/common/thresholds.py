"""Threshold sets: frozen dataclasses of numbers (or ``None`` to turn a criterion off), checked and overridable.

Head detection (:class:`attnviz.stats.thresholds.Thresholds`) and head-function labels
(:class:`attnviz.heads.labels.FunctionThresholds`) are both such sets; this base class holds what
they share: the range check of every field, :meth:`ThresholdSet.to_dict` and :meth:`ThresholdSet.override`.
"""

from __future__ import annotations

import math
import sys
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

if sys.version_info >= (3, 11):
    from typing import Self
else:  # pragma: no cover
    from typing_extensions import Self

from attnviz.common.errors import InputError, ParameterError


@dataclass(frozen=True)
class ThresholdSet:
    """Base of every threshold dataclass. Each field is a number in :meth:`bounds` or ``None`` (off)."""

    def bounds(self, name: str) -> tuple[float, float, str]:
        """``(low, high, unit)`` allowed for field ``name``; fractions of attention by default."""
        return 0.0, 1.0, ""

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if value is None:
                continue
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                raise ParameterError(item.name, f"threshold {{{item.name}}} must be a number, got {value!r}", value)
            low, high, unit = self.bounds(item.name)
            if not low <= value <= high:
                span = f"≥ {low:g}" if math.isinf(high) else f"between {low:g} and {high:g}"
                raise ParameterError(item.name, f"threshold {{{item.name}}}{unit} must be {span}, got {value}", value)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def override(self, **values: float | None) -> Self:
        """A copy with the given (non-None) fields replaced; checks ranges."""
        unknown = set(values) - {item.name for item in fields(self)}
        if unknown:
            raise InputError(f"unknown threshold(s): {', '.join(sorted(unknown))}")
        return replace(self, **{name: value for name, value in values.items() if value is not None})
