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

Lines starting with ``#`` may come before ``\\data\\`` (KenLM allows exactly these); the one
starting ``# hlbl-ngram-protocol`` records how the model's text was read (:mod:`.protocol`), and
:func:`write_arpa` writes it for a model that carries the record. Fields may be separated by any
whitespace. Reading checks the header counts, the number of
fields of every line, the numbers, and that every word of a higher-order n-gram is a unigram;
each problem is one :class:`ArpaError` line naming the file and line number. Numbers are plain
decimals (``-1.5``, ``-2e-05``: no ``_``, ``nan`` or ``inf``; a log10 probability may be ``-inf``,
probability 0), and a value no model has is refused as the malformed line it is: a log10
probability above 0, a log10 back-off beyond +-100 (:data:`MAX_LOG10_BACKOFF`), unigram
probabilities summing to more than 1 (:data:`UNIGRAM_MASS_SLACK`). Where a file lacks
the context of one of its n-grams (SRILM pruning can do that), the context is added as a
"blank" entry: back-off 0 and the probability the back-off rule would give it, which leaves
every score unchanged (KenLM does the same). A missing ``<unk>`` gets log10 probability -100
and a missing ``<s>`` is added as a context-only word, also as KenLM does.

Parsing PTB's 5-gram file (100 MB) takes seconds, so :func:`read_arpa` keeps a binary copy of
each model it parses in the hlbl cache (``$HLBL_CACHE/arpa/*.npz``, keyed by the SHA-256 of the
file's bytes: a file edited in place, whatever its size and timestamp, is parsed again, and a copy
of it elsewhere finds the entry) and :func:`write_arpa` leaves one for the file it writes; an
unchanged file is then loaded in a fraction of a second (hashing 100 MB takes a fraction of a
second too). An entry that is damaged (a flipped byte fails the zip format's CRC, a truncation its
directory) or whose tables are not a model's is parsed again and rewritten, never an error.
``cache=False`` turns this off.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from ..atomic import atomic_path
from ..data import DataError, default_cache_dir
from ..files import file_sha256, refuse_special
from ..progress import progress
from .protocol import ARPA_TAG, arpa_line, parse_protocol
from .model import BOS_WORD, MAX_LOG10_BACKOFF, UNIGRAM_MASS_SLACK, UNK_WORD, NgramModel, unigram_mass


class ArpaError(DataError):
    """A malformed ARPA file; the message names the file and line."""


# Probabilities are written with 8 significant digits: well under 1e-6 in any log10 value,
# more than the float32 that KenLM keeps.
_FMT = "{:.8g}"


def write_arpa(model: NgramModel, path: str | os.PathLike, cache: bool = True, chunk: int = 1 << 18) -> None:
    """Write ``model`` as an ARPA file (atomically: a temporary file, then a rename).

    With ``cache``, the binary copy that :func:`read_arpa` would make is stored too, holding
    the values exactly as written (8 digits), so reading the file back is instant and gives
    what parsing it would.
    """
    path = Path(path)
    words = list(model.words)
    fmt = _FMT.format
    written_lp: list[np.ndarray] = []
    written_bo: list[np.ndarray] = []
    bar = progress(sum(model.sizes()), "writing ARPA", "lines", heartbeat=True)
    try:
        with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as f:
            if model.protocol is not None:  # a comment line other readers skip (hlbl.ngram.protocol)
                f.write(arpa_line(model.protocol))
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
                bo = model.log10_backoff[k - 1]
                # A back-off is written where it is not 0 (weight 1): never at the top order,
                # nor for n-grams that are no context (ending in </s>, say).
                has_bo = bo != 0.0 if k < model.order else np.zeros(len(bo), dtype=bool)
                lp_out, bo_out = np.empty(len(bo)), np.empty(len(bo))
                for lo in range(0, len(bo), chunk):  # formatted strings for a chunk at a time
                    hi = min(lo + chunk, len(bo))
                    lp = list(map(fmt, model.log10_prob[k - 1][lo:hi].tolist()))
                    bo_txt = [fmt(b) if h else "" for b, h in zip(bo[lo:hi].tolist(), has_bo[lo:hi].tolist())]
                    f.writelines(
                        [f"{p}\t{t}\t{b}\n" if b else f"{p}\t{t}\n" for p, t, b in zip(lp, text[lo:hi], bo_txt)]
                    )
                    lp_out[lo:hi] = np.asarray(lp, dtype=np.float64)  # the values as written
                    bo_out[lo:hi] = np.asarray([b or "0" for b in bo_txt], dtype=np.float64)
                    bar.update(hi - lo)
                written_lp.append(lp_out)
                written_bo.append(bo_out)
            f.write("\n\\end\\\n")
    finally:
        bar.close()
    if cache:
        as_read = NgramModel(model.words, list(model.keys), written_lp, written_bo, protocol=model.protocol)
        _save_cached(as_read, _cache_file(path))


def read_arpa(path: str | os.PathLike, cache: bool = True) -> NgramModel:
    """Load an ARPA file into an :class:`NgramModel` (word ids in unigram-section order).

    With ``cache``, a binary copy of the parsed model is kept in the hlbl cache
    (``$HLBL_CACHE/arpa``), keyed by the SHA-256 of the file's bytes, and used on later reads of
    the same bytes (parsing PTB's 5-gram file takes seconds).
    """
    path = Path(path)
    refuse_special(path, ArpaError, "an ARPA file")
    if path.is_dir():
        raise ArpaError(f"{path} is a directory, expected an ARPA file")
    if not path.exists():
        raise ArpaError(f"{path}: no such file")
    from .binary import is_binary, read_binary

    if is_binary(path):  # the binary form (hlbl ngram train --out X.safetensors) is read as it is
        return read_binary(path)
    where = _cache_file(path) if cache else None
    if where is not None and where.exists():
        model = _load_cached(where)
        if model is not None:
            model.source = str(path)
            return model
    model = parse_arpa(path.read_bytes(), str(path))
    if where is not None:
        _save_cached(model, where)
    return model


_CACHE_VERSION = 4  # 2: values checked; 3: protocol; 4: keyed by content, structure checked on load


def _cache_file(path: Path) -> Path | None:
    try:
        digest = file_sha256(path)
    except DataError:
        return None
    key = f"{_CACHE_VERSION}:{digest}"
    return default_cache_dir() / "arpa" / (hashlib.sha1(key.encode()).hexdigest()[:20] + ".npz")


def _save_cached(model: NgramModel, where: Path | None) -> None:
    """Best effort: a cache that cannot be written is simply not used."""
    if where is None:
        return
    arrays = {"words": np.frombuffer("\n".join(model.words).encode("utf-8"), dtype=np.uint8)}
    if model.protocol is not None:
        arrays["protocol"] = np.frombuffer(json.dumps(model.protocol).encode("utf-8"), dtype=np.uint8)
    for k in range(model.order):
        arrays[f"keys{k}"] = model.keys[k]
        arrays[f"lp{k}"] = model.log10_prob[k]
        arrays[f"bo{k}"] = model.log10_backoff[k]
    try:
        where.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(where) as tmp, open(tmp, "wb") as f:
            np.savez(f, **arrays)
    except OSError:
        pass


def _load_cached(where: Path) -> NgramModel | None:
    """The cached model, or None if the copy is unreadable or not a model's tables (then the file
    is parsed again): any failure to read it, of whatever kind, only costs the parse."""
    from .binary import bad_structure, bad_value

    try:
        with np.load(where, allow_pickle=False) as z:
            words = tuple(z["words"].tobytes().decode("utf-8").split("\n"))
            order = sum(1 for n in z.files if n.startswith("keys"))
            model = NgramModel(
                words,
                [z[f"keys{k}"] for k in range(order)],
                [z[f"lp{k}"] for k in range(order)],
                [z[f"bo{k}"] for k in range(order)],
                protocol=json.loads(z["protocol"].tobytes()) if "protocol" in z.files else None,
            )
    except Exception:  # noqa: BLE001 (BadZipFile, EOFError, zlib.error, ValueError...: parse again)
        return None
    if bad_structure(model) or bad_value(model):
        return None
    return model


# ASCII whitespace: what bytes.split() splits on (and so what separates ARPA fields here).
_WS = np.zeros(256, dtype=bool)
_WS[[9, 10, 11, 12, 13, 32]] = True
_WS.setflags(write=False)


def parse_arpa(data: bytes | str, name: str = "<arpa>") -> NgramModel:
    """Parse the bytes (or text) of an ARPA file; ``name`` is used in error messages.

    The n-gram sections are parsed in bulk: per-line field counts from a numpy pass over the
    bytes, then one ``bytes.split()`` per section sliced into columns; one section's fields
    are alive at a time.
    """
    if isinstance(data, str):
        data = data.encode("utf-8")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ArpaError(f"{name}:{line}: not UTF-8 text (bad byte 0x{data[e.start]:02x})") from None
    buf = np.frombuffer(data, dtype=np.uint8)
    # (nlines + 1,) byte offset where each line starts; line j is data[ls[j]:ls[j+1]].
    ls = np.concatenate([[0], np.flatnonzero(buf == 10) + 1])
    if ls[-1] != len(data):
        ls = np.concatenate([ls, [len(data)]])
    nlines = len(ls) - 1

    def line(j: int) -> str:
        return data[ls[j] : ls[j + 1]].decode("utf-8").strip()

    def where(j: int) -> str:
        return f"{name}:{min(j, max(nlines - 1, 0)) + 1}"

    def skip_blank(j: int) -> int:
        while j < nlines and not line(j):
            j += 1
        return j

    i, counts, protocol = _header(line, nlines, where, skip_blank)

    order = len(counts)
    vocab: tuple[list[str], dict[bytes, int], np.ndarray, np.ndarray] | None = None
    higher: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = []  # (start, lp, bo, word ids)
    for k, n in enumerate(counts, 1):
        i = skip_blank(i)
        header = f"\\{k}-grams:"
        if k > 1 and i < nlines and not line(i).startswith("\\"):
            raise ArpaError(f"{where(i)}: more {k - 1}-grams than the header's {counts[k - 2]}")
        if i >= nlines or line(i) != header:
            got = line(i) if i < nlines else "the end of the file"
            raise ArpaError(f"{where(i)}: expected {header}, got {got!r}")
        start = i + 1  # first line of the section
        end = min(start + n, nlines)
        lo, hi = int(ls[start]), int(ls[end])
        # Fields per line: count the bytes that start a field (non-space after a space/start).
        seg = buf[lo:hi]
        ws = _WS[seg]
        field_start = ~ws
        field_start[1:] &= ws[:-1]
        fsp = np.flatnonzero(field_start)  # (fields,) byte offset of each field
        nfields = np.bincount(np.searchsorted(np.flatnonzero(seg == 10), fsp), minlength=end - start)
        nfields = nfields[: end - start]
        first = np.cumsum(nfields) - nfields  # index of each line's first field
        # A blank line or a "\..." line inside the section: fewer n-grams than promised.
        head = seg[fsp[np.minimum(first, max(len(fsp) - 1, 0))]] if len(fsp) else np.zeros(len(nfields), np.uint8)
        bad = np.flatnonzero((nfields == 0) | (head == ord("\\")))
        if len(bad) or end - start < n:
            got = int(bad[0]) if len(bad) else end - start
            raise ArpaError(f"{where(start + got)}: the header promises {n} {k}-grams, the section has {got}")
        del seg, ws, field_start, fsp, head
        toks = data[lo:hi].split()
        lp, bo, cols = _columns(start, nfields, toks, first, k, name, k == order)
        del toks
        if k == 1:
            vocab = _unigrams(cols[0], start, name) + (lp, bo)
        else:
            assert vocab is not None
            higher.append((start, lp, bo, _word_ids(cols, vocab[1], start, name)))
        i = end
    i = skip_blank(i)
    if i >= nlines or line(i) != "\\end\\":
        got = line(i) if i < nlines else "the end of the file"
        if i < nlines and not got.startswith("\\"):
            raise ArpaError(f"{where(i)}: more {len(counts)}-grams than the header's {counts[-1]}")
        raise ArpaError(f"{where(i)}: expected \\end\\, got {got!r}")
    assert vocab is not None
    model = _assemble(vocab, higher, name)
    model.protocol = protocol
    problem = overfull_context(model)
    if problem:
        raise ArpaError(f"{name}: {problem}")
    return model


CONTEXT_MASS_SLACK = 1e-3  # a context's probabilities may sum to 1 + this (values are rounded in files)


def overfull_context(model: NgramModel, chunk: int = 1 << 18) -> str | None:
    """The first context whose next-word probabilities sum to more than 1, in words, or None.

    For a context ``h`` with the n-grams ``h w`` stored for the words ``w`` in ``S``, the back-off
    rule gives ``M(h) = sum_w p(w | h) = sum_S p*(h w) + bo(h) (M(h') - sum_S p(w | h'))``, with
    ``h'`` the context without its oldest word and ``M()`` the unigrams' sum. Back-off weights
    larger than the held-back mass allows make every backed-off probability too large (and a
    mixture would then trust the model more than it deserves); one look-up per stored n-gram
    finds them. Every order-k row is a context here (one without continuations backs off whole)."""
    base = model.base
    low_mass = np.asarray([unigram_mass(model.log10_prob[0])])  # M(h') per row of the order below
    for k in range(1, model.order):  # contexts: order-k rows; their continuations: order k + 1
        n_ctx = len(model.keys[k - 1])
        keys = model.keys[k]
        seen, lower = np.zeros(n_ctx), np.zeros(n_ctx)
        for lo in range(0, len(keys), chunk):
            rows, w = np.divmod(keys[lo : lo + chunk], base)
            with np.errstate(under="ignore"):
                seen += np.bincount(rows, 10.0 ** model.log10_prob[k][lo : lo + chunk], minlength=n_ctx)
                if k == 1:
                    low = 10.0 ** model.log10_prob[0][w]
                else:
                    win = np.concatenate([_rows_text_ids(model, rows, k)[:, 1:], w[:, None]], axis=1)
                    low = 10.0 ** model.score_windows(win, max_order=k)
            lower += np.bincount(rows, low, minlength=n_ctx)
        if k == 1:
            m_low = np.full(n_ctx, low_mass[0])
        else:  # M(h') of each context's suffix (1 where a file lacks the suffix)
            suffix = model.lookup_rows(_rows_text_ids(model, np.arange(n_ctx), k)[:, 1:])
            m_low = np.where(suffix >= 0, low_mass[np.maximum(suffix, 0)], 1.0)
        with np.errstate(over="ignore", under="ignore"):
            mass = seen + 10.0 ** model.log10_backoff[k - 1] * np.maximum(m_low - lower, 0.0)
        has = np.bincount(keys // base, minlength=n_ctx) > 0 if len(keys) else np.zeros(n_ctx, bool)
        # (a context written without a back-off, weight 1, is left alone: the blanks added above, and
        # files whose contexts are not all stored, are no inflation a weight makes)
        bad = np.flatnonzero(has & (model.log10_backoff[k - 1] != 0) & ~(mass <= 1.0 + CONTEXT_MASS_SLACK))
        if len(bad):
            j = int(bad[np.argmax(mass[bad])])
            words = " ".join(model.words[x] for x in _rows_text_ids(model, np.asarray([j]), k)[0])
            return (
                f"the probabilities after {words!r} sum to {mass[j]:.6g}, more than 1: its back-off weight "
                f"({model.log10_backoff[k - 1][j]:.6g}) is larger than the held-back probability allows"
            )
        low_mass = np.minimum(mass, 1.0 + CONTEXT_MASS_SLACK)
    return None


def _header(line, nlines: int, where, skip_blank) -> tuple[int, list[int], dict | None]:
    """The ``\\data\\`` section and the comments before it: (the line after it, the n-gram counts,
    the protocol record or None). ``line``, ``where``, ``skip_blank``: :func:`parse_arpa`'s."""
    i = skip_blank(0)
    protocol = None
    while i < nlines and line(i).startswith("#"):  # comments before \data\, as KenLM allows
        if line(i).startswith(ARPA_TAG):
            protocol = parse_protocol(line(i)[len(ARPA_TAG) :], where(i))
        i = skip_blank(i + 1)
    if i >= nlines or line(i) != "\\data\\":
        raise ArpaError(f"{where(i)}: expected the \\data\\ header of an ARPA file")
    i += 1
    counts: list[int] = []
    while i < nlines and line(i).startswith("ngram "):
        k_s, _, n_s = line(i)[len("ngram ") :].partition("=")
        if not all(x.strip().isascii() and x.strip().isdigit() for x in (k_s, n_s)):  # (int() takes 1_0, +2)
            raise ArpaError(f"{where(i)}: expected 'ngram K=COUNT', got {line(i)!r}")
        k, n = int(k_s), int(n_s)
        if k != len(counts) + 1 or n < 0:
            raise ArpaError(f"{where(i)}: expected 'ngram {len(counts) + 1}=COUNT', got {line(i)!r}")
        counts.append(n)
        i += 1
    if not counts:
        raise ArpaError(f"{where(i)}: the \\data\\ section lists no 'ngram K=COUNT' line")
    if counts[0] == 0:
        raise ArpaError(f"{where(i - len(counts))}: the model has no unigrams")
    return i, counts, protocol


def _unigrams(raw: list[bytes], start: int, name: str) -> tuple[list[str], dict[bytes, int]]:
    """Decoded words and a bytes -> id index (higher orders look words up without decoding)."""
    words = [w.decode("utf-8") for w in raw]
    bindex: dict[bytes, int] = {}
    for j, w in enumerate(raw):
        if w in bindex:
            raise ArpaError(f"{name}:{start + j + 1}: the unigram {words[j]!r} appears twice")
        bindex[w] = j
    return words, bindex


def _word_ids(cols: list[list[bytes]], bindex: dict[bytes, int], start: int, name: str) -> np.ndarray:
    """(L, k) word ids of one section's word columns."""
    mat = np.empty((len(cols[0]), len(cols)), dtype=np.int64)
    for c, col in enumerate(cols):
        try:
            mat[:, c] = np.fromiter(map(bindex.__getitem__, col), dtype=np.int64, count=len(col))
        except KeyError:
            j = next(j for j, w in enumerate(col) if w not in bindex)
            word = col[j].decode("utf-8")
            raise ArpaError(f"{name}:{start + j + 1}: the word {word!r} is not among the unigrams") from None
    return mat


def _columns(start: int, nfields: np.ndarray, toks: list[bytes], first: np.ndarray, k: int, name: str, top: bool):
    """Check one section's field counts and numbers; return (log10 prob, back-off, word columns).

    ``toks`` is the section's flat field list, ``nfields`` (L,) the fields of each line and
    ``first`` (L,) the position in ``toks`` of each line's first field.
    """
    ok = (nfields == k + 1) if top else ((nfields == k + 1) | (nfields == k + 2))
    bad = np.flatnonzero(~ok)
    if len(bad):
        j = int(bad[0])
        shape = f"log10 prob, {k} word{'s' if k > 1 else ''}" + ("" if top else ", optional back-off")
        raise ArpaError(f"{name}:{start + j + 1}: expected a {k}-gram line ({shape}), got {nfields[j]} fields")
    # An object array of the fields lets numpy gather a column (field c of every line).
    arr = np.empty(len(toks), dtype=object)
    arr[:] = toks
    col = lambda c: arr[first + c]  # noqa: E731
    lp = _floats(col(0), start, name, "probability")
    has = nfields == k + 2
    bo = np.zeros(len(nfields))
    if not top and np.any(has):
        rows = np.flatnonzero(has)
        bo[rows] = _floats(arr[first[rows] + k + 1], start, name, "back-off", rows)
    if np.any(lp > 0):
        j = int(np.flatnonzero(lp > 0)[0])
        raise ArpaError(f"{name}:{start + j + 1}: log10 probability {lp[j]} is above 0")
    if k == 1 and unigram_mass(lp) > 1 + UNIGRAM_MASS_SLACK:  # (named at the section's header)
        raise ArpaError(f"{name}:{start}: the unigram probabilities sum to {unigram_mass(lp):.6g}, more than 1")
    if np.any(np.abs(bo) > MAX_LOG10_BACKOFF):  # (a weight of 10^100 turns any probability into > 1)
        j = int(np.flatnonzero(np.abs(bo) > MAX_LOG10_BACKOFF)[0])
        text = arr[first[j] + k + 1].decode("utf-8", "replace")
        raise ArpaError(
            f"{name}:{start + j + 1}: log10 back-off {text!r} is out of range "
            f"(-{MAX_LOG10_BACKOFF:g} to {MAX_LOG10_BACKOFF:g})"
        )
    return lp, bo, [col(1 + c).tolist() for c in range(k)]


# The bytes of a plain decimal number. float() also reads "1_0", " 1", "nan", "inf" and more;
# a field of these bytes alone that float() reads is exactly [+-]digits[.digits][e[+-]digits].
_DECIMAL = b"0123456789.eE+-"
_MINUS_INF = (b"-inf", b"-infinity")  # (any case) a log10 probability of 0


def _floats(fields: np.ndarray, start: int, name: str, what: str, rows: np.ndarray | None = None) -> np.ndarray:
    """Parse an object array of number fields; name the first bad line on failure. A log10
    probability may be -inf (probability 0, as some toolkits write for ``<s>``); nothing else
    may be infinite or NaN, or spelled otherwise than as a plain decimal."""

    def fail(j: int):
        line = start + (int(rows[j]) if rows is not None else j) + 1
        raise ArpaError(f"{name}:{line}: bad log10 {what} {fields[j].decode('utf-8', 'replace')!r}")

    if b"".join(fields).translate(None, _DECIMAL):  # some field has other bytes: which (rare)
        for j, f in enumerate(fields):
            if f.translate(None, _DECIMAL) and not (what == "probability" and f.lower() in _MINUS_INF):
                fail(j)
    try:
        out = fields.astype(np.float64)
    except ValueError:
        fail(next(j for j, f in enumerate(fields) if not _is_number(f)))
    ok = np.isfinite(out) | ((out == -np.inf) if what == "probability" else False)
    if not ok.all():
        fail(int(np.flatnonzero(~ok)[0]))
    return out


def _is_number(b: bytes) -> bool:
    try:
        float(b)
        return True
    except ValueError:
        return False


def _assemble(vocab, higher, name: str) -> NgramModel:
    """Tables from the parsed sections, adding missing contexts as blanks (see module doc)."""
    words, _, lp1, bo1 = vocab
    words, lp1, bo1 = list(words), list(lp1), list(bo1)
    if UNK_WORD not in words:
        words.append(UNK_WORD)
        lp1.append(-100.0)
        bo1.append(0.0)
    if BOS_WORD not in words:
        words.append(BOS_WORD)
        lp1.append(-99.0)
        bo1.append(0.0)
    base = len(words)
    model = NgramModel(
        tuple(words), [np.arange(base, dtype=np.int64)], [np.asarray(lp1)], [np.asarray(bo1)], source=name
    )
    order = 1 + len(higher)
    mats = [h[3] for h in higher]

    # Build orders bottom-up. Order k holds its own lines plus the k-word prefixes (contexts)
    # of every longer n-gram that are missing from the file ("blanks"). prefix_row[m] is, for
    # each line of order m+2 and up, the row of its current prefix in the table just built.
    prefix_row = [mat[:, 0].copy() for mat in mats]
    for k in range(2, order + 1):
        start, lp, bo, own = higher[k - 2]
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
            raise ArpaError(
                f"{name}:{start + j + 1}: the {k}-gram {' '.join(words[x] for x in own[j])!r} appears twice"
            )
        # k-word prefixes of all longer lines; those not among this order's own n-grams are
        # missing contexts (none in a well-formed KenLM or hlbl file).
        longer = [(m, prefix_row[m - 2] * base + mats[m - 2][:, k - 1]) for m in range(k + 1, order + 1)]
        found_at, absent = {}, []
        for m, p in longer:
            pos = np.searchsorted(sk, p)
            hit = (pos < len(sk)) & (sk[np.minimum(pos, len(sk) - 1)] == p) if len(sk) else np.zeros(len(p), bool)
            found_at[m] = pos
            absent.append(p[~hit])
        missing = np.unique(np.concatenate(absent)) if absent else np.zeros(0, np.int64)
        keys = np.concatenate([own_keys, missing])
        prob = np.concatenate([lp, np.zeros(len(missing))])
        back = np.concatenate([bo, np.zeros(len(missing))])
        if len(missing):
            # Blank n-grams: the probability the back-off rule gives with the lower orders.
            ctx_rows, last = np.divmod(missing, base)
            win = _rows_text_ids(model, ctx_rows, k - 1)
            win = np.concatenate([win, last[:, None]], axis=1)
            prob[len(own_keys) :] = model.score_windows(win, max_order=k)
        srt = np.argsort(keys, kind="stable")
        model.keys.append(keys[srt])
        model.log10_prob.append(prob[srt])
        model.log10_backoff.append(back[srt])
        for m, p in longer:
            prefix_row[m - 2] = np.searchsorted(model.keys[k - 1], p) if len(missing) else found_at[m]
    return model


def _rows_text_ids(model: NgramModel, rows: np.ndarray, k: int) -> np.ndarray:
    """(L, k) word ids of the given rows of the order-``k`` table (walk the context chain)."""
    out = np.empty((len(rows), k), dtype=np.int64)
    cur = np.asarray(rows, dtype=np.int64)
    for m in range(k, 1, -1):
        cur, out[:, m - 1] = np.divmod(model.keys[m - 1][cur], model.base)
    out[:, 0] = cur
    return out
