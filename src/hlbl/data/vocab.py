"""Text rules and the vocabulary: how a corpus file becomes sentences of tokens, and tokens ids.

Rules applied to every file of a corpus (UTF-8 text, one sentence a line, tokens separated by
whitespace):

* line endings ``\\n``, ``\\r\\n`` and ``\\r`` are all accepted, at any line length; a leading
  byte-order mark is dropped (``hlbl score`` and ``hlbl predict`` read standard input by these
  rules too: :mod:`hlbl.lines`);
* a blank line (nothing but whitespace) is dropped by default (``blank_lines="drop"``): it is not a
  sentence and gets no ``<eos>``. ``blank_lines="keep"`` is the protocol of WikiText's published
  perplexities (and of KenLM fed the same file): every line, blank or not, gets one ``<eos>``, so
  a blank line is an empty sentence. A run records its protocol, an n-gram model file too
  (:mod:`hlbl.ngram.protocol`), and reports say which was used;
* every other line is its tokens followed by one ``<eos>``;
* a token not in the vocabulary becomes ``<unk>``. Reports count these (``oov``) apart from the
  ``<unk>`` tokens the text itself holds (``unk_in_text``: PTB's preprocessing wrote them).

The vocabulary comes from the training split alone, most frequent first (ties by the word's
text, so it does not depend on dict order). ``<eos>`` and ``<unk>`` are always in it. If the
training text itself contains ``<unk>`` (PTB does), it is an ordinary word with its own count,
not a second unknown token.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from ..config import BLANK_LINES  # what a blank line of a corpus file is (module docstring)
from ..errors import ConfigError, DataError
from ..progress import progress

EOS = "<eos>"
UNK = "<unk>"
VOCAB_FORMAT = "hlbl-vocab"
VOCAB_VERSION = 1

PROGRESS_BYTES = 32 << 20  # files at least this large show a progress bar while read (if stderr is a terminal)
LONG_LINE = 1 << 20  # characters: longer lines are split into pieces of about this size


# --------------------------------------------------------------------------------------------
# The text protocol


@dataclass(frozen=True)
class TextProtocol:
    """How a corpus's text becomes tokens and which words are the vocabulary: the one value that
    a run (run.json's ``text``), the corpus cache (its keys) and an n-gram model file
    (:mod:`hlbl.ngram.protocol`) record, and that :meth:`check_same` compares where models meet.

    ``blank_lines``: what a blank line is (module docstring); ``max_vocab`` (None: no cap) and
    ``min_count`` (a count, or ``"auto"``: :meth:`Vocab.from_counts`): the vocabulary cut. A new
    rule is one field here, its use in :func:`iter_sentences` and its flag (hlbl.cli.common)."""

    blank_lines: str = "drop"
    max_vocab: int | None = None
    min_count: int | str = "auto"

    def __post_init__(self):
        if self.blank_lines not in BLANK_LINES:
            raise ConfigError(
                "blank_lines",
                f"blank_lines must be one of {', '.join(BLANK_LINES)} (how blank lines are read), got {self.blank_lines!r}",
            )
        if self.max_vocab is not None and (
            isinstance(self.max_vocab, bool) or not isinstance(self.max_vocab, int) or self.max_vocab < 2
        ):
            raise ConfigError("max_vocab", f"max_vocab must be at least 2 (<eos> and <unk>), got {self.max_vocab!r}")
        if self.min_count != "auto" and (
            isinstance(self.min_count, bool) or not isinstance(self.min_count, int) or self.min_count < 1
        ):
            raise ConfigError("min_count", f"min_count must be a positive whole number or auto, got {self.min_count!r}")

    def to_json(self) -> dict:
        return {"blank_lines": self.blank_lines, "max_vocab": self.max_vocab, "min_count": self.min_count}

    @classmethod
    def from_json(cls, obj, name: str) -> "TextProtocol":
        """The protocol :meth:`to_json` wrote, every field required; one-line DataError naming ``name``."""
        keys = set(cls().to_json())
        if not isinstance(obj, dict) or not keys <= set(obj):
            missing = sorted(keys - set(obj)) if isinstance(obj, dict) else []
            raise DataError(f"{name}: damaged text protocol (missing {', '.join(missing) or 'a JSON object'})")
        try:
            return cls(**{k: obj[k] for k in keys})
        except ConfigError as e:
            raise DataError(f"{name}: damaged text protocol ({e})") from None

    def reading(self, blank_lines: str | None) -> "TextProtocol":
        """This protocol, read with another blank-line rule where one is given (None: its own)."""
        return self if blank_lines is None else replace(self, blank_lines=blank_lines)

    def check_same(self, other: "TextProtocol", mine: str, theirs: str, setting: str = "blank_lines") -> None:
        """Refuse to pair ``mine`` (read with this protocol) with ``theirs`` (estimated with
        ``other``): their tokens would not line up. The one place where protocols are compared
        (mixtures, ``eval --interpolate``, ``score`` and ``serve`` with an n-gram model, ``ngram
        eval``). Only the blank-line rule is compared: each model has its own vocabulary cut, and
        a word outside a vocabulary is its ``<unk>``. ``setting``: how the message names the rule."""
        if other.blank_lines != self.blank_lines:
            raise DataError(
                f"{theirs} was estimated with {setting} {other.blank_lines}; {mine} is read with {setting} "
                f"{self.blank_lines}: use {setting} {other.blank_lines}, or a model estimated with {self.blank_lines}"
            )


# --------------------------------------------------------------------------------------------
# Reading text


def line_pieces(line: str) -> Iterator[list[str]]:
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
    path: Path, desc: str | None = None, blank_lines: str = TextProtocol.blank_lines, stats: dict | None = None
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
                for tokens in line_pieces(line):
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
        raise DataError(f"{path}: not UTF-8 text ({first_bad_byte(path)})") from None
    finally:
        bar.close()
        if stats is not None:
            stats["blank_lines"] = blanks


def first_bad_byte(path: Path) -> str:
    """Where a file stops being UTF-8 (the decoder works in blocks, so its own position is no line)."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as e:
                return f"bad byte 0x{raw[e.start]:02x} on line {lineno}, byte {e.start + 1} of the line"
    return "a bad byte"


def count_file(path: Path, blank_lines: str = TextProtocol.blank_lines) -> Counter:
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
            raise ConfigError("max_vocab", "max_vocab must be at least 2 (<eos> and <unk>)")
        if min_count == "auto":
            min_count = 1 if counts.get(UNK, 0) > 0 else 2
        if isinstance(min_count, bool) or not isinstance(min_count, int) or min_count < 1:
            raise ConfigError(
                "min_count",
                f"min_count must be a positive whole number or auto, got {min_count!r}",
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
        """Inverse of :meth:`to_json`."""
        if not isinstance(obj, dict):
            raise DataError("malformed vocabulary: not a JSON object")
        if obj.get("format") != VOCAB_FORMAT:
            raise DataError(f"not an hlbl vocabulary (format {obj.get('format')!r}, expected {VOCAB_FORMAT!r})")
        if obj.get("version") != VOCAB_VERSION:
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
