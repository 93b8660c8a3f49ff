"""Per-head attention statistics over a corpus, computed while the model runs, and head detection.

Typical use::

    from attnviz.models.specs import load_model
    from attnviz.stats import compute_statistics, detect_heads

    loaded = load_model("smollm2")
    stats = compute_statistics(loaded, ["The cat sat on the mat.", "It was tired."])
    stats.matrix("first_token")          # [layer, head]
    detection = detect_heads(stats)      # default: the "normalized" thresholds
"""

from attnviz.stats.accumulator import StatisticsAccumulator, block_statistics
from attnviz.stats.compute import compute_statistics
from attnviz.stats.definitions import STATISTIC_NAMES, STATISTICS, Statistic
from attnviz.stats.detect import FLAGS, PRESETS, PROBLEM_FLAGS, Detection, Thresholds, detect_heads, preset_thresholds
from attnviz.stats.export import stats_record, write_csv, write_json
from attnviz.stats.result import HeadStatistics, SiteStatistics

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
