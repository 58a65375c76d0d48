"""The byte-level reader of a training file: a numba kernel that splits UTF-8 bytes into lines and
tokens by exactly the text rules of :func:`hlbl.data.vocab.iter_sentences` and numbers the words
in order of first appearance, with their counts, without making a Python string per token.

The rules, as Python applies them (``open(path, encoding="utf-8-sig", newline=None)``, then
``line.split()``), and how the bytes carry them:

- a line ends at ``\\n``, ``\\r\\n`` or a lone ``\\r`` (universal newlines; no other character
  ends a line: U+0085, U+2028 and ``\\x1c``-``\\x1e`` only separate tokens);
- tokens are separated by the characters ``str.isspace`` accepts: ``\\t \\n \\x0b \\x0c \\r
  \\x1c``-``\\x1f`` and space, and U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F,
  U+205F, U+3000 (their UTF-8 forms are matched as byte sequences; ``tests/test_text_kernel.py``
  checks the table against Python's own for every code point);
- a byte-order mark (``EF BB BF``) is dropped at the very start of the file only;
- the bytes must be UTF-8 as Python's strict decoder defines it (no overlong forms, no
  surrogates, nothing above U+10FFFF); the kernel stops at the first bad sequence;
- a line with no token is a blank line: counted, and written as ``<eos>`` (id 0) only if blank
  lines are kept. A line cut into pieces by ``LONG_LINE`` gives the same tokens, as pieces are
  cut at whitespace, so the kernel needs no such cut.

Two tokens are the same word exactly when their bytes are equal (UTF-8 is one encoding per
string), so words are told apart by their bytes: a hash table (open addressing, linear probing,
64-bit FNV-1a hashes) over an arena holding each word's bytes once. ``<eos>`` is word 0 from the
start, so ``<eos>`` written in the text is that word, as in the Python pass.

Why a kernel of our own: the work is a per-byte state machine and a hash table, which numba
compiles to a loop several times faster than ``str.split`` and a dict (no object per token), and
which releases the GIL, so byte ranges of one file are read by threads on every core without
starting interpreters. A Rust or Arrow whitespace tokenizer splits by its own notion of
whitespace, not Python's (:mod:`hlbl.data.scan`), and the ids must be the Python pass's.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from .vocab import EOS

OK, BAD_UTF8 = 0, 1  # scan_block's status
_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)

# ASCII bytes that str.split() takes as whitespace: \t \n \x0b \x0c \r, \x1c-\x1f, space.
ASCII_SPACE = np.zeros(128, np.bool_)
ASCII_SPACE[[9, 10, 11, 12, 13, 28, 29, 30, 31, 32]] = True
ASCII_SPACE.setflags(write=False)


class WordTable(NamedTuple):
    """One reader's words, numbered in order of first appearance (0 = ``<eos>``): a hash table
    over an arena of their bytes. Grown (a new table, returned by ``scan_block``) as it fills."""

    slots: np.ndarray  # (2M,) int32: a word id, -1 = empty (M a power of two: at most half full)
    hashes: np.ndarray  # (M,) uint64: word i's hash, for i < size
    starts: np.ndarray  # (M+1,) int64: word i's bytes are arena[starts[i]:starts[i+1]]
    arena: np.ndarray  # (A,) uint8: the words' bytes, one after another
    counts: np.ndarray  # (M,) int64: how often each word was read
    size: np.ndarray  # (1,) int64: how many words


def new_table(capacity: int = 1 << 12) -> WordTable:
    """An empty table holding ``<eos>`` as word 0 (its count 0: the kernel counts the ends it writes)."""
    table = WordTable(
        slots=np.full(2 * capacity, -1, np.int32),
        hashes=np.zeros(capacity, np.uint64),
        starts=np.zeros(capacity + 1, np.int64),
        arena=np.zeros(8 * capacity, np.uint8),
        counts=np.zeros(capacity, np.int64),
        size=np.zeros(1, np.int64),
    )
    eos = np.frombuffer(EOS.encode(), np.uint8)
    _find_or_add(
        table.slots, table.hashes, table.starts, table.arena, table.size, eos, 0, len(eos), _hash(eos, 0, len(eos))
    )
    return table


def words_of(table: WordTable) -> list[str]:
    """The table's words as strings, by id."""
    n = int(table.size[0])
    raw = table.arena[: table.starts[n]].tobytes()
    s = table.starts[: n + 1].tolist()
    return [raw[a:b].decode("utf-8") for a, b in zip(s, s[1:])]


