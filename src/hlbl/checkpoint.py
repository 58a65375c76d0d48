"""Run directories and checkpoints: safetensors for tensors, JSON for everything else, no pickle.

A run directory holds::

    run.json             format, version, model config, training config, corpus spec (the recipe)
    vocab.json           words and training counts
    tree.json            the word tree (tree output), or the word classes (classes output)
    checkpoints/epoch-NNNNNN/   the newest complete checkpoint (what --resume continues from):
        optimizer.safetensors, last.safetensors, best.safetensors, metrics.jsonl, state.json
    best.safetensors     weights with the best validation perplexity so far  } copies of the newest
    last.safetensors     weights after the last finished epoch               } checkpoint's files,
    state.json           epoch, phase, learning rate, best perplexity, ...   } for readers (eval,
    metrics.jsonl        one JSON line per finished epoch                    } predict, ...)

``run.json`` is written last of the first three, before training starts, and is the recipe a
resume uses. A checkpoint is one atomic commit: its files are written and flushed (fsync) in a
fresh ``checkpoints/.partial-*`` directory, which is synced and then renamed to
``checkpoints/epoch-NNNNNN``; a crash at any point (kill -9, power loss) leaves either the new
checkpoint whole or none of it, and the previous one is removed only after the new one is durable.
Leftovers of an interrupted write are removed at resume. The top-level copies are replaced one by
one after the commit (hard links for the weights); resume never reads them.

Each file carries a format name and version: weights files ``{"format": "hlbl-weights",
"version": "1"}`` in their safetensors metadata (``hlbl-optimizer`` for the optimiser), the JSON
files ``"format"`` / ``"version"`` keys (``hlbl-run``, ``hlbl-vocab``, ``hlbl-train-state``,
``hlbl-word-tree``). Safetensors files also hold a SHA-256 of their tensors, and weights files the
vocabulary size and fingerprint and the tree's fingerprint. Every JSON file is checked field by
field. Anything else (a foreign, truncated or damaged file, weights of another tree or
vocabulary, a value of the wrong type) raises :class:`CheckpointError` with one line naming the
file and field (:class:`hlbl.data.DataError` for the vocabulary).
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import re
import shutil
from dataclasses import fields
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from . import atomic
from .data import DataError, Vocab
from .errors import CheckpointError
from .model import LBL, LBLConfig
from .output import takes_structure, takes_tree
from .classes import WordClasses
from .tree import TreeError, WordTree

RUN_FORMAT = "hlbl-run"
WEIGHTS_FORMAT = "hlbl-weights"
STATE_FORMAT = "hlbl-train-state"
FORMAT_VERSION = 1


def write_json(path: Path, obj: Any) -> None:
    atomic.write_text(path, json.dumps(obj, indent=1))


def read_json(path: Path, what: str) -> Any:
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing ({what})") from None
    except OSError as e:  # present but unreadable (permissions, a directory, an I/O error): not "missing"
        raise CheckpointError(f"{path}: cannot read {what} ({e.strerror or e})") from None
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise CheckpointError(
            f"{path}: damaged {what} (not UTF-8: byte 0x{data[e.start]:02x} at offset {e.start})"
        ) from None
    except (json.JSONDecodeError, RecursionError) as e:
        raise CheckpointError(f"{path}: damaged {what} ({e})") from None


def _show(value: Any) -> str:
    """A short rendering of a bad JSON value for an error message."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_field(path: Path, name: str, value: Any, kind: str) -> None:
    """Raise CheckpointError naming ``path`` and field ``name`` unless ``value`` is a ``kind``:
    ``int`` (a whole number, not a bool), ``float`` (a finite number), ``bool``, ``str``, ``dict``,
    ``list``, ``X | None``, or ``positive`` / ``nonneg`` (finite numbers > 0 / >= 0)."""
    if kind.endswith(" | None"):
        if value is None:
            return
        kind = kind[: -len(" | None")]
    ok = {
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "float": lambda v: _is_number(v) and math.isfinite(v),
        "positive": lambda v: _is_number(v) and math.isfinite(v) and v > 0,
        "nonneg": lambda v: _is_number(v) and math.isfinite(v) and v >= 0,
        "bool": lambda v: isinstance(v, bool),
        "str": lambda v: isinstance(v, str),
        "dict": lambda v: isinstance(v, dict),
        "list": lambda v: isinstance(v, list),
    }.get(kind)
    if ok is not None and not ok(value):
        want = {
            "int": "a whole number",
            "float": "a finite number",
            "positive": "a finite number > 0",
            "nonneg": "a finite number >= 0",
            "bool": "true or false",
            "str": "a string",
            "dict": "a JSON object",
            "list": "a JSON list",
        }[kind]
        raise CheckpointError(f"{path}: field {name!r} must be {want}, not {_show(value)}")


