"""Run directories and checkpoints: safetensors for tensors, JSON for everything else, no pickle.

A run directory holds::

    run.json             format, version, model config, training config, corpus spec
    vocab.json           words and training counts
    tree.json            the word tree (tree output only)
    best.safetensors     weights with the best validation perplexity so far
    last.safetensors     weights after the last finished epoch
    optimizer.safetensors  optimiser state after the last epoch (for --resume)
    state.json           epoch, phase, learning rate, best perplexity, optimiser scalars
    metrics.jsonl        one JSON line per epoch (a log, appended to)

Every other file is written to a temporary name and renamed, so a crash leaves the previous
version. Each carries a format name and version: weights files ``{"format": "hlbl-weights",
"version": "1"}`` in their safetensors metadata (``hlbl-optimizer`` for the optimiser), the JSON
files ``"format"`` / ``"version"`` keys (``hlbl-run``, ``hlbl-vocab``, ``hlbl-train-state``,
``hlbl-word-tree``). Safetensors files also hold a SHA-256 of their tensors, and weights files the
vocabulary size and the tree's fingerprint. Anything else (a foreign, truncated or damaged file,
weights of another tree) raises
:class:`CheckpointError` (:class:`hlbl.data.DataError` for the vocabulary).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from . import atomic
from .data import DataError, Vocab
from .errors import CheckpointError
from .model import LBL, LBLConfig
from .output import takes_tree
from .tree import TreeError, WordTree

RUN_FORMAT = "hlbl-run"
WEIGHTS_FORMAT = "hlbl-weights"
STATE_FORMAT = "hlbl-train-state"
FORMAT_VERSION = 1


def write_json(path: Path, obj: Any) -> None:
    atomic.write_text(path, json.dumps(obj, indent=1))


def read_json(path: Path, what: str) -> Any:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: missing ({what})")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise CheckpointError(f"{path}: damaged {what} ({e})") from None


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


def save_tensors(path: Path, tensors: dict[str, torch.Tensor], kind: str = WEIGHTS_FORMAT,
                 meta: dict[str, str] | None = None) -> None:
    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    meta = {"format": kind, "version": str(FORMAT_VERSION), **(meta or {}), "sha256": _digest(tensors)}
    with atomic.atomic_path(path) as tmp:
        save_file(tensors, tmp, metadata=meta)
        _sort_metadata(tmp)


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
    if not path.is_file():
        raise CheckpointError(f"{path}: missing checkpoint file")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("format") != kind:
                raise CheckpointError(f"{path}: not an hlbl checkpoint (format {meta.get('format')!r}, expected {kind!r})")
            if meta.get("version") != str(FORMAT_VERSION):
                raise CheckpointError(f"{path}: checkpoint version {meta.get('version')} is not supported (this hlbl reads {FORMAT_VERSION})")
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
    return {k: v for k, v in obj.items() if k not in ("format", "version")}


def save_run_files(run_dir: Path, model: LBL, vocab: Vocab, train_config: dict, corpus: str,
                   data_sha256: dict[str, str] | None = None, corpus_meta: dict | None = None) -> None:
    """The files that do not change during training: run.json, vocab.json, tree.json.

    ``data_sha256``: :func:`hlbl.data.stream_fingerprint` of the splits trained and validated on,
    so that a resume can check it continues on the same text (a run made without it still loads).
    ``corpus_meta``: :func:`hlbl.data.corpus_meta` (where the corpus was found, its blank-line
    protocol), recorded beside ``corpus``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json(run_dir / "run.json", {
        "format": RUN_FORMAT, "version": FORMAT_VERSION, "model": model.config.to_json(),
        "train": train_config, "corpus": corpus, **(corpus_meta or {}),
        **({"data_sha256": data_sha256} if data_sha256 else {}),
    })
    write_json(run_dir / "vocab.json", vocab.to_json())
    if model.tree is not None:
        model.tree.save(run_dir / "tree.json")


def _weights_meta(model: LBL) -> dict[str, str]:
    """What the weights belong to: a tree's node vectors are meaningless under another tree."""
    meta = {"vocab_size": str(model.config.vocab_size)}
    if model.tree is not None:
        meta["tree_sha256"] = model.tree.fingerprint()
    return meta


def save_weights(path: Path, model: LBL, epoch: int | None = None) -> None:
    """``epoch``: the training epoch these weights end (a run's ``last`` checkpoint records it)."""
    epoch_meta = {} if epoch is None else {"epoch": str(int(epoch))}
    save_tensors(path, dict(model.state_dict()), meta={**_weights_meta(model), **epoch_meta})


def check_epoch(path: Path, meta: dict[str, str], epoch: int) -> None:
    """A checkpoint file must end the epoch its state.json says (files written before the
    epoch was recorded pass). They differ when a run was killed between writing the files and
    the state that points at them."""
    if "epoch" in meta and meta["epoch"] != str(int(epoch)):
        raise CheckpointError(f"{path} ends epoch {meta['epoch']} but state.json says {epoch}: the run was "
                              "stopped while writing its checkpoint; best.safetensors still holds the best weights")


def load_weights(path: Path, model: LBL, epoch: int | None = None) -> None:
    """Load ``path`` into ``model`` (checked); with ``epoch``, the file must end that epoch."""
    state, meta = load_tensors_and_meta(path)
    if epoch is not None:
        check_epoch(path, meta, epoch)
    for key, want in _weights_meta(model).items():
        if key in meta and meta[key] != want:  # (files from before these keys existed lack them)
            what = "word tree" if key == "tree_sha256" else "vocabulary size"
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
            raise CheckpointError(f"{path}: tensor {k} holds NaN or infinite values (a damaged file, or a diverged run)")
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
    return info


def read_vocab(run_dir: str | os.PathLike) -> Vocab:
    """A run's vocabulary (``vocab.json``), with errors that name the file."""
    path = Path(run_dir) / "vocab.json"
    try:
        return Vocab.from_json(read_json(path, "vocabulary"))
    except DataError as e:
        raise CheckpointError(f"{path}: {e}") from None


def load_model(run_dir: str | os.PathLike, which: str = "best", device: str | torch.device = "cpu"
               ) -> tuple[LBL, Vocab, dict]:
    """The model of a run (``best`` or ``last`` weights), its vocabulary and run description."""
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
    if takes_tree(config.output):
        try:
            tree = WordTree.load(run_dir / "tree.json")
        except TreeError as e:
            raise CheckpointError(str(e)) from None
    try:
        model = LBL(config, tree, init=False)  # every weight comes from the file
    except ValueError as e:  # e.g. a tree over another vocabulary, an unknown output layer
        raise CheckpointError(f"{run_dir}: {e}") from None
    load_weights(run_dir / f"{which}.safetensors", model)
    return model.to(device), vocab, info


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


def restore_optimizer(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], meta: dict) -> None:
    state: dict[int, dict] = {}
    try:
        for key, v in list(tensors.items()) + list(meta["scalars"].items()):
            idx, k = key.split(".", 1)
            state.setdefault(int(idx), {})[k] = v
        optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
    except (ValueError, KeyError, TypeError, AttributeError) as e:  # a damaged or hand-edited state.json
        raise CheckpointError(f"optimizer state does not match this model and optimizer, or is damaged ({e!r})") from None
