"""Per-head attention statistics over a corpus, computed while the model runs, and head detection.

Typical use::

    from attnviz.models.specs import load_model
    from attnviz.stats import compute_statistics, detect_heads

    loaded = load_model("smollm2")
    stats = compute_statistics(loaded, ["The cat sat on the mat.", "It was tired."])
    stats.matrix("first_token")          # [layer, head]
    detection = detect_heads(stats)      # default: the "normalized" thresholds
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnviz.common.lazy import lazy_exports

if TYPE_CHECKING:  # for type checkers and IDEs; at run time each name is imported on first use
    from attnviz.stats.accumulator import StatisticsAccumulator
    from attnviz.stats.compute import compute_statistics
    from attnviz.stats.definitions import STATISTIC_NAMES, STATISTICS, Statistic
    from attnviz.stats.detect import FLAGS, PROBLEM_FLAGS, Detection, detect_heads
    from attnviz.stats.export import stats_record, write_csv, write_json
    from attnviz.stats.result import HeadStatistics, SiteStatistics
    from attnviz.stats.row_values import block_statistics
    from attnviz.stats.thresholds import PRESETS, Thresholds, preset_thresholds

#: public name -> module that defines it
_EXPORTS = {
    "FLAGS": "attnviz.stats.detect",
    "PRESETS": "attnviz.stats.thresholds",
    "PROBLEM_FLAGS": "attnviz.stats.detect",
    "STATISTICS": "attnviz.stats.definitions",
    "STATISTIC_NAMES": "attnviz.stats.definitions",
    "Detection": "attnviz.stats.detect",
    "HeadStatistics": "attnviz.stats.result",
    "SiteStatistics": "attnviz.stats.result",
    "Statistic": "attnviz.stats.definitions",
    "StatisticsAccumulator": "attnviz.stats.accumulator",
    "Thresholds": "attnviz.stats.thresholds",
    "block_statistics": "attnviz.stats.row_values",
    "compute_statistics": "attnviz.stats.compute",
    "detect_heads": "attnviz.stats.detect",
    "preset_thresholds": "attnviz.stats.thresholds",
    "stats_record": "attnviz.stats.export",
    "write_csv": "attnviz.stats.export",
    "write_json": "attnviz.stats.export",
}

__all__ = [
    "FLAGS",
    "PRESETS",
    "PROBLEM_FLAGS",
    "STATISTICS",
    "STATISTIC_NAMES",
    "Detection",
    "HeadStatistics",
    "SiteStatistics",
    "Statistic",
    "StatisticsAccumulator",
    "Thresholds",
    "block_statistics",
    "compute_statistics",
    "detect_heads",
    "preset_thresholds",
    "stats_record",
    "write_csv",
    "write_json",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