def check_dataclass_fields(path: Path, section: str, obj: Any, cls) -> None:
    """Check the JSON values of a dataclass's fields (as :func:`dataclasses.asdict` wrote them)
    against the fields' annotated types, so that a hand-edited ``"lr": "x"`` or ``NaN`` is one
    line naming the field rather than an error deep inside training."""
    check_field(path, section, obj, "dict")
    for f in fields(cls):
        if f.name in obj:
            check_field(path, f"{section}.{f.name}", obj[f.name], str(f.type))


def _digest(tensors: dict[str, torch.Tensor]) -> str:
    """SHA-256 over names, dtypes, shapes and bytes: safetensors itself has no checksum, so a
    flipped data byte would otherwise load as a plausible number."""
    h = hashlib.sha256()
    for k in sorted(tensors):
        v = tensors[k]
        h.update(f"{k}:{v.dtype}:{tuple(v.shape)};".encode())
        if v.numel():
            h.update(v.contiguous().reshape(-1).view(torch.uint8).numpy())  # the buffer itself, no copy
    return h.hexdigest()


def save_tensors(
    path: Path, tensors: dict[str, torch.Tensor], kind: str = WEIGHTS_FORMAT, meta: dict[str, str] | None = None
) -> None:
    """Write an hlbl safetensors file atomically (disk full and the like: CheckpointError)."""
    try:
        with atomic.atomic_path(path) as tmp:
            write_tensors(tmp, tensors, kind, meta)
    except OSError as e:
        raise CheckpointError(f"cannot write {path}: {write_error(e)}") from None


def write_error(e: BaseException) -> str:
    """The reason of a failed write, in words: the OS's message, also from inside a SafetensorError."""
    if isinstance(e, OSError):
        text = e.strerror or str(e)
        code = e.errno
    else:
        found = re.search(r'message: "([^"]*)"', str(e))
        text = found.group(1) if found else (str(e).splitlines() or [type(e).__name__])[0]
        found = re.search(r"code: (\d+)", str(e))
        code = int(found.group(1)) if found else None
    hint = {28: " (the disk is full)", 27: " (a file-size limit, e.g. ulimit -f)", 122: " (a disk quota)"}.get(code, "")
    return text + hint


def write_tensors(
    path: str | os.PathLike,
    tensors: dict[str, torch.Tensor],
    kind: str = WEIGHTS_FORMAT,
    meta: dict[str, str] | None = None,
) -> None:
    """Write an hlbl safetensors file at ``path`` as it is (the caller makes it atomic); OSError
    for a failed write (safetensors' own error carries the OS's)."""
    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    meta = {"format": kind, "version": str(FORMAT_VERSION), **(meta or {}), "sha256": _digest(tensors)}
    try:
        save_file(tensors, str(path), metadata=meta)
    except SafetensorError as e:
        found = re.search(r"code: (\d+)", str(e))
        message = re.search(r'message: "([^"]*)"', str(e))
        raise OSError(int(found.group(1)) if found else errno.EIO, message.group(1) if message else str(e)) from None
    _sort_metadata(str(path))


