"""Reading and writing ARPA back-off language model files.

Format (Doug Paul's; what SRILM and KenLM write)::

    \\data\\
    ngram 1=<count>
    ...
    ngram N=<count>

    \\1-grams:
    <log10 prob>\\t<w1>\\t<log10 backoff>       (the back-off is optional)
    ...
    \\N-grams:
    <log10 prob>\\t<w1 .. wN>                    (no back-off at the highest order)

    \\end\\

Fields may be separated by any whitespace. Reading checks the header counts, the number of
fields of every line, the numbers, and that every word of a higher-order n-gram is a unigram;
each problem is one :class:`ArpaError` line naming the file and line number. Where a file lacks
the context of one of its n-grams (SRILM pruning can do that), the context is added as a
"blank" entry: back-off 0 and the probability the back-off rule would give it, which leaves
every score unchanged (KenLM does the same). A missing ``<unk>`` gets log10 probability -100
and a missing ``<s>`` is added as a context-only word, also as KenLM does.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from ..data import DataError
from .model import BOS_WORD, UNK_WORD, NgramModel


class ArpaError(DataError):
    """A malformed ARPA file; the message names the file and line."""


# Probabilities are written with 8 significant digits: well under 1e-6 in any log10 value,
# more than the float32 that KenLM keeps.
_FMT = "{:.8g}"


def write_arpa(model: NgramModel, path: str | os.PathLike) -> None:
    """Write ``model`` as an ARPA file (atomically: a temporary file, then a rename)."""
    path = Path(path)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    words = list(model.words)
    try:
        with open(tmp, "w", encoding="utf-8", newline="\n") as f:
            f.write("\\data\\\n")
            for k, n in enumerate(model.sizes(), 1):
                f.write(f"ngram {k}={n}\n")
            text: list[str] = words
            for k in range(1, model.order + 1):
                if k > 1:
                    # The k-gram's text is its context row's text plus its last word.
                    ctx, w = np.divmod(model.keys[k - 1], model.base)
                    prev = text
                    text = [prev[c] + " " + words[x] for c, x in zip(ctx.tolist(), w.tolist())]
                f.write(f"\n\\{k}-grams:\n")
                lp = model.log10_prob[k - 1].tolist()
                bo = model.log10_backoff[k - 1]
                # An n-gram is written with a back-off when it is a context (weight != 1), and
                # in any case below the top order, except where it cannot be one (ends in </s>).
                has_bo = (bo != 0.0).tolist() if k < model.order else [False] * len(lp)
                bo = bo.tolist()
                fmt = _FMT.format
                lines = [
                    f"{fmt(p)}\t{t}\t{fmt(b)}\n" if h else f"{fmt(p)}\t{t}\n"
                    for p, t, b, h in zip(lp, text, bo, has_bo)
                ]
                f.writelines(lines)
            f.write("\n\\end\\\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _parse_float(s: str, where: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise ArpaError(f"{where}: {s!r} is not a number") from None
    if math.isnan(v):
        raise ArpaError(f"{where}: {s!r} is not a number")
    return v


def read_arpa(path: str | os.PathLike) -> NgramModel:
    """Load an ARPA file into an :class:`NgramModel` (word ids in unigram-section order)."""
    path = Path(path)
    if path.is_dir():
        raise ArpaError(f"{path} is a directory, expected an ARPA file")
    if not path.exists():
        raise ArpaError(f"{path}: no such file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ArpaError(f"{path}: not UTF-8 text (bad byte at offset {e.start})") from None
    return parse_arpa(text, str(path))


def parse_arpa(text: str, name: str = "<arpa>") -> NgramModel:
    """Parse ARPA text; ``name`` is used in error messages."""
    lines = text.splitlines()
    nlines = len(lines)
    i = 0

    def where(j: int) -> str:
        return f"{name}:{j + 1}"

    def skip_blank(j: int) -> int:
        while j < nlines and not lines[j].strip():
            j += 1
        return j

    i = skip_blank(i)
    if i >= nlines or lines[i].strip() != "\\data\\":
        raise ArpaError(f"{where(min(i, max(nlines - 1, 0)))}: expected the \\data\\ header of an ARPA file")
    i += 1
    counts: list[int] = []
    while i < nlines and lines[i].strip().startswith("ngram "):
        spec = lines[i].strip()[len("ngram "):]
        k_s, _, n_s = spec.partition("=")
        try:
            k, n = int(k_s), int(n_s)
        except ValueError:
            raise ArpaError(f"{where(i)}: expected 'ngram K=COUNT', got {lines[i].strip()!r}") from None
        if k != len(counts) + 1 or n < 0:
            raise ArpaError(f"{where(i)}: expected 'ngram {len(counts) + 1}=COUNT', got {lines[i].strip()!r}")
        counts.append(n)
        i += 1
    if not counts:
        raise ArpaError(f"{where(min(i, nlines - 1))}: the \\data\\ section lists no 'ngram K=COUNT' line")
    if counts[0] == 0:
        raise ArpaError(f"{where(1)}: the model has no unigrams")

    # Per order: (first line number, list of split rows).
    sections: list[tuple[int, list[list[str]]]] = []
    for k, n in enumerate(counts, 1):
        i = skip_blank(i)
        header = f"\\{k}-grams:"
        if k > 1 and i < nlines and not lines[i].lstrip().startswith("\\"):
            raise ArpaError(f"{where(i)}: more {k - 1}-grams than the header's {counts[k - 2]}")
        if i >= nlines or lines[i].strip() != header:
            got = lines[i].strip() if i < nlines else "the end of the file"
            raise ArpaError(f"{where(min(i, nlines - 1))}: expected {header}, got {got!r}")
        i += 1
        start = i
        rows = [ln.split() for ln in lines[start:start + n]]
        if len(rows) < n or any(not r or r[0].startswith("\\") for r in rows):
            bad = next((j for j, r in enumerate(rows) if not r or r[0].startswith("\\")), len(rows))
            raise ArpaError(
                f"{where(start + bad)}: the header promises {n} {k}-grams, the section has {bad}"
            )
        sections.append((start, rows))
        i = start + n
    i = skip_blank(i)
    if i >= nlines or lines[i].strip() != "\\end\\":
        got = lines[i].strip() if i < nlines else "the end of the file"
        if i < nlines and not got.startswith("\\"):
            raise ArpaError(f"{where(i)}: more {len(counts)}-grams than the header's {counts[-1]}")
        raise ArpaError(f"{where(min(i, nlines - 1))}: expected \\end\\, got {got!r}")
    return _build(sections, len(counts), name)


def _columns(start: int, rows: list[list[str]], k: int, name: str, top: bool):
    """Check field counts and numbers of one section; return (log10 prob, backoff, word columns)."""
    lens = {len(r) for r in rows}
    allowed = {k + 1} if top else {k + 1, k + 2}
    if not lens <= allowed:
        j = next(j for j, r in enumerate(rows) if len(r) not in allowed)
        shape = f"log10-prob, {k} word{'s' if k > 1 else ''}" + ("" if top else ", optional back-off")
        raise ArpaError(f"{name}:{start + j + 1}: expected a {k}-gram line ({shape}), got {len(rows[j])} fields")
    try:
        lp = np.asarray([r[0] for r in rows], dtype=np.float64)
        bo = np.asarray([r[k + 1] if len(r) == k + 2 else "0" for r in rows], dtype=np.float64)
    except ValueError:
        for j, r in enumerate(rows):
            _parse_float(r[0], f"{name}:{start + j + 1}")
            if len(r) == k + 2:
                _parse_float(r[k + 1], f"{name}:{start + j + 1}")
        raise  # pragma: no cover (one of the rows failed above)
    for arr, what in ((lp, "probability"), (bo, "back-off")):
        bad = np.flatnonzero(~np.isfinite(arr) | ((arr > 0) if what == "probability" else False))
        if len(bad):
            j = int(bad[0])
            raise ArpaError(f"{name}:{start + j + 1}: bad log10 {what} {rows[j][0] if what == 'probability' else rows[j][k + 1]!r}")
    return lp, bo, [[r[1 + c] for r in rows] for c in range(k)]


def _build(sections, order: int, name: str) -> NgramModel:
    # Unigrams: word ids are positions in the section.
    start, rows = sections[0]
    lp1, bo1, (words,) = _columns(start, rows, 1, name, order == 1)
    index: dict[str, int] = {}
    for j, w in enumerate(words):
        if w in index:
            raise ArpaError(f"{name}:{start + j + 1}: the unigram {w!r} appears twice")
        index[w] = j
    words = list(words)
    lp1, bo1 = list(lp1), list(bo1)
    if UNK_WORD not in index:
        index[UNK_WORD] = len(words)
        words.append(UNK_WORD)
        lp1.append(-100.0)
        bo1.append(0.0)
    if BOS_WORD not in index:
        index[BOS_WORD] = len(words)
        words.append(BOS_WORD)
        lp1.append(-99.0)
        bo1.append(0.0)
    base = len(words)
    model = NgramModel(
        tuple(words), [np.arange(base, dtype=np.int64)], [np.asarray(lp1)], [np.asarray(bo1)]
    )

    # Word-id matrices of every higher order, checked against the unigrams.
    mats: list[np.ndarray] = []
    cols_of: list[tuple[np.ndarray, np.ndarray]] = []
    for k in range(2, order + 1):
        start, rows = sections[k - 1]
        lp, bo, cols = _columns(start, rows, k, name, k == order)
        mat = np.empty((len(rows), k), dtype=np.int64)
        for c, col in enumerate(cols):
            try:
                mat[:, c] = [index[w] for w in col]
            except KeyError:
                j = next(j for j, w in enumerate(col) if w not in index)
                raise ArpaError(f"{name}:{start + j + 1}: the word {col[j]!r} is not among the unigrams") from None
        mats.append(mat)
        cols_of.append((lp, bo))

    # Build orders bottom-up. Order k holds its own lines plus the k-word prefixes (contexts)
    # of every longer n-gram that are missing from the file ("blanks"). prefix_row[m] is, for
    # each line of order m+2 and up, the row of its current prefix in the table just built.
    prefix_row = [mat[:, 0].copy() for mat in mats]
    for k in range(2, order + 1):
        own = mats[k - 2]
        start = sections[k - 1][0]
        lp, bo = cols_of[k - 2]
        # Keys of this order's own lines (their context rows are final now).
        own_ctx = prefix_row[k - 2]
        if np.any(own_ctx < 0):  # pragma: no cover (blanks below make every context exist)
            raise ArpaError(f"{name}: internal error: a {k}-gram context is missing")
        own_keys = own_ctx * base + own[:, k - 1]
        order_idx = np.argsort(own_keys, kind="stable")
        sk = own_keys[order_idx]
        dup = np.flatnonzero(sk[1:] == sk[:-1])
        if len(dup):
            j = int(order_idx[dup[0] + 1])
            raise ArpaError(f"{name}:{start + j + 1}: the {k}-gram {' '.join(words[x] for x in own[j])!r} appears twice")
        # Prefixes of length k of all longer lines.
        longer = [(m, prefix_row[m - 2] * base + mats[m - 2][:, k - 1]) for m in range(k + 1, order + 1)]
        pre = np.unique(np.concatenate([p for _, p in longer])) if longer else np.zeros(0, np.int64)
        missing = pre[~np.isin(pre, sk)]
        keys = np.concatenate([own_keys, missing])
        prob = np.concatenate([lp, np.zeros(len(missing))])
        back = np.concatenate([bo, np.zeros(len(missing))])
        if len(missing):
            # Blank n-grams: the probability the back-off rule gives with the lower orders.
            ctx_rows, last = np.divmod(missing, base)
            win = _rows_text_ids(model, ctx_rows, k - 1)
            win = np.concatenate([win, last[:, None]], axis=1)
            prob[len(own_keys):] = model.score_windows(win, max_order=k - 1)
        srt = np.argsort(keys, kind="stable")
        model.keys.append(keys[srt])
        model.log10_prob.append(prob[srt])
        model.log10_backoff.append(back[srt])
        for m, p in longer:
            prefix_row[m - 2] = np.searchsorted(model.keys[k - 1], p)
        prefix_row[k - 2] = np.searchsorted(model.keys[k - 1], own_keys)
    return model


def _rows_text_ids(model: NgramModel, rows: np.ndarray, k: int) -> np.ndarray:
    """(L, k) word ids of the given rows of the order-``k`` table (walk the context chain)."""
    out = np.empty((len(rows), k), dtype=np.int64)
    cur = np.asarray(rows, dtype=np.int64)
    for m in range(k, 1, -1):
        cur, out[:, m - 1] = np.divmod(model.keys[m - 1][cur], model.base)
    out[:, 0] = cur
    return out