@njit(cache=True)
def _hash(data, lo, hi):
    h = _FNV_OFFSET
    for i in range(lo, hi):
        h = (h ^ np.uint64(data[i])) * _FNV_PRIME
    return h


@njit(cache=True)
def _grown(table, words, chars):
    """``table`` with room for at least ``words`` words and ``chars`` bytes (sizes doubled; the slots
    rebuilt when the word capacity grows, so they stay at most half full)."""
    slots, hashes, starts, arena, counts, size = table
    if chars > arena.shape[0]:
        new = np.zeros(max(2 * arena.shape[0], chars), np.uint8)
        new[: arena.shape[0]] = arena
        arena = new
    if words > hashes.shape[0]:
        cap = 2 * hashes.shape[0]
        while cap < words:
            cap *= 2
        h2 = np.zeros(cap, np.uint64)
        s2 = np.zeros(cap + 1, np.int64)
        c2 = np.zeros(cap, np.int64)
        n = size[0]
        h2[:n] = hashes[:n]
        s2[: n + 1] = starts[: n + 1]
        c2[:n] = counts[:n]
        hashes, starts, counts = h2, s2, c2
        slots = np.full(2 * cap, -1, np.int32)
        mask = slots.shape[0] - 1
        for i in range(n):
            j = np.int64(hashes[i] & np.uint64(mask))
            while slots[j] >= 0:
                j = (j + 1) & mask
            slots[j] = i
    return WordTable(slots, hashes, starts, arena, counts, size)


@njit(inline="always", cache=True)
def _find_or_add(slots, hashes, starts, arena, size, data, lo, hi, h):
    """The id of the word ``data[lo:hi]`` (hash ``h``), added if new; -1 if it is new and the
    table has no room for it (the caller grows the table and asks again). The table's arrays
    come one by one: this runs once per token, and a tuple passed or returned per call costs a
    reference count per array."""
    n = hi - lo
    mask = slots.shape[0] - 1
    j = np.int64(h & np.uint64(mask))
    while True:
        u = slots[j]
        if u < 0:
            break
        if hashes[u] == h and starts[u + 1] - starts[u] == n:
            a = starts[u]
            same = True
            for k in range(n):
                if arena[a + k] != data[lo + k]:
                    same = False
                    break
            if same:
                return u
        j = (j + 1) & mask
    w = size[0]
    a = starts[w]
    if w + 1 >= hashes.shape[0] or a + n > arena.shape[0]:
        return -1
    slots[j] = w
    hashes[w] = h
    arena[a : a + n] = data[lo:hi]
    starts[w + 1] = a + n
    size[0] = w + 1
    return w


@njit(inline="always", cache=True)
def _char_len(data, i, hi):
    """The length of the UTF-8 character starting with the non-ASCII byte data[i], 0 if the bytes
    there are no valid character (Python's strict decoder's rules)."""
    b = data[i]
    if 0xC2 <= b <= 0xDF:
        n, lo2, hi2 = 2, 0x80, 0xBF
    elif b == 0xE0:
        n, lo2, hi2 = 3, 0xA0, 0xBF
    elif 0xE1 <= b <= 0xEC or b == 0xEE or b == 0xEF:
        n, lo2, hi2 = 3, 0x80, 0xBF
    elif b == 0xED:
        n, lo2, hi2 = 3, 0x80, 0x9F  # (no surrogates)
    elif b == 0xF0:
        n, lo2, hi2 = 4, 0x90, 0xBF
    elif 0xF1 <= b <= 0xF3:
        n, lo2, hi2 = 4, 0x80, 0xBF
    elif b == 0xF4:
        n, lo2, hi2 = 4, 0x80, 0x8F  # (nothing above U+10FFFF)
    else:
        return 0
    if i + n > hi or not lo2 <= data[i + 1] <= hi2:
        return 0
    for k in range(2, n):
        if not 0x80 <= data[i + k] <= 0xBF:
            return 0
    return n