def _sort_metadata(path: str) -> None:
    """Rewrite a just-written safetensors header with its metadata keys in sorted order.

    safetensors writes ``__metadata__`` from a Rust HashMap whose order changes from one save to
    the next (upstream issue safetensors#584), so two runs with the same seed gave files with equal
    tensors but different bytes. The tensor entries are already sorted; reordering keys keeps the
    header's length, so it is rewritten in place (file layout: 8-byte little-endian header length,
    the JSON header padded with spaces, then the data).
    """
    with open(path, "r+b") as f:
        n = int.from_bytes(f.read(8), "little")
        text = f.read(n).rstrip(b" ")
        header = json.loads(text)
        header["__metadata__"] = dict(sorted(header.get("__metadata__", {}).items()))
        new = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
        if len(new) != len(text) or json.loads(new) != header:  # an encoding we do not reproduce: keep it
            return
        f.seek(8)
        f.write(new)


def load_tensors(path: Path, kind: str = WEIGHTS_FORMAT) -> dict[str, torch.Tensor]:
    return load_tensors_and_meta(path, kind)[0]


def load_tensors_and_meta(path: Path, kind: str = WEIGHTS_FORMAT) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors of an hlbl safetensors file and its metadata, checked."""
    path = Path(path)
    try:
        if not path.is_file() and path.exists():
            raise CheckpointError(f"{path}: cannot read checkpoint (not a regular file)")
        with open(path, "rb"):  # present but unreadable is not "missing"
            pass
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing checkpoint file") from None
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read checkpoint ({e.strerror or e})") from None
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("format") != kind:
                raise CheckpointError(
                    f"{path}: not an hlbl checkpoint (format {meta.get('format')!r}, expected {kind!r})"
                )
            if meta.get("version") != str(FORMAT_VERSION):
                raise CheckpointError(
                    f"{path}: checkpoint version {meta.get('version')} is not supported (this hlbl reads {FORMAT_VERSION})"
                )
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        if "sha256" in meta and _digest(tensors) != meta["sha256"]:  # (files from before the digest lack it)
            raise CheckpointError(f"{path}: damaged checkpoint (its data does not match its checksum)")
        return tensors, meta
    except SafetensorError as e:
        raise CheckpointError(f"{path}: damaged or truncated checkpoint ({e})") from None
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read checkpoint ({e})") from None


_STATE_KEYS = ("epoch", "phase", "lr", "best_valid_ppl", "done", "elapsed", "optimizer")


def write_state(path: Path, state: dict) -> None:
    """state.json: the training loop's state (epoch, phase, lr, best perplexity, optimiser scalars)."""
    write_json(path, {"format": STATE_FORMAT, "version": FORMAT_VERSION, **state})


def read_state(path: Path) -> dict:
    """Inverse of :func:`write_state`, checked (files without a format name predate it and are read too)."""
    obj = read_json(path, "training state")
    if not isinstance(obj, dict) or obj.get("format", STATE_FORMAT) != STATE_FORMAT:
        raise CheckpointError(f"{path}: not an hlbl training state")
    if obj.get("version", FORMAT_VERSION) != FORMAT_VERSION:
        raise CheckpointError(f"{path}: training state version {obj.get('version')} is not supported")
    missing = [k for k in _STATE_KEYS if k not in obj]
    if missing:
        raise CheckpointError(f"{path}: damaged training state (no {', '.join(missing)})")
    for key, kind in (
        ("epoch", "int"),
        ("phase", "int"),
        ("lr", "positive"),
        ("done", "bool"),
        ("elapsed", "nonneg"),
        ("optimizer", "dict"),
    ):
        check_field(path, key, obj[key], kind)
    if obj["epoch"] < 0 or obj["phase"] < 0:
        bad = "epoch" if obj["epoch"] < 0 else "phase"
        raise CheckpointError(f"{path}: field {bad!r} is out of range ({obj[bad]})")
    ppl = obj["best_valid_ppl"]  # infinite before the first epoch ends
    if not (_is_number(ppl) and ppl > 0) or math.isnan(ppl):
        raise CheckpointError(f"{path}: field 'best_valid_ppl' must be a number > 0, not {_show(ppl)}")
    return {k: v for k, v in obj.items() if k not in ("format", "version")}


