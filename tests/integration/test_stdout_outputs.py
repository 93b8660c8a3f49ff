"""``attnviz stats --json -`` and ``--csv -`` write the document to stdout; tables stay on stderr."""

from __future__ import annotations

import csv
import io
import json

from cli_helpers import assert_clean_error, run_cli

from attnviz.stats import compute_statistics

TEXTS = ["The cat sat on the mat.", "Bees can dance."]


def test_json_and_csv_to_stdout(minilm, capsys, tmp_path):
    args = ["stats", "minilm", "--text", TEXTS[0], "--text", TEXTS[1]]
    result = run_cli(capsys, *args, "--json", "-", "--plot", str(tmp_path / "p.png"))
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)  # nothing but the document on stdout
    stats = compute_statistics(minilm, TEXTS, progress=False)
    head = record["heads"][13]  # layer 1, head 1
    assert (head["layer"], head["head"]) == (1, 1)
    assert abs(head["entropy"] - float(stats.matrix("entropy")[1, 1])) < 1e-5
    assert "wrote" in result.stderr and "p.png" in result.stderr

    result = run_cli(capsys, *args, "--csv", "-", "--no-table")
    assert result.exit_code == 0, result.stderr
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert len(rows) == 72 and rows[13]["layer"] == "1" and rows[13]["head"] == "1"
    assert abs(float(rows[13]["max_weight"]) - float(stats.matrix("max_weight")[1, 1])) < 1e-5

    assert_clean_error(run_cli(capsys, *args, "--json", "-", "--csv", "-"), "only one of --json and --csv")
