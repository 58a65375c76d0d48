"""The file formats of a run: safetensors for tensors, checked JSON for everything else, no pickle.

Each file carries a format name and version: weights files ``{"format": "hlbl-weights",
"version": "1"}`` in their safetensors metadata (``hlbl-optimizer`` for the optimiser), the JSON
files ``"format"`` / ``"version"`` keys (``hlbl-run``, ``hlbl-vocab``, ``hlbl-train-state``,
``hlbl-word-tree``). Safetensors files also hold a SHA-256 of their tensors, and weights files the
vocabulary size and fingerprint and the tree's fingerprint. Every JSON file is checked field by
field. Anything else (a foreign, truncated or damaged file, weights of another tree or
vocabulary, a value of the wrong type) raises :class:`CheckpointError` with one line naming the
file and field. Where these files live in a run directory, and how a checkpoint is committed, is
:mod:`hlbl.run`'s.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import re
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
from safetensors import SafetensorError, safe_open

from . import atomic
from .data import Vocab
from .errors import CheckpointError
from .files import refuse_special

if TYPE_CHECKING:  # torch is imported by the functions that read or write torch tensors: the numpy
    import torch  # reader (load_arrays) serves inference without it
    from torch import nn

WEIGHTS_FORMAT = "hlbl-weights"
STATE_FORMAT = "hlbl-train-state"
FORMAT_VERSION = 1


def write_json(path: Path, obj: Any) -> None:
    atomic.write_text(path, json.dumps(obj, indent=1))


def read_json(path: Path, what: str) -> Any:
    path = Path(path)
    refuse_special(path, CheckpointError, f"the {what} file")
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
    import torch

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


def save_file(tensors: dict[str, torch.Tensor], path: str, metadata: dict[str, str]) -> None:
    """safetensors' torch writer (imported here, with torch, when a file is written)."""
    from safetensors.torch import save_file as write

    write(tensors, path, metadata=metadata)


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


# A load reads each tensor in pieces of about this many bytes: beside what it returns (or the model
# it fills) it holds one piece and the file's mapped pages (which the system may drop at will), not
# a second copy of the data, as whole tensors checked before they are copied would be.
PIECE_BYTES = 64 << 20