def read_metrics(path: Path) -> list[dict]:
    """metrics.jsonl: one JSON object per finished epoch, epochs 1, 2, ... in order. Any other
    content (not UTF-8, a torn or foreign line) is a CheckpointError naming the line."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing (metrics log)") from None
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read metrics log ({e.strerror or e})") from None
    lines = data.split(b"\n")
    if lines[-1]:
        raise CheckpointError(f"{path}: line {len(lines)} is incomplete (a torn write: it has no line end)")
    out = []
    for number, raw in enumerate(lines[:-1], 1):
        try:
            line = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise CheckpointError(f"{path}: line {number} is not UTF-8 (byte 0x{raw[e.start]:02x})") from None
        except (json.JSONDecodeError, RecursionError) as e:
            raise CheckpointError(f"{path}: line {number} is not JSON ({e})") from None
        check_field(path, f"line {number}", line, "dict")
        check_field(path, f"line {number}: epoch", line.get("epoch"), "int")
        if line["epoch"] != number:
            raise CheckpointError(f"{path}: line {number} is of epoch {line['epoch']} (expected {number})")
        out.append(line)
    return out


def save_run_files(
    run_dir: Path,
    model: LBL,
    vocab: Vocab,
    train_config: dict,
    corpus: str,
    data_sha256: dict[str, str] | None = None,
    options: dict | None = None,
    corpus_meta: dict | None = None,
) -> None:
    """The files that do not change during training: vocab.json, tree.json, then run.json, last:
    a directory with run.json holds a whole run description.

    ``data_sha256``: :func:`hlbl.data.stream_fingerprint` of the splits trained and validated on,
    so that a resume can check it continues on the same text (a run made without it still loads).
    ``options``: settings that shaped the vocabulary and tree (``--tree``, ``--max-vocab``,
    ``--min-count``), recorded so that a resume can refuse flags that contradict them.
    ``corpus_meta``: :func:`hlbl.data.corpus_meta` (where the corpus was found, its blank-line
    protocol), recorded beside ``corpus``."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        write_json(run_dir / "vocab.json", vocab.to_json())
        if model.structure is not None:  # a word tree, or word classes (classes output)
            model.structure.save(run_dir / "tree.json")
        write_json(
            run_dir / "run.json",
            {
                "format": RUN_FORMAT,
                "version": FORMAT_VERSION,
                "model": model.config.to_json(),
                "train": train_config,
                "corpus": corpus,
                **(corpus_meta or {}),
                **({"data_sha256": data_sha256} if data_sha256 else {}),
                **({"options": options} if options else {}),
            },
        )
    except OSError as e:
        raise CheckpointError(f"cannot write the run files in {run_dir}: {write_error(e)}") from None


def vocab_fingerprint(vocab: Vocab) -> str:
    """SHA-256 of the words in id order: two vocabularies of one size with two words swapped differ."""
    return hashlib.sha256("\n".join(vocab.words).encode("utf-8")).hexdigest()


def _weights_meta(model: LBL, vocab: Vocab | None = None) -> dict[str, str]:
    """What the weights belong to: a tree's node vectors are meaningless under another tree, and
    word vectors under another vocabulary (even one of the same size)."""
    meta = {"vocab_size": str(model.config.vocab_size)}
    if vocab is not None:
        meta["vocab_sha256"] = vocab_fingerprint(vocab)
    if model.structure is not None:
        meta["tree_sha256"] = model.structure.fingerprint()
    return meta


def save_weights(path: Path, model: LBL, epoch: int | None = None, vocab: Vocab | None = None) -> None:
    """``epoch``: the training epoch these weights end (a run's ``last`` checkpoint records it);
    ``vocab``: the vocabulary they were trained with (recorded as its fingerprint)."""
    epoch_meta = {} if epoch is None else {"epoch": str(int(epoch))}
    save_tensors(path, dict(model.state_dict()), meta={**_weights_meta(model, vocab), **epoch_meta})


def write_weights(path: str | os.PathLike, model: LBL, epoch: int | None = None, vocab: Vocab | None = None) -> None:
    """:func:`save_weights` without the temporary file (a checkpoint's directory is its own)."""
    epoch_meta = {} if epoch is None else {"epoch": str(int(epoch))}
    write_tensors(path, dict(model.state_dict()), meta={**_weights_meta(model, vocab), **epoch_meta})


