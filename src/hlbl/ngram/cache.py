"""An n-gram model file named by its content, and its scores of split streams cached on disk.

Mixing a neural run with an n-gram model scores the valid and test splits with the n-gram model
on every ``hlbl eval --interpolate``; the scores depend only on the model file's bytes, the
split's token ids, the vocabulary the ids belong to and the scoring protocol, so they are kept in
the hlbl cache (``$HLBL_CACHE/ngram-scores``) under a key made of exactly those: the file's
SHA-256, :func:`hlbl.data.stream_fingerprint` of the split, a SHA-256 of the vocabulary's words
and :data:`SCORES_VERSION`. A path, size or timestamp is no part of the key, so a replaced file
is never answered from a stale entry, and a moved or copied one still finds its entry.

An entry is one safetensors file (no pickle), written atomically: the (N,) float64 log10
probabilities exactly as :func:`~hlbl.ngram.model.stream_log10` gives them, so a cached score is
bit-for-bit the one computed, and in its metadata how many of the vocabulary's words the model
lacks (the check a mixture makes, answered without reading the model), and a SHA-256 of the
scores. An entry whose scores do not match their checksum, or hold a value no probability has
(above 0, NaN), is damaged, and a damaged entry is computed again; a cache that cannot be written is not used (scores are still returned).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from ..atomic import atomic_path
from ..data import DataError, default_cache_dir, stream_fingerprint
from ..files import file_sha256, refuse_special
from .binary import is_binary
from .model import LN10, NgramModel, stream_log10
from .protocol import arpa_protocol, parse_protocol

logger = logging.getLogger(__name__)

SCORES_FORMAT = "hlbl-ngram-scores"
SCORES_VERSION = 2  # part of every key (2: entries carry a checksum): raise it when the same model and stream would score differently


def words_sha256(words: Sequence[str]) -> str:
    """SHA-256 of a vocabulary's words in id order (the ids of a stream mean these words)."""
    return hashlib.sha256("\n".join(words).encode("utf-8")).hexdigest()


def read_protocol(path: str | os.PathLike) -> dict | None:
    """The record of an n-gram model file (ARPA or binary), reading only its head; None if it has none."""
    refuse_special(path, DataError, "an n-gram model file")  # (a named pipe would block the read)
    if is_binary(path):
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(path), framework="numpy") as f:
                text = (f.metadata() or {}).get("protocol")
        except (SafetensorError, OSError):
            return None  # (reading the model says what is wrong with it)
        return parse_protocol(text, str(path)) if text else None
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 16)
    except OSError:
        return None
    return arpa_protocol(head, str(path))


class NgramFile:
    """An n-gram model file (ARPA or hlbl's binary form): its digest and its model, each computed
    once and only when asked, so that scores found in the cache cost no reading of the model."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        refuse_special(self.path, DataError, "an n-gram model file")
        if self.path.is_dir():
            raise DataError(f"{self.path} is a directory, expected an n-gram model file")
        if not self.path.exists():
            raise DataError(f"{self.path}: no such file")
        self._digest: str | None = None
        self._model: NgramModel | None = None
        self._protocol: tuple[dict | None] | None = None

    @property
    def protocol(self) -> dict | None:
        """The token protocol and vocabulary rule the file records (:mod:`.protocol`), or None."""
        if self._protocol is None:
            self._protocol = (self._model.protocol if self._model is not None else read_protocol(self.path),)
        return self._protocol[0]

    @property
    def digest(self) -> str:
        if self._digest is None:
            self._digest = file_sha256(self.path)
        return self._digest

    @property
    def model(self) -> NgramModel:
        if self._model is None:
            from .arpa import read_arpa

            self._model = read_arpa(self.path)
        return self._model

    def missing_words(self, words: Sequence[str]) -> tuple[int, str | None]:
        """How many of a vocabulary's words (``<unk>`` aside) the model lacks, and the first one."""
        from ..data import UNK

        as_unk = self.model.vocab_map(words) == self.model.unk
        as_unk[[i for i, w in enumerate(words) if w == UNK]] = False
        missing = np.flatnonzero(as_unk)
        return len(missing), (words[int(missing[0])] if len(missing) else None)

    def stream_log10(
        self, stream: np.ndarray, words: Sequence[str], eos: int, cache: bool = True
    ) -> tuple[np.ndarray, tuple[int, str | None]]:
        """(N,) log10 probability of every token of a split stream (ids of ``words``), and
        :meth:`missing_words` of ``words``; from the cache when an entry has them."""
        where = _entry(self.digest, stream, words, eos) if cache else None
        found = _read_entry(where, len(stream)) if where is not None else None
        if found is not None:
            return found
        lp = stream_log10(self.model, stream, words, eos)
        missing = self.missing_words(words)
        if where is not None:
            _write_entry(where, lp, missing, self)
        return lp, missing

    def stream_log_probs(self, stream: np.ndarray, vocab, cache: bool = True) -> np.ndarray:
        """(N,) natural-log probabilities of a split stream of ``vocab``'s ids (cached)."""
        return self.stream_log10(stream, vocab.words, vocab.eos, cache)[0] * LN10


def _entry(digest: str, stream: np.ndarray, words: Sequence[str], eos: int) -> Path:
    key = json.dumps([SCORES_VERSION, digest, stream_fingerprint(stream), words_sha256(words), int(eos)])
    return default_cache_dir() / "ngram-scores" / (hashlib.sha256(key.encode()).hexdigest()[:32] + ".safetensors")


def _read_entry(where: Path, n: int) -> tuple[np.ndarray, tuple[int, str | None]] | None:
    """An entry's scores and missing-word count, or None if absent, damaged or of another length."""
    if not where.is_file():
        return None
    try:
        from safetensors import SafetensorError, safe_open
    except ImportError:  # pragma: no cover - safetensors is a dependency
        return None
    try:
        with safe_open(str(where), framework="numpy") as f:
            meta = f.metadata() or {}
            lp = f.get_tensor("log10_prob")
        missing = json.loads(meta["missing_words"])
        ok = meta.get("format") == SCORES_FORMAT and lp.dtype == np.float64 and lp.shape == (n,)
        ok = ok and meta.get("sha256") == _scores_sha256(lp) and not np.any(~(lp <= 0))  # (NaN too)
        if ok and isinstance(missing, list) and len(missing) == 2 and isinstance(missing[0], int):
            return lp, (missing[0], missing[1])
    except (SafetensorError, OSError, KeyError, ValueError):
        pass
    logger.info("n-gram score cache entry %s is damaged: scoring again", where)
    return None


def _scores_sha256(lp: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(lp, dtype="<f8").tobytes()).hexdigest()


def _write_entry(where: Path, lp: np.ndarray, missing: tuple[int, str | None], source: NgramFile) -> None:
    """Best effort: a cache that cannot be written only costs the next run the scoring again."""
    from safetensors.numpy import save_file

    meta = {
        "format": SCORES_FORMAT,
        "version": str(SCORES_VERSION),
        "missing_words": json.dumps(list(missing)),
        "ngram_sha256": source.digest,
        "sha256": _scores_sha256(lp),
        "ngram_file": str(source.path),  # for a person looking in the cache; no part of the key
    }
    try:
        where.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(where) as tmp:
            save_file({"log10_prob": np.ascontiguousarray(lp, dtype=np.float64)}, tmp, metadata=meta)
    except OSError as e:
        logger.info("cannot cache n-gram scores in %s (%s): they are computed again next time", where, e)
