"""Shared pieces of the bad-input suite: a workspace of damaged inputs, snapshots, and a full disk."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import pickle
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TOY = REPO / "sample_data" / "toy" / "previous-token"  # a small decoder toy checkpoint
MARKER_NAME = "CODE-RAN"  # a file that exists only if foreign code ran


# -- snapshots ----------------------------------------------------------------------------------------


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under ``root`` (hidden ones too): its mode and a content digest (links: their target)."""
    state = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            info = path.lstat()
            key = str(path.relative_to(root))
            if path.is_symlink():
                state[key] = ("link", os.readlink(path))
            elif path.is_dir():
                state[key] = ("dir", info.st_mode)
            else:
                state[key] = ("file", info.st_mode, _digest(path, info))
    return state


_digests: dict[tuple, str] = {}


def _digest(path: Path, info: os.stat_result) -> str:
    # Big weight files are hashed once per (inode, size, mtime): any rewrite changes one of those.
    key = (info.st_ino, info.st_size, info.st_mtime_ns)
    if info.st_size < 2_000_000 or key not in _digests:
        _digests[key] = hashlib.sha256(path.read_bytes()).hexdigest()
    return _digests[key]


def changes(before: dict, after: dict) -> list[str]:
    changed = [f"changed: {k}" for k in before if k in after and before[k] != after[k]]
    removed = [f"removed: {k}" for k in before if k not in after]
    added = [f"new: {k}" for k in after if k not in before]
    return changed + removed + added


# -- the workspace ------------------------------------------------------------------------------------