@njit(inline="always", cache=True)
def _wide_space(data, i, n):
    """Whether the valid n-byte character at data[i] is one of str.isspace's non-ASCII characters."""
    b0, b1 = data[i], data[i + 1]
    if n == 2:
        return b0 == 0xC2 and (b1 == 0x85 or b1 == 0xA0)  # U+0085, U+00A0
    if n != 3:
        return False
    b2 = data[i + 2]
    if b0 == 0xE1:
        return b1 == 0x9A and b2 == 0x80  # U+1680
    if b0 == 0xE2:
        if b1 == 0x80:  # U+2000-U+200A, U+2028, U+2029, U+202F
            return b2 <= 0x8A or b2 == 0xA8 or b2 == 0xA9 or b2 == 0xAF
        return b1 == 0x81 and b2 == 0x9F  # U+205F
    return b0 == 0xE3 and b1 == 0x80 and b2 == 0x80  # U+3000


@njit(nogil=True, cache=True)
def scan_block(data, lo, hi, at_file_start, keep, space, table, out):
    """Read the lines of ``data[lo:hi]`` (uint8; ``hi`` just after a line end or at the end of
    the file), writing each token's word id, and 0 (``<eos>``) after each line that has tokens
    (and after each blank line if ``keep``), to ``out`` (int32, at least hi - lo + 1 long: every
    id takes at least one byte, but for the end of a last line without a line end). ``space``:
    ASCII_SPACE. Counts each id written in the table's ``counts``.

    Returns (table, ids written, blank lines, status, position): status OK, or BAD_UTF8 with
    the position of the first byte that is not UTF-8 (nothing after it is read).
    """
    i = lo
    if at_file_start and hi - lo >= 3 and data[lo] == 0xEF and data[lo + 1] == 0xBB and data[lo + 2] == 0xBF:
        i += 3
    state = (i, 0, 0, False, 0)  # (position, ids written, blank lines, in a line, its tokens)
    while True:
        slots, hashes, starts, arena, counts, size = table
        state, status = _scan(data, hi, keep, space, slots, hashes, starts, arena, counts, size, out, state)
        if status != _FULL:
            break
        table = _grown(table, 2 * size[0], 2 * starts[size[0]] + hi - state[0])
    i, n_out, blanks, in_line, line_tokens = state
    if status == OK and in_line:  # a last line without a line end
        if line_tokens > 0 or keep:
            out[n_out] = 0
            n_out += 1
            table.counts[0] += 1
        if line_tokens == 0:
            blanks += 1
    return table, n_out, blanks, status, i


_FULL = 2  # _scan's status: a new word found the table full (grow it, then go on)


@njit(cache=True)
def _scan(data, hi, keep, space, slots, hashes, starts, arena, counts, size, out, state):
    """scan_block's loop from ``state`` (see there) with the table's arrays one by one (none is
    reassigned inside the loop, so the loop takes no reference counts); returns (state, status):
    OK at ``hi``, BAD_UTF8 at a bad byte, or _FULL at the start of a new word with no room."""
    i, n_out, blanks, in_line, line_tokens = state
    while i < hi:
        b = data[i]
        if b == 10 or b == 13:  # the end of a line (\n, \r\n or \r)
            i += 2 if b == 13 and i + 1 < hi and data[i + 1] == 10 else 1
            if line_tokens > 0 or keep:
                out[n_out] = 0
                n_out += 1
                counts[0] += 1
            if line_tokens == 0:
                blanks += 1
            in_line, line_tokens = False, 0
            continue
        in_line = True
        if b < 128:
            if space[b]:
                i += 1
                continue
        else:
            n = _char_len(data, i, hi)
            if n == 0:
                return (i, n_out, blanks, in_line, line_tokens), BAD_UTF8
            if _wide_space(data, i, n):
                i += n
                continue
        start, h = i, _FNV_OFFSET  # a token: up to the next whitespace or line end
        while i < hi:
            b = data[i]
            if b < 128:
                if space[b]:
                    break
                h = (h ^ np.uint64(b)) * _FNV_PRIME
                i += 1
                continue
            n = _char_len(data, i, hi)
            if n == 0:
                return (i, n_out, blanks, in_line, line_tokens), BAD_UTF8
            if _wide_space(data, i, n):
                break
            for k in range(n):
                h = (h ^ np.uint64(data[i + k])) * _FNV_PRIME
            i += n
        w = _find_or_add(slots, hashes, starts, arena, size, data, start, i, h)
        if w < 0:
            return (start, n_out, blanks, in_line, line_tokens), _FULL
        out[n_out] = w
        n_out += 1
        counts[w] += 1
        line_tokens += 1
    return (i, n_out, blanks, in_line, line_tokens), OK