def check_epoch(path: Path, meta: dict[str, str], epoch: int) -> None:
    """A checkpoint file must end the epoch its state.json says (files written before the
    epoch was recorded pass). They differ when a run was killed between writing the files and
    the state that points at them."""
    if "epoch" in meta and meta["epoch"] != str(int(epoch)):
        raise CheckpointError(
            f"{path} ends epoch {meta['epoch']} but state.json says {epoch}: the run was "
            "stopped while writing its checkpoint; best.safetensors still holds the best weights"
        )


def load_weights(path: Path, model: LBL, epoch: int | None = None, vocab: Vocab | None = None) -> None:
    """Load ``path`` into ``model`` (checked); with ``epoch``, the file must end that epoch; with
    ``vocab``, the weights must have been trained with it."""
    state, meta = load_tensors_and_meta(path)
    if epoch is not None:
        check_epoch(path, meta, epoch)
    for key, want in _weights_meta(model, vocab).items():
        if key in meta and meta[key] != want:  # (files from before these keys existed lack them)
            what = {"tree_sha256": "word tree", "vocab_sha256": "vocabulary (same size, other words or order)"}.get(
                key, "vocabulary size"
            )
            raise CheckpointError(f"{path}: these weights were trained with another {what} than this model's")
    own = model.state_dict()
    if set(state) != set(own):
        raise CheckpointError(f"{path}: tensors {sorted(set(state) ^ set(own))[:4]} do not match the model")
    for k, v in state.items():
        if v.shape != own[k].shape:
            raise CheckpointError(f"{path}: tensor {k} has shape {tuple(v.shape)}, the model {tuple(own[k].shape)}")
        if v.dtype != own[k].dtype:  # a silent cast could turn a checked finite float64 into an infinite float32
            raise CheckpointError(f"{path}: tensor {k} is {v.dtype}, the model's {own[k].dtype}")
        if v.is_floating_point() and not bool(torch.isfinite(v).all()):
            # safetensors has no checksum: damaged data bytes read as numbers; NaN/inf are the detectable ones
            raise CheckpointError(
                f"{path}: tensor {k} holds NaN or infinite values (a damaged file, or a diverged run)"
            )
    model.load_state_dict(state)


def read_run(run_dir: str | os.PathLike) -> dict:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CheckpointError(f"{run_dir}: not a run directory")
    info = read_json(run_dir / "run.json", "run description")
    if not isinstance(info, dict) or info.get("format") != RUN_FORMAT:
        raise CheckpointError(f"{run_dir / 'run.json'}: not an hlbl run description")
    if info.get("version") != FORMAT_VERSION:
        raise CheckpointError(f"{run_dir}: run format version {info.get('version')} is not supported")
    path = run_dir / "run.json"
    for key, kind in (("model", "dict"), ("train", "dict"), ("corpus", "str")):
        if key not in info:
            raise CheckpointError(f"{path}: damaged run description (no {key!r})")
        check_field(path, key, info[key], kind)
    check_dataclass_fields(path, "model", info["model"], LBLConfig)
    from .train import TrainConfig  # (train imports this module)

    check_dataclass_fields(path, "train", info["train"], TrainConfig)
    for key in ("data_sha256", "options"):
        check_field(path, key, info.get(key), "dict | None")
    for split, digest in (info.get("data_sha256") or {}).items():
        check_field(path, f"data_sha256.{split}", digest, "str")
    for key in ("corpus_path", "blank_lines"):
        check_field(path, key, info.get(key), "str | None")
    if info.get("blank_lines") not in (None, "drop", "keep"):
        raise CheckpointError(f"{path}: blank_lines is {info['blank_lines']!r}, not 'drop' or 'keep'")
    return info