def build_workspace(root: Path, minilm_dir: Path) -> None:
    """Damaged models, damaged captures, data files and a toy checkpoint, all inside ``root``."""
    import torch
    from safetensors.torch import load_file, save_file

    root.mkdir(parents=True, exist_ok=True)
    shutil.copytree(TOY, root / "toy")
    (root / "toylink").symlink_to(root / "toy")
    (root / "data.txt").write_text("The cat sat on the mat.\nA dog barked.\n")
    (root / "data.jsonl").write_text('{"text": "The cat sat."}\n')
    (root / "empty.txt").write_text("\n\n")
    (root / "bad.jsonl").write_text('{"txt": "no text field"}\n')
    (root / "surrogate.jsonl").write_text('{"text": "\\ud800 a lone surrogate"}\n')  # a JSON escape of no text
    (root / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    (root / "adir").mkdir()
    (root / "dir.png").mkdir()
    (root / "adir" / "keep.txt").write_text("keep")
    (root / "old.json").write_text('{"earlier": "output"}\n')
    (root / "cache").mkdir()

    def model_copy(name: str) -> Path:
        # Hard links: the copies cost no space; a test that rewrote one would change its inode.
        target = root / name
        shutil.copytree(minilm_dir, target, copy_function=os.link)
        return target

    weights = minilm_dir / "model.safetensors"
    model_copy("mini")
    raw = weights.read_bytes()
    for name, content in (
        ("m_trunc", raw[: len(raw) // 2]),
        ("m_header", b"\x10\x00" + b"\xff" * 64),
        ("m_empty", b""),
    ):
        path = model_copy(name) / "model.safetensors"
        path.unlink()
        path.write_bytes(content)
    state = load_file(str(weights))
    for name, tensors in (
        ("m_foreign", {"unrelated.weight": torch.zeros(3)}),
        ("m_nolayer5", {k: v for k, v in state.items() if ".layer.5." not in k}),
        ("m_extra", {**state, "extra.weight": torch.zeros(2)}),
    ):
        path = model_copy(name) / "model.safetensors"
        path.unlink()
        save_file(tensors, str(path))
    remote = model_copy("m_remote")
    config = json.loads((remote / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModel": "evil.EvilModel"}
    (remote / "config.json").unlink()
    (remote / "config.json").write_text(json.dumps(config))
    (remote / "evil.py").write_text(f"import pathlib\npathlib.Path({str(root / MARKER_NAME)!r}).write_text('ran')\n")
    pickled = model_copy("m_pickle")
    (pickled / "model.safetensors").unlink()
    (pickled / "pytorch_model.bin").write_bytes(malicious_pickle(root / MARKER_NAME))
    for name, file, content in (("m_tok", "tokenizer.json", "{not json"), ("m_cfg", "config.json", "{bad")):
        path = model_copy(name) / file
        path.unlink()
        path.write_text(content)
    _models_that_disagree(root, model_copy, state)
    _damaged_captures(root)
    _damaged_toys_and_reports(root)


def _models_that_disagree(root: Path, model_copy, state: dict) -> None:
    """A config asking for 10⁸ layers, weights holding NaN, tokenizers past the embedding table."""
    import torch
    from safetensors.torch import save_file

    def rewrite_config(folder: Path, **fields) -> None:
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").unlink()
        (folder / "config.json").write_text(json.dumps({**config, **fields}))

    rewrite_config(model_copy("m_layers"), num_hidden_layers=100_000_000)
    query = "encoder.layer.0.attention.self.query.weight"
    nan = model_copy("m_nan") / "model.safetensors"
    nan.unlink()
    save_file({**state, query: torch.full_like(state[query], float("nan"))}, str(nan))
    small = model_copy("m_vocab")
    (small / "model.safetensors").unlink()
    embeddings = "embeddings.word_embeddings.weight"
    save_file({**state, embeddings: state[embeddings][:1000].clone()}, str(small / "model.safetensors"))
    rewrite_config(small, vocab_size=1000)
    # as many tokens as rows, but one id far past the table (a vocabulary whose ids skip numbers)
    sparse = model_copy("m_sparse_ids")
    tokenizer = json.loads((sparse / "tokenizer.json").read_text())
    tokenizer["model"]["vocab"]["cat"] = 500_000
    (sparse / "tokenizer.json").unlink()
    (sparse / "tokenizer.json").write_text(json.dumps(tokenizer))


def _damaged_toys_and_reports(root: Path) -> None:
    """Toy checkpoints whose marker disagrees with their weights, and prune reports that do not fit."""
    for name, section, field, value in (
        ("t_width", "config", "width", 1_000_000_000),
        ("t_wider", "config", "width", 128),
        ("t_task", "task", "max_length", 1_000_000_000),
    ):
        shutil.copytree(TOY, root / name)
        marker = root / name / "attnviz-toy.json"
        document = json.loads(marker.read_text())
        document[section][field] = value
        document.pop("weights_sha256", None)
        marker.unlink()
        marker.write_text(json.dumps(document))
    importance = [{"stack": "self", "layer": 0, "head": h, "score": 0.5} for h in range(4)]
    report = {"format": "attnviz-prune-report", "version": 1, "model": "toy", "output": "p", "importance": importance}
    for name, changes in (
        ("pr_other.json", {"model": "toy-induction", "output": "pruned-induction"}),
        ("pr_nan.json", {"importance": [{**importance[0], "score": float("nan")}]}),
        ("pr_text.json", {"importance": [{**importance[0], "score": "high"}]}),
        ("pr_range.json", {"importance": [{**importance[0], "layer": 9}]}),
    ):
        (root / name).write_text(json.dumps({**report, **changes}))


class _Plant:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def malicious_pickle(marker: Path) -> bytes:
    """A pickle that would create ``marker`` if it were unpickled."""
    return pickle.dumps({"embeddings.word_embeddings.weight": _Plant(marker)})


def _damaged_captures(root: Path) -> None:
    """good.safetensors (a real toy capture) and damaged variants of it."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    from attnviz.captures.attention_capture import capture
    from attnviz.models.specs import load_model

    good = capture(load_model(str(TOY), device="cpu"), "a b c d")
    good.save(root / "good.safetensors")
    with safe_open(str(root / "good.safetensors"), "pt") as handle:
        metadata = handle.metadata()
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118

    def variant(name: str, new_tensors: dict | None = None, **fields) -> None:
        meta = {**metadata, **{k: v for k, v in fields.items() if v is not None}}
        for key in [k for k, v in fields.items() if v is None]:
            meta.pop(key, None)
        save_file(new_tensors if new_tensors is not None else tensors, str(root / f"{name}.safetensors"), metadata=meta)

    first = min(tensors)
    variant("c_tokens3", tokens=json.dumps(["a", "b", "c"]))
    variant("c_tokstr", tokens=json.dumps("abc"))
    variant("c_1d", {**tensors, first: torch.rand(5)})
    variant("c_nan", {**tensors, first: tensors[first] * float("nan")})
    variant("c_gap", {**tensors, first.replace(".0", ".5"): tensors[first].clone()})
    variant("c_name", {**tensors, "sideways.0": torch.zeros(1, 5, 5)})
    variant("c_causal", causal='"yes"')
    variant("c_words", word_ids=json.dumps(["x"]))
    variant("c_notjson", special="[")
    variant("c_notokens", tokens=None)
    variant("c_version", version="99")
    variant("c_format", format="something-else")
    (root / "c_garbage.safetensors").write_bytes(b"\x00" * 100)


# -- a full disk --------------------------------------------------------------------------------------


class FullFile(io.RawIOBase):
    """A writable file on a full disk: a few bytes go through, then ENOSPC."""

    def __init__(self, real):
        self.real = real
        self.budget = 16

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        if self.budget <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        taken = bytes(data[: self.budget])
        self.budget -= len(taken)
        self.real.write(taken)
        return len(taken)

    def close(self) -> None:
        self.real.close()
        super().close()

    def __getattr__(self, name):
        return getattr(self.real, name)


def fill_disk(monkeypatch, root: Path) -> None:
    """Make every write under ``root`` fail with ENOSPC, as a full disk would (Python files and safetensors)."""
    import builtins

    import safetensors.torch
    import transformers.modeling_utils
    from safetensors import SafetensorError

    real_open = io.open

    def full_open(file, mode="r", *args, **kwargs):
        inside = isinstance(file, str | os.PathLike) and str(Path(file).resolve()).startswith(str(root.resolve()))
        if not inside or not any(flag in mode for flag in "wax+"):
            return real_open(file, mode, *args, **kwargs)
        raw = FullFile(real_open(file, mode.replace("t", "").replace("b", "") + "b"))
        if "b" in mode:
            return raw
        encoding = kwargs.get("encoding") or "utf-8"
        return io.TextIOWrapper(io.BufferedWriter(raw), encoding=encoding, newline=kwargs.get("newline"))

    def full_save_file(tensors, filename, metadata=None):
        with real_open(filename, "wb") as handle:  # the part that fitted before the disk filled up
            handle.write(b"\x00" * 8)
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(builtins, "open", full_open)
    monkeypatch.setattr(io, "open", full_open)
    monkeypatch.setattr(safetensors.torch, "save_file", full_save_file)
    if hasattr(transformers.modeling_utils, "safe_save_file"):
        monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", full_save_file)
