"""The n-gram model as one safetensors file: what ARPA text holds, without the text.

Writing a 5-gram of a 50M-token corpus as ARPA text means formatting about 10^8 lines in Python
(minutes, and gigabytes of strings); this form is the model's arrays as they are in memory, so
writing and loading run at disk speed. Tensors, per order ``k = 1..N`` (safetensors names count
from 0): ``keys{k-1}`` int64, ``lp{k-1}`` and ``bo{k-1}`` float64, as in :class:`NgramModel`. The
metadata holds ``format`` (``hlbl-ngram``), ``version``, ``words`` (a JSON list, ``<s>`` and
``</s>`` spelled as in ARPA), ``sha256`` (of the tensors and the words: version 2; a file of
version 1 has none) and, for a model estimated here, ``protocol`` (how its text was read:
:mod:`.protocol`). Reading checks the checksum, the structure (:func:`bad_structure`: one
dimension and one length per order, the unigram keys ``0..V'-1``, every order's keys strictly
increasing and naming a stored context) and the values (:func:`bad_value`); each problem is one
line. :func:`hlbl.ngram.read_arpa` recognises the file by its content, so
``hlbl ngram eval`` and ``hlbl eval --interpolate`` take either form.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

import numpy as np

from ..atomic import atomic_path
from ..data import DataError
from .model import MAX_LOG10_BACKOFF, UNIGRAM_MASS_SLACK, NgramModel, unigram_mass
from .protocol import parse_protocol

FORMAT = "hlbl-ngram"
VERSION = "2"  # 2: the sha256 checksum
READS = ("1", "2")


def _digest(words: tuple[str, ...] | list[str], tensors: dict[str, np.ndarray]) -> str:
    """SHA-256 of the words and of each tensor's name, dtype, shape and bytes, in name order."""
    h = hashlib.sha256(json.dumps(list(words), ensure_ascii=False).encode("utf-8"))
    for name in sorted(tensors):
        t = np.ascontiguousarray(tensors[name])
        h.update(f"\0{name}:{t.dtype.str}:{t.shape}\0".encode())
        h.update(t.data)
    return h.hexdigest()


def write_binary(model: NgramModel, path: str | os.PathLike) -> None:
    """Write ``model`` as one safetensors file (atomically: a temporary file, then a rename)."""
    from safetensors.numpy import save_file

    tensors: dict[str, np.ndarray] = {}
    for k in range(model.order):
        tensors[f"keys{k}"] = np.ascontiguousarray(model.keys[k], dtype=np.int64)
        tensors[f"lp{k}"] = np.ascontiguousarray(model.log10_prob[k], dtype=np.float64)
        tensors[f"bo{k}"] = np.ascontiguousarray(model.log10_backoff[k], dtype=np.float64)
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "words": json.dumps(list(model.words), ensure_ascii=False),
        "sha256": _digest(model.words, tensors),
    }
    if model.protocol is not None:  # how the text was read (hlbl.ngram.protocol)
        meta["protocol"] = json.dumps(model.protocol, sort_keys=True)
    with atomic_path(Path(path)) as tmp:
        save_file(tensors, str(tmp), metadata=meta)


def is_binary(path: str | os.PathLike) -> bool:
    """Whether ``path`` starts like a safetensors file (8-byte header length, then a JSON object);
    an ARPA file starts with text."""
    try:
        with open(path, "rb") as f:
            head = f.read(9)
    except OSError:
        return False
    return len(head) == 9 and head[8:9] == b"{" and 0 < struct.unpack("<Q", head[:8])[0] < 1 << 30