def read_vocab(run_dir: str | os.PathLike) -> Vocab:
    """A run's vocabulary (``vocab.json``), with errors that name the file."""
    path = Path(run_dir) / "vocab.json"
    try:
        return Vocab.from_json(read_json(path, "vocabulary"))
    except DataError as e:
        raise CheckpointError(f"{path}: {e}") from None


def load_model(
    run_dir: str | os.PathLike, which: str = "best", device: str | torch.device = "cpu"
) -> tuple[LBL, Vocab, dict]:
    """The model of a run (``best`` or ``last`` weights), its vocabulary and run description."""
    run_dir = Path(run_dir)
    config, vocab, tree, info = load_recipe(run_dir)
    try:
        model = LBL(config, tree, init=False)  # every weight comes from the file
    except ValueError as e:  # e.g. a tree over another vocabulary, an unknown output layer
        raise CheckpointError(f"{run_dir}: {e}") from None
    load_weights(run_dir / f"{which}.safetensors", model, vocab=vocab)
    return model.to(device), vocab, info


def load_recipe(run_dir: str | os.PathLike) -> tuple[LBLConfig, Vocab, WordTree | WordClasses | None, dict]:
    """What a run is, without weights: its model config, vocabulary, tree and run description."""
    run_dir = Path(run_dir)
    info = read_run(run_dir)
    try:
        config = LBLConfig.from_json(info["model"])
    except (TypeError, KeyError, ValueError) as e:
        raise CheckpointError(f"{run_dir / 'run.json'}: bad model config ({e})") from None
    vocab = read_vocab(run_dir)
    if len(vocab) != config.vocab_size:
        raise CheckpointError(f"{run_dir / 'vocab.json'}: {len(vocab)} words, the model {config.vocab_size}")
    tree = None
    if takes_structure(config.output):
        try:
            if takes_tree(config.output):
                tree = WordTree.load(run_dir / "tree.json")
            else:
                tree = WordClasses.load(run_dir / "tree.json")
        except TreeError as e:
            raise CheckpointError(str(e)) from None
    return config, vocab, tree, info


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """Split an optimiser state into tensors (for safetensors) and JSON scalars."""
    sd = optimizer.state_dict()
    tensors, scalars = {}, {}
    for idx, st in sd["state"].items():
        for k, v in st.items():
            if torch.is_tensor(v):
                tensors[f"{idx}.{k}"] = v
            else:
                scalars[f"{idx}.{k}"] = v
    return tensors, {"scalars": scalars, "param_groups": sd["param_groups"]}


def _check_param_groups(fresh: list[dict], saved: Any) -> None:
    """The saved hyperparameters must have the fresh optimiser's keys and value types (a hand-edited
    ``"lr": "x"`` or NaN would otherwise load, and fail or train with NaN in the first step)."""
    if not isinstance(saved, list) or len(saved) != len(fresh) or not all(isinstance(g, dict) for g in saved):
        raise ValueError(f"param_groups must be a list of {len(fresh)} objects")
    for i, (want, got) in enumerate(zip(fresh, saved)):
        if set(want) != set(got):
            raise ValueError(f"param_groups[{i}] has keys {sorted(got)}, expected {sorted(want)}")
        for key, ref in want.items():
            value = got[key]
            if key == "params" or ref is None:
                continue
            if isinstance(ref, bool):
                ok = isinstance(value, bool)
            elif isinstance(ref, (int, float)):
                ok = _is_number(value) and math.isfinite(value) and value >= 0
            elif isinstance(ref, (tuple, list)):
                ok = (
                    isinstance(value, list)
                    and len(value) == len(ref)
                    and all(_is_number(v) and math.isfinite(v) for v in value)
                )
            else:
                ok = type(value) is type(ref)
            if not ok:
                raise ValueError(f"param_groups[{i}].{key} is {_show(value)}")
        if not got["lr"] > 0:
            raise ValueError(f"param_groups[{i}].lr is {_show(got['lr'])}")