def load_tensors_and_meta(path: Path, kind: str = WEIGHTS_FORMAT) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors of an hlbl safetensors file and its metadata, checked."""
    import torch

    path = Path(path)
    with _reader(path, kind) as (f, meta, layout):
        tensors = {k: torch.empty(shape, dtype=dtype) for k, (dtype, shape) in layout.items()}

        def keep(name: str, lo: int, piece: torch.Tensor) -> None:
            if piece.is_floating_point() and not bool(torch.isfinite(piece).all()):
                # (as load_weights: NaN weights would make top-k and predictions answer arbitrary words)
                raise CheckpointError(
                    f"{path}: tensor {name} holds NaN or infinite values (a damaged file, or a diverged run)"
                )
            if piece.dim():
                tensors[name][lo : lo + len(piece)] = piece
            else:
                tensors[name] = piece

        if _read_pieces(path, f, layout, keep) != meta.get("sha256"):
            raise CheckpointError(f"{path}: damaged checkpoint (its data does not match its checksum)")
    return tensors, meta


@contextlib.contextmanager
def _reader(path: Path, kind: str, framework: str = "pt"):
    """``(file, metadata, layout)`` of an hlbl safetensors file of format ``kind``, its format and
    version checked; ``layout``: each tensor's (dtype, shape) by name, sorted, the dtype a torch
    dtype (``framework="pt"``) or a numpy one (``"numpy"``: torch is not imported). The file stays open
    (one mapping, one version of the file) until the block ends; safetensors and OS errors inside
    the block become one-line CheckpointErrors."""
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
        dtypes = _torch_dtypes() if framework == "pt" else _NUMPY_DTYPES
        with safe_open(str(path), framework=framework) as f:
            meta = f.metadata() or {}
            if meta.get("format") != kind:
                raise CheckpointError(
                    f"{path}: not an hlbl checkpoint (format {meta.get('format')!r}, expected {kind!r})"
                )
            if meta.get("version") != str(FORMAT_VERSION):
                raise CheckpointError(
                    f"{path}: checkpoint version {meta.get('version')} is not supported (this hlbl reads {FORMAT_VERSION})"
                )
            layout = {}
            for k in sorted(f.keys()):
                sl = f.get_slice(k)
                if sl.get_dtype() not in dtypes:
                    raise CheckpointError(f"{path}: tensor {k} is of a type hlbl does not write ({sl.get_dtype()})")
                layout[k] = (dtypes[sl.get_dtype()], tuple(sl.get_shape()))
            yield f, meta, layout
    except SafetensorError as e:
        raise CheckpointError(f"{path}: damaged or truncated checkpoint ({e})") from None
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read checkpoint ({e})") from None


def _read_pieces(path: Path, f, layout: dict, visit: Callable[[str, int, Any], None]) -> str:
    """Every tensor of ``layout`` read from the open file ``f`` in pieces of whole rows
    (``PIECE_BYTES``), in name order; ``visit(name, first_row, piece)`` for each (a torch tensor,
    or a numpy array from a file opened for numpy). Returns the SHA-256 that :func:`_digest` gives
    the whole tensors (whichever framework read them: the digest names torch's dtypes)."""
    h = hashlib.sha256()
    for k, (dtype, shape) in layout.items():
        name = f"torch.{dtype.name}" if isinstance(dtype, np.dtype) else str(dtype)  # np.float32 -> torch.float32
        h.update(f"{k}:{name}:{shape};".encode())
        step = max(1, PIECE_BYTES // max(1, math.prod(shape[1:]) * dtype.itemsize))
        for lo in range(0, shape[0], step) if shape else (0,):
            piece = (
                f.get_slice(k)[lo : min(lo + step, shape[0])] if shape else f.get_tensor(k)
            )  # (numpy's slices do not clamp)
            if tuple(piece.shape[1:]) != shape[1:] or piece.dtype != dtype:
                raise CheckpointError(f"{path}: damaged checkpoint (tensor {k} does not read as its header says)")
            if isinstance(piece, np.ndarray):
                if piece.size:
                    h.update(np.ascontiguousarray(piece).reshape(-1).view(np.uint8))
            elif piece.numel():
                import torch  # (a torch tensor: torch is loaded)

                h.update(piece.contiguous().reshape(-1).view(torch.uint8).numpy())
            visit(k, lo, piece)
    return h.hexdigest()


def _torch_dtypes() -> dict:
    """The torch dtype of each safetensors dtype hlbl writes."""
    import torch

    return {
        "F64": torch.float64,
        "F32": torch.float32,
        "F16": torch.float16,
        "BF16": torch.bfloat16,
        "I64": torch.int64,
        "I32": torch.int32,
        "I16": torch.int16,
        "I8": torch.int8,
        "U8": torch.uint8,
        "BOOL": torch.bool,
    }


# The same for a numpy reader (numpy has no bfloat16: such a file is refused as a foreign type there).
_NUMPY_DTYPES = {
    name: np.dtype(kind)
    for name, kind in (
        ("F64", "float64"),
        ("F32", "float32"),
        ("F16", "float16"),
        ("I64", "int64"),
        ("I32", "int32"),
        ("I16", "int16"),
        ("I8", "int8"),
        ("U8", "uint8"),
        ("BOOL", "bool"),
    )
}


_STATE_KEYS = ("epoch", "phase", "lr", "best_valid_ppl", "done", "elapsed", "optimizer")


def write_state(path: Path, state: dict) -> None:
    """state.json: the training loop's state (epoch, phase, lr, best perplexity, optimiser scalars)."""
    write_json(path, {"format": STATE_FORMAT, "version": FORMAT_VERSION, **state})


def read_state(path: Path) -> dict:
    """Inverse of :func:`write_state`, checked."""
    obj = read_json(path, "training state")
    if not isinstance(obj, dict) or obj.get("format") != STATE_FORMAT:
        raise CheckpointError(f"{path}: not an hlbl training state")
    if obj.get("version") != FORMAT_VERSION:
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


def vocab_fingerprint(vocab: Vocab) -> str:
    """SHA-256 of the words in id order: two vocabularies of one size with two words swapped differ."""
    return hashlib.sha256("\n".join(vocab.words).encode("utf-8")).hexdigest()


def _weights_meta(model: nn.Module, vocab: Vocab | None = None) -> dict[str, str]:
    """What the weights belong to: a tree's node vectors are meaningless under another tree, and
    word vectors under another vocabulary (even one of the same size)."""
    return weights_meta(model.config.vocab_size, model.structure, vocab)


def weights_meta(vocab_size: int, structure: Any = None, vocab: Vocab | None = None) -> dict[str, str]:
    """:func:`_weights_meta` of a model of ``vocab_size`` words over ``structure`` (a word tree or
    word classes, or None) trained with ``vocab``."""
    meta = {"vocab_size": str(vocab_size)}
    if vocab is not None:
        meta["vocab_sha256"] = vocab_fingerprint(vocab)
    if structure is not None:
        meta["tree_sha256"] = structure.fingerprint()
    return meta


def _check_owner(path: Path, meta: dict, want: dict[str, str], epoch: int | None) -> None:
    """The file's metadata against what the weights must belong to (:func:`weights_meta`) and the
    epoch they must end."""
    # What the weights belong to first: a file of another tree is that, whatever epoch it ends.
    for key, value in want.items():
        if key in meta and meta[key] != value:  # (weights saved without their vocabulary lack vocab_sha256)
            what = {"tree_sha256": "word tree", "vocab_sha256": "vocabulary (same size, other words or order)"}.get(
                key, "vocabulary size"
            )
            raise CheckpointError(f"{path}: these weights were trained with another {what} than this model's")
    if epoch is not None:
        check_epoch(path, meta, epoch)


def _check_layout(path: Path, layout: dict, own: dict[str, tuple[Any, tuple[int, ...]]]) -> None:
    """The file's tensors must be the model's (``own``: (dtype, shape) by name), of its shapes and dtypes."""
    if set(layout) != set(own):
        raise CheckpointError(f"{path}: tensors {sorted(set(layout) ^ set(own))[:4]} do not match the model")
    for k, (dtype, shape) in layout.items():
        if shape != tuple(own[k][1]):
            raise CheckpointError(f"{path}: tensor {k} has shape {shape}, the model {tuple(own[k][1])}")
        if dtype != own[k][0]:  # a silent cast could turn a checked finite float64 into an infinite float32
            raise CheckpointError(f"{path}: tensor {k} is {dtype}, the model's {own[k][0]}")


def _not_finite(path: Path, name: str) -> CheckpointError:
    # safetensors has no checksum: damaged data bytes read as numbers; NaN/inf are the detectable ones
    return CheckpointError(f"{path}: tensor {name} holds NaN or infinite values (a damaged file, or a diverged run)")


def load_arrays(
    path: Path, own: dict[str, tuple[np.dtype, tuple[int, ...]]], want: dict[str, str], epoch: int | None = None
) -> dict[str, np.ndarray]:
    """A weights file read as numpy arrays, without torch, with :func:`load_weights`'s checks: format
    and version, what the weights belong to (``want``: :func:`weights_meta`), the tensors' names,
    shapes and dtypes (``own``: (numpy dtype, shape) by name), finite values and the checksum. One
    pass, a piece at a time, into arrays allocated up front: no second copy of the weights."""
    path = Path(path)
    with _reader(path, WEIGHTS_FORMAT, framework="numpy") as (f, meta, layout):
        _check_owner(path, meta, want, epoch)
        _check_layout(path, layout, own)
        arrays = {k: np.empty(shape, dtype) for k, (dtype, shape) in layout.items()}

        def keep(name: str, lo: int, piece: np.ndarray) -> None:
            if piece.dtype.kind == "f" and not np.isfinite(piece).all():
                raise _not_finite(path, name)
            if piece.ndim:
                arrays[name][lo : lo + len(piece)] = piece
            else:
                arrays[name][...] = piece

        if _read_pieces(path, f, layout, keep) != meta.get("sha256"):
            raise CheckpointError(f"{path}: damaged checkpoint (its data does not match its checksum)")
    return arrays


def save_weights(path: Path, model: nn.Module, epoch: int | None = None, vocab: Vocab | None = None) -> None:
    """``epoch``: the training epoch these weights end (a run's ``last`` checkpoint records it);
    ``vocab``: the vocabulary they were trained with (recorded as its fingerprint)."""
    epoch_meta = {} if epoch is None else {"epoch": str(int(epoch))}
    save_tensors(path, dict(model.state_dict()), meta={**_weights_meta(model, vocab), **epoch_meta})


def write_weights(
    path: str | os.PathLike, model: nn.Module, epoch: int | None = None, vocab: Vocab | None = None
) -> None:
    """:func:`save_weights` without the temporary file (a checkpoint's directory is its own)."""
    epoch_meta = {} if epoch is None else {"epoch": str(int(epoch))}
    write_tensors(path, dict(model.state_dict()), meta={**_weights_meta(model, vocab), **epoch_meta})


def check_epoch(path: Path, meta: dict[str, str], epoch: int) -> None:
    """A checkpoint file must end the epoch its state.json says."""
    if meta.get("epoch") != str(int(epoch)):
        raise CheckpointError(
            f"{path} ends epoch {meta.get('epoch')} but state.json says {epoch}: the run was "
            "stopped while writing its checkpoint; best.safetensors still holds the best weights"
        )


def load_weights(path: Path, model: nn.Module, epoch: int | None = None, vocab: Vocab | None = None) -> None:
    """Load ``path`` into ``model`` (checked); with ``epoch``, the file must end that epoch; with
    ``vocab``, the weights must have been trained with it.

    Two passes over the file, a piece at a time (``PIECE_BYTES``): the first checks it (checksum,
    finite values), the second copies it into the model's own tensors, so a damaged file leaves the
    model untouched and a load needs no second copy of the weights in memory."""
    path = Path(path)
    with _reader(path, WEIGHTS_FORMAT) as (f, meta, layout):
        _load_checked(path, f, meta, layout, model, epoch, vocab)


def _load_checked(
    path: Path, f, meta: dict, layout: dict, model: nn.Module, epoch: int | None, vocab: Vocab | None
) -> None:
    """:func:`load_weights` of the open file ``f``."""
    import torch

    _check_owner(path, meta, _weights_meta(model, vocab), epoch)
    own = model.state_dict()
    _check_layout(path, layout, {k: (v.dtype, tuple(v.shape)) for k, v in own.items()})
    fixed = {}  # the tensors that are not weights (a tree's children table): through load_state_dict's checks

    def check(name: str, lo: int, piece: torch.Tensor) -> None:
        if not piece.is_floating_point():
            fixed[name] = torch.cat([fixed[name], piece]) if lo else piece
        elif not bool(torch.isfinite(piece).all()):
            raise _not_finite(path, name)

    if _read_pieces(path, f, layout, check) != meta.get("sha256"):
        raise CheckpointError(f"{path}: damaged checkpoint (its data does not match its checksum)")
    model.load_state_dict(fixed, strict=False)  # a layer refuses a state of another tree here, before any copy

    def copy(name: str, lo: int, piece: torch.Tensor) -> None:
        if piece.is_floating_point():
            with torch.no_grad():
                (own[name][lo : lo + len(piece)] if piece.dim() else own[name]).copy_(piece)

    _read_pieces(path, f, {k: v for k, v in layout.items() if v[0].is_floating_point}, copy)


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """Split an optimiser state into tensors (for safetensors) and JSON scalars."""
    import torch

    from . import eager  # (imports torch: not at module level, for inference without it)

    sd = eager.state_dict(optimizer)
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
    from . import eager  # (imports torch: not at module level, for inference without it)

    state: dict[int, dict] = {}
    try:
        if not isinstance(meta, dict) or not isinstance(meta.get("scalars"), dict):
            raise ValueError("no scalars object")
        _check_param_groups(eager.state_dict(optimizer)["param_groups"], meta.get("param_groups"))
        for key, v in meta["scalars"].items():
            if not (_is_number(v) and math.isfinite(v)):
                raise ValueError(f"scalar {key} is {_show(v)}")
        for key, v in list(tensors.items()) + list(meta["scalars"].items()):
            idx, k = key.split(".", 1)
            state.setdefault(int(idx), {})[k] = v
        eager.load_state_dict(optimizer, {"state": state, "param_groups": meta["param_groups"]})
    except (ValueError, KeyError, TypeError, AttributeError) as e:  # a damaged or hand-edited state.json
        raise CheckpointError(
            f"optimizer state does not match this model and optimizer, or is damaged ({e!r})"
        ) from None