def read_binary(path: str | os.PathLike) -> NgramModel:
    """Load a file written by :func:`write_binary`; one-line errors for anything else."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
            if meta.get("format") != FORMAT:
                raise DataError(f"{path}: not an hlbl n-gram model (format {meta.get('format')!r})")
            if meta.get("version") not in READS:
                raise DataError(f"{path}: n-gram model version {meta.get('version')!r} is not supported")
            words = json.loads(meta["words"])
            protocol = parse_protocol(meta["protocol"], str(path)) if "protocol" in meta else None
            arrays = {n: f.get_tensor(n) for n in f.keys()}
        if meta["version"] != "1" and _digest(words, arrays) != meta.get("sha256"):
            raise DataError(f"{path}: damaged n-gram model (its data does not match its checksum)")
        if not (isinstance(words, list) and all(isinstance(w, str) for w in words) and len(set(words)) == len(words)):
            raise ValueError("the words are not a list of distinct strings")
        order = sum(1 for n in arrays if n.startswith("keys"))
        if set(arrays) != {f"{t}{k}" for t in ("keys", "lp", "bo") for k in range(order)}:
            raise ValueError(f"tensors {sorted(arrays)[:6]} are not keys, lp and bo of each order")
        model = NgramModel(
            tuple(words),
            [arrays[f"keys{k}"] for k in range(order)],
            [arrays[f"lp{k}"] for k in range(order)],
            [arrays[f"bo{k}"] for k in range(order)],
            protocol=protocol,
        )
    except (SafetensorError, OSError, KeyError, ValueError, TypeError) as e:
        raise DataError(
            f"{path}: damaged n-gram model ({str(e).splitlines()[0] if str(e) else type(e).__name__})"
        ) from None
    problem = bad_structure(model)
    if problem:
        raise DataError(f"{path}: damaged n-gram model ({problem})")
    problem = bad_value(model)
    if problem:
        raise DataError(f"{path}: {problem}")
    model.source = str(path)
    return model


def bad_structure(model: NgramModel) -> str | None:
    """What makes ``model``'s tables no model's (see :class:`NgramModel`), in words, or None."""
    V = model.base
    for k in range(model.order):
        keys, lp, bo = model.keys[k], model.log10_prob[k], model.log10_backoff[k]
        if keys.ndim != 1 or lp.ndim != 1 or bo.ndim != 1 or not len(keys) == len(lp) == len(bo):
            return f"order {k + 1}: tables of different shapes"
        if keys.dtype != np.int64 or lp.dtype != np.float64 or bo.dtype != np.float64:
            return f"order {k + 1}: tables of types {keys.dtype}, {lp.dtype}, {bo.dtype}, not int64 and float64"
        if k == 0:
            if len(keys) != V or not np.array_equal(keys, np.arange(V)):
                return f"{len(keys)} unigrams for {V} words"
            continue
        if len(keys) and (keys[0] < 0 or keys[-1] >= len(model.keys[k - 1]) * V):
            return f"order {k + 1}: a key names no stored {k}-gram context"
        if np.any(keys[1:] <= keys[:-1]):
            return f"order {k + 1}: the keys are not in increasing order"
        if np.any(keys % V == model.bos):
            return f"order {k + 1}: an n-gram predicts <s>"
    return None


def bad_value(model: NgramModel) -> str | None:
    """The first value no model has, in words (the checks of the ARPA reader)."""
    for k in range(model.order):
        lp, bo = model.log10_prob[k], model.log10_backoff[k]
        bad = np.flatnonzero(~(np.isfinite(lp) | (lp == -np.inf)) | (lp > 0))
        if len(bad):
            return f"order {k + 1} entry {bad[0] + 1}: log10 probability {lp[bad[0]]} is above 0 or not a number"
        bad = np.flatnonzero(~(np.abs(bo) <= MAX_LOG10_BACKOFF))  # (NaN too)
        if len(bad):
            return (
                f"order {k + 1} entry {bad[0] + 1}: log10 back-off {bo[bad[0]]} is out of range "
                f"(-{MAX_LOG10_BACKOFF:g} to {MAX_LOG10_BACKOFF:g})"
            )
    if unigram_mass(model.log10_prob[0]) > 1 + UNIGRAM_MASS_SLACK:
        return f"the unigram probabilities sum to {unigram_mass(model.log10_prob[0]):.6g}, more than 1"
    return None