def restore_optimizer(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], meta: dict) -> None:
    state: dict[int, dict] = {}
    try:
        if not isinstance(meta, dict) or not isinstance(meta.get("scalars"), dict):
            raise ValueError("no scalars object")
        _check_param_groups(optimizer.state_dict()["param_groups"], meta.get("param_groups"))
        for key, v in meta["scalars"].items():
            if not (_is_number(v) and math.isfinite(v)):
                raise ValueError(f"scalar {key} is {_show(v)}")
        for key, v in list(tensors.items()) + list(meta["scalars"].items()):
            idx, k = key.split(".", 1)
            state.setdefault(int(idx), {})[k] = v
        optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
    except (ValueError, KeyError, TypeError, AttributeError) as e:  # a damaged or hand-edited state.json
        raise CheckpointError(
            f"optimizer state does not match this model and optimizer, or is damaged ({e!r})"
        ) from None


# --------------------------------------------------------------------------------------------
# Checkpoints: one directory per epoch, committed by a rename

CHECKPOINTS = "checkpoints"
PARTIAL = ".partial-"
PUBLISHED = ("best.safetensors", "last.safetensors", "metrics.jsonl", "state.json")
_COMMITTED = re.compile(r"epoch-(\d{6,})")
# Temporary files of atomic writes (hlbl.atomic: NAME.RANDOM.tmp) of the files a run directory holds.
_TEMPORARY = re.compile(r"(run|vocab|tree|state|metrics|best|last|optimizer)\.(json|jsonl|safetensors)\..+\.tmp")
RUN_FILES = ("run.json", "vocab.json", "tree.json", "metrics.jsonl")


