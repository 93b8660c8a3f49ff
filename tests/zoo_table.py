"""``python tests/zoo_table.py RESULTS.jsonl``: the outcome of every zoo family as a Markdown table (for the notes).

RESULTS is what ``ZOO_RESULTS=RESULTS.jsonl pytest tests/integration/test_zoo.py`` wrote: one JSON line per family.
"""

from __future__ import annotations

import json
import sys

CHECKS = ("build", "load", "patterns", "outputs", "statistics", "patching", "norm")


def verdict(results: dict) -> str:
    """exact / refused / wrong / crash: the worst outcome among a family's checks."""
    outcomes = [results.get(c, "") for c in CHECKS if c in results]
    for word in ("crash", "wrong", "refused"):
        if any(o.startswith(word) for o in outcomes):
            return word
    return "exact"


def main(path: str) -> None:
    with open(path) as lines:
        rows = [json.loads(line) for line in lines]
    rows.sort(key=lambda r: r["family"])
    counts: dict[str, int] = {}
    for row in rows:
        counts[verdict(row)] = counts.get(verdict(row), 0) + 1
    print(", ".join(f"{n} {k}" for k, n in sorted(counts.items())) + f" ({len(rows)} families)\n")
    print("| family | verdict | " + " | ".join(CHECKS) + " |")
    print("|---" * (len(CHECKS) + 2) + "|")
    for row in rows:
        cells = [row.get(c, "–").replace("|", "/")[:140] for c in CHECKS]
        print(f"| {row['family']} | {verdict(row)} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1])
