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

from attnviz.common.lazy import exports_by_module, lazy_exports

if TYPE_CHECKING:  # for type checkers and IDEs; at run time each name is imported on first use
    from attnviz.stats.accumulator import StatisticsAccumulator as StatisticsAccumulator
    from attnviz.stats.compute import compute_statistics as compute_statistics
    from attnviz.stats.definitions import STATISTIC_NAMES as STATISTIC_NAMES
    from attnviz.stats.definitions import STATISTICS as STATISTICS
    from attnviz.stats.definitions import Statistic as Statistic
    from attnviz.stats.detect import FLAGS as FLAGS
    from attnviz.stats.detect import PROBLEM_FLAGS as PROBLEM_FLAGS
    from attnviz.stats.detect import Detection as Detection
    from attnviz.stats.detect import detect_heads as detect_heads
    from attnviz.stats.export import stats_record as stats_record
    from attnviz.stats.export import write_csv as write_csv
    from attnviz.stats.export import write_json as write_json
    from attnviz.stats.result import HeadStatistics as HeadStatistics
    from attnviz.stats.result import SiteStatistics as SiteStatistics
    from attnviz.stats.row_values import block_statistics as block_statistics
    from attnviz.stats.thresholds import PRESETS as PRESETS
    from attnviz.stats.thresholds import Thresholds as Thresholds
    from attnviz.stats.thresholds import preset_thresholds as preset_thresholds

#: public name -> module that defines it
_EXPORTS = exports_by_module(
    {
        "attnviz.stats.accumulator": ("StatisticsAccumulator",),
        "attnviz.stats.compute": ("compute_statistics",),
        "attnviz.stats.definitions": ("STATISTICS", "STATISTIC_NAMES", "Statistic"),
        "attnviz.stats.detect": ("FLAGS", "PROBLEM_FLAGS", "Detection", "detect_heads"),
        "attnviz.stats.export": ("stats_record", "write_csv", "write_json"),
        "attnviz.stats.result": ("HeadStatistics", "SiteStatistics"),
        "attnviz.stats.row_values": ("block_statistics",),
        "attnviz.stats.thresholds": ("PRESETS", "Thresholds", "preset_thresholds"),
    }
)

__all__ = list(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