def committed_checkpoints(run_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """The complete checkpoints of a run, oldest first, as (epoch, directory)."""
    root = Path(run_dir) / CHECKPOINTS
    try:
        entries = list(root.iterdir())
    except FileNotFoundError:
        return []
    except OSError as e:
        raise CheckpointError(f"{root}: cannot read ({e.strerror or e})") from None
    found = [(int(m.group(1)), p) for p in entries if (m := _COMMITTED.fullmatch(p.name)) and p.is_dir()]
    return sorted(found)


def latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint's directory; for a run written before checkpoints had their
    own directories, the run directory itself (its state.json and optimizer file); else None."""
    run_dir = Path(run_dir)
    found = committed_checkpoints(run_dir)
    if found:
        return found[-1][1]
    if (
        not (run_dir / CHECKPOINTS).exists()
        and (run_dir / "state.json").is_file()
        and (run_dir / "optimizer.safetensors").is_file()
    ):
        return run_dir
    return None


def remove_leftovers(run_dir: str | os.PathLike) -> list[str]:
    """Remove what interrupted writes left behind (partial checkpoint directories, temporary files
    of atomic writes); the names removed. Only a process that holds the run directory may call it."""
    run_dir = Path(run_dir)
    removed = []
    try:
        root = run_dir / CHECKPOINTS
        if root.is_dir():
            for p in sorted(root.iterdir()):
                if p.name.startswith(PARTIAL):
                    shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
                    removed.append(f"{CHECKPOINTS}/{p.name}")
            if removed:
                atomic.sync_dir(root)
        temporary = [p for p in sorted(run_dir.iterdir()) if _TEMPORARY.fullmatch(p.name) and p.is_file()]
        for p in temporary:
            p.unlink()
            removed.append(p.name)
        if temporary:
            atomic.sync_dir(run_dir)
    except OSError as e:
        raise CheckpointError(
            f"{run_dir}: cannot remove the leftovers of an interrupted write ({e.strerror or e})"
        ) from None
    return removed


def prune_checkpoints(run_dir: str | os.PathLike, keep: Path) -> None:
    """Remove every complete checkpoint but ``keep`` (once ``keep`` is durable)."""
    old = [p for _, p in committed_checkpoints(run_dir) if p != keep]
    for p in old:
        # Renamed away first, so that a crash half-way through the removal leaves a partial
        # directory (removed at resume), never a committed name with files missing.
        gone = p.with_name(f"{PARTIAL}old-{p.name}")
        os.rename(p, gone)
        atomic.fault_point(f"retire {p}")
        shutil.rmtree(gone)
        atomic.fault_point(f"remove {gone}")
    if old:
        atomic.sync_dir(Path(run_dir) / CHECKPOINTS)


def _link_or_copy(src: Path, dest: Path) -> None:
    """``dest`` a new name of ``src``'s bytes: a hard link (no copy of the weights), or a flushed copy
    where the filesystem has none. Files of a committed checkpoint are never modified in place."""
    try:
        os.link(src, dest)
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.EXDEV, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
        shutil.copyfile(src, dest)
        atomic.fsync_path(dest)


def commit_checkpoint(run_dir: str | os.PathLike, epoch: int, files: dict[str, Callable[[Path], None] | Path]) -> Path:
    """Write the checkpoint of ``epoch`` as one atomic commit; returns its directory.

    ``files``: name -> a function that writes that file at the path it is given, or an existing
    file (of the previous checkpoint) to link. Each file is flushed, the new directory synced, then
    renamed to ``checkpoints/epoch-NNNNNN`` and the rename synced. A failed write (disk full, a
    file-size limit) removes the partial directory and raises CheckpointError; the previous
    checkpoint is untouched either way."""
    root = Path(run_dir) / CHECKPOINTS
    final = root / f"epoch-{int(epoch):06d}"
    partial = root / f"{PARTIAL}{final.name}-{os.getpid()}"
    try:
        if not root.is_dir():
            root.mkdir()
            atomic.fault_point(f"mkdir {root}")
            atomic.sync_dir(root.parent)
        if partial.exists():
            shutil.rmtree(partial)
        partial.mkdir()
        atomic.fault_point(f"mkdir {partial}")
        for name, source in files.items():
            path = partial / name
            if isinstance(source, Path):
                _link_or_copy(source, path)
            else:
                source(path)
                os.chmod(path, atomic.plain_mode())  # (safetensors creates its files 0600)
                atomic.fsync_path(path)
            atomic.fault_point(f"write {path}")
        atomic.sync_dir(partial)
        atomic.fault_point(f"fsync {partial}")
        if final.exists():  # an epoch written before by a run that was then resumed from an older checkpoint
            shutil.rmtree(final)
        os.rename(partial, final)
        atomic.fault_point(f"commit {final}")
        atomic.sync_dir(root)
        atomic.fault_point(f"fsync {root}")
    except BaseException as e:
        if partial.exists():
            shutil.rmtree(partial, ignore_errors=True)
        if isinstance(e, (OSError, SafetensorError)):
            raise CheckpointError(
                f"cannot write the checkpoint of epoch {epoch} in {root}: "
                f"{write_error(e)}{_named(e)}; the previous checkpoint is kept"
            ) from None
        raise
    return final


def _named(e: BaseException) -> str:
    return f" ({e.filename})" if isinstance(e, OSError) and e.filename else ""


def publish(run_dir: str | os.PathLike, checkpoint: Path, names: tuple[str, ...] = PUBLISHED) -> None:
    """Replace the run directory's top-level copies of ``names`` with ``checkpoint``'s, each
    atomically (the weights as hard links). Readers (eval, predict) see whole files; resume never
    reads these."""
    run_dir = Path(run_dir)
    try:
        for name in names:
            src, dest = checkpoint / name, run_dir / name
            if dest.exists() and os.path.samefile(src, dest):
                continue  # already linked (and rename() between two links of one file does nothing)
            tmp = run_dir / f"{name}.{os.getpid()}-publish.tmp"
            if tmp.exists():
                tmp.unlink()
            if name.endswith(".safetensors"):
                _link_or_copy(src, tmp)
            else:  # small, and a copy: editing the top-level file in place cannot touch the checkpoint
                shutil.copyfile(src, tmp)
                atomic.fsync_path(tmp)
            atomic.fault_point(f"write {tmp}")
            os.replace(tmp, dest)
            atomic.fault_point(f"rename {dest}")
        atomic.sync_dir(run_dir)
        atomic.fault_point(f"fsync {run_dir}")
    except OSError as e:
        raise CheckpointError(
            f"cannot update the files of {run_dir}: {write_error(e)}{_named(e)} (the checkpoint "
            f"{checkpoint} is complete: a resume continues from it)"
        ) from None
