"""Options of ``attnviz stats`` alone: the threshold preset and overrides, the statistic to sort and colour by.

The closed sets come from the library's light modules (:mod:`attnviz.stats.definitions`,
:mod:`attnviz.stats.thresholds`), so the CLI starts without importing torch.
"""

from __future__ import annotations

from attnviz.cli.options import VIEW_PANEL, choice_enum, choice_option, option
from attnviz.stats.definitions import STATISTIC_NAMES
from attnviz.stats.thresholds import PRESET_ALIASES, PRESETS

DETECT_PANEL = "Detection thresholds (override the preset)"
STATS_PANEL = "Statistics"

Statistic = choice_enum("Statistic", STATISTIC_NAMES)
Preset = choice_enum("Preset", PRESETS)

PresetOption = choice_option(
    Preset,
    "--preset",
    "threshold preset",
    help="Threshold set: normalized (entropy divided by its largest value, so flags mean the same at any "
    "length; default) or absolute (fixed limits: collapsed if mean entropy < 1.0 nats, unfocused if mean "
    "max weight < 0.3; these depend on the text length). Example: --preset absolute",
    panel=STATS_PANEL,
    aliases=PRESET_ALIASES,
)

SortStatisticOption = choice_option(
    Statistic,
    "--sort",
    "statistic",
    metavar="<statistic>",
    help=f"Sort the table by a statistic, largest first: {', '.join(STATISTIC_NAMES)}. Example: --sort entropy",
    panel=VIEW_PANEL,
    show_default=False,
    optional=True,
)

ColorByOption = choice_option(
    Statistic,
    "--color-by",
    "statistic",
    metavar="<statistic>",
    help=f"Statistic that colours the layer × head overview: {', '.join(STATISTIC_NAMES)}. "
    "Example: --color-by first_token",
    panel=VIEW_PANEL,
)

LocalWindowOption = option(
    int,
    "--local-window",
    "-w",
    min=0,
    help="w of local_ratio: mass within ±w positions. Example: -w 3",
    panel=STATS_PANEL,
)

FlaggedOnlyOption = option(
    bool,
    "--flagged-only",
    help="List only heads with a flag. Example: --flagged-only --sort max_weight",
    panel=VIEW_PANEL,
)


def _threshold(flag: str, help_text: str):
    return option(float | None, flag, help=help_text, panel=DETECT_PANEL, show_default=False)


CollapsedMaxWeight = _threshold(
    "--collapsed-max-weight",
    "collapsed if mean max weight ≥ this (normalized 0.9; absolute: off). Example: --collapsed-max-weight 0.85",
)
CollapsedNormalizedEntropy = _threshold(
    "--collapsed-normalized-entropy",
    "collapsed if mean normalized entropy < this (normalized 0.1; absolute: off). "
    "Example: --collapsed-normalized-entropy 0.15",
)
CollapsedEntropy = _threshold(
    "--collapsed-entropy",
    "collapsed if mean entropy < this many nats (absolute 1.0; normalized: off). Example: --collapsed-entropy 0.5",
)
UnfocusedNormalizedEntropy = _threshold(
    "--unfocused-normalized-entropy",
    "unfocused needs mean normalized entropy ≥ this (normalized 0.9; absolute: off). "
    "Example: --unfocused-normalized-entropy 0.95",
)
UnfocusedMaxWeight = _threshold(
    "--unfocused-max-weight",
    "unfocused needs mean max weight < this (normalized 0.5; absolute 0.3). Example: --unfocused-max-weight 0.4",
)
DiagonalMin = _threshold(
    "--diagonal-min", "diagonal if mean weight on the own position ≥ this (0.5). Example: --diagonal-min 0.6"
)
PreviousTokenMin = _threshold(
    "--previous-token-min",
    "previous-token if mean weight on the previous token ≥ this (0.5). Example: --previous-token-min 0.6",
)
FirstTokenMin = _threshold(
    "--first-token-min",
    "first-token-sink if mean weight on the first token ≥ this (0.5). Example: --first-token-min 0.7",
)
SpecialTokensMin = _threshold(
    "--special-tokens-min",
    "special-token if mean weight on special tokens ≥ this (0.5). Example: --special-tokens-min 0.6",
)
LocalRatioMin = _threshold(
    "--local-ratio-min", "local if mean weight within ±w positions ≥ this (0.8). Example: --local-ratio-min 0.9"
)

ByPositionOption = option(
    bool,
    "--by-position",
    help="Also measure each head along the input: sink mass, entropy, mean distance and the share on the "
    "16 most recent tokens, per bucket of query positions; in --json (by_position), a long CSV next to --csv "
    "(NAME.by-position.csv) and a figure next to --plot (NAME.by-position.png). Example: --by-position",
    panel=STATS_PANEL,
)

BucketSizeOption = option(
    int | None,
    "--bucket-size",
    help="Query positions per --by-position bucket (at least 1; larger than the input: one bucket). "
    "Default: the smallest power of two ≥ 16 giving at most 32 buckets over the longest text "
    "(256 at 8,192 tokens). Needs --by-position. Example: --bucket-size 128",
    panel=STATS_PANEL,
    show_default=False,
)
