"""``attnviz samples``: the shipped sample files, copied where the documented examples expect them."""

from __future__ import annotations

import filecmp

from cli_helpers import run_cli

from attnviz.common.texts import read_examples
from attnviz.heads.alignment import read_alignment_pairs
from attnviz.outputs.samples import copy_samples, shipped_samples


def test_samples_copies_every_shipped_file_unchanged(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = run_cli(capsys, "samples")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == "sample_data"
    copied = tmp_path / "sample_data"
    source = shipped_samples()
    names = sorted(str(p.relative_to(source)) for p in source.rglob("*") if p.is_file() and p.suffix != ".pyc")
    assert sorted(str(p.relative_to(copied)) for p in copied.rglob("*") if p.is_file()) == names
    _, mismatched, errors = filecmp.cmpfiles(source, copied, names, shallow=False)
    assert mismatched == [] and errors == []
    # a second run finds its own copy and changes nothing
    again = run_cli(capsys, "samples")
    assert again.exit_code == 0 and "already holds" in again.stderr


def test_samples_never_replaces_a_folder_of_the_users(tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my own notes\n", encoding="utf-8")
    result = run_cli(capsys, "samples", mine)
    assert result.exit_code != 0
    assert len(result.error_lines()) == 1 and "not an empty folder" in result.error_lines()[0]
    assert (mine / "notes.txt").read_text(encoding="utf-8") == "my own notes\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]  # no temporary left behind


def test_a_source_checkouts_sample_data_link_is_taken_as_it_is(tmp_path):
    link = tmp_path / "sample_data"
    link.symlink_to(shipped_samples(), target_is_directory=True)
    assert copy_samples(link) == (link, False)


def test_the_sample_inputs_read_as_the_commands_read_them():
    folder = shipped_samples()
    reviews = read_examples(folder / "reviews.jsonl")
    assert len(reviews) == 10 and all(len(text.split()) >= 5 for text in reviews)
    assert len(read_examples(folder / "notes.txt")) == 12
    assert len(read_examples(folder / "heldout.txt")) == 8
    # the alignment pairs: digit sequences and their reversals, gold = the anti-diagonal (what toy-reverse learned)
    pairs = read_alignment_pairs(folder / "pairs.jsonl")
    assert len(pairs) == 24
    for pair in pairs:
        source, target = pair.source.split(), pair.target.split()
        assert target == source[::-1]
        n = len(source)
        assert pair.gold.sure == pair.gold.possible == frozenset((i, n - 1 - i) for i in range(n))


def test_samples_follows_a_link_of_the_users_and_never_replaces_it(tmp_path, capsys):
    """A dangling link gets the samples at its target; a link to an empty folder fills that folder; the links stay."""
    dangling = tmp_path / "s"
    dangling.symlink_to("nowhere")
    result = run_cli(capsys, "samples", dangling)
    assert result.exit_code == 0, result.stderr
    assert dangling.is_symlink() and dangling.readlink() == type(dangling)("nowhere")
    assert read_examples(tmp_path / "nowhere" / "notes.txt") == read_examples(shipped_samples() / "notes.txt")

    (tmp_path / "empty").mkdir()
    to_folder = tmp_path / "to-folder"
    to_folder.symlink_to(tmp_path / "empty", target_is_directory=True)
    assert run_cli(capsys, "samples", to_folder).exit_code == 0
    assert to_folder.is_symlink() and (tmp_path / "empty" / "notes.txt").is_file()

    lost = tmp_path / "lost"
    lost.symlink_to(tmp_path / "missing-folder" / "samples")
    refused = run_cli(capsys, "samples", lost)
    assert refused.exit_code != 0 and len(refused.error_lines()) == 1
    assert "symbolic link" in refused.error_lines()[0] and "does not exist" in refused.error_lines()[0]
    assert lost.is_symlink() and not (tmp_path / "missing-folder").exists()
