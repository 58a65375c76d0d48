"""The training file read on every core (``hlbl.data.scan``) gives exactly the single pass's
provisional ids, words, counts and statistics: on PTB and on the text rules' edge cases, with byte
ranges cut as small as possible (so every line end is a cut and cuts fall beside multibyte
characters)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import ptb_root

from hlbl.data import scan as scan_mod
from hlbl.data import scan_file
from hlbl.errors import DataError


def _both(path: Path, tmp: Path, blank_lines: str, workers: int = 3):
    one = scan_file(path, tmp / "one.i32", blank_lines, workers=1)
    par = scan_file(path, tmp / "par.i32", blank_lines, workers=workers)
    return one, par


def _assert_same(one, par):
    assert par.words == one.words
    assert np.array_equal(par.counts, one.counts) and par.counts.dtype == one.counts.dtype
    assert par.tokens == one.tokens and par.stats == one.stats
    assert par.ids.read_bytes() == one.ids.read_bytes()
    assert not list(par.ids.parent.glob("*.part*"))  # the ranges' files are gone


CASES = {
    "blank lines": b"a b c\n\n   \n\t\nd a\n\n\ne\n",
    "no final newline": b"one two\nthree four\nfive",
    "unicode whitespace": "x\u2003y\u00a0z\n\x1cq\x1dr\x1es\x1ft\n\u2028u\u3000v\x85w\n\u200bzero-width\n".encode(),
    "multibyte": ("\u00e9t\u00e9 \u4e2d\u6587 \U0001f600\n" * 40 + "\u00fcber\n" * 30).encode(),
    "line endings": b"a b\r\nc\rd e\r\n\r\nf\n\rg\r",
    "byte-order marks": b"\xef\xbb\xbfhead word\nmid \xef\xbb\xbf bom\n\xef\xbb\xbf\n",
    "<unk> in the text": b"<unk> a <unk>\n<eos> b\n",
}


@pytest.mark.parametrize("blank_lines", ["drop", "keep"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_parallel_scan_equals_the_single_pass(tmp_path, monkeypatch, case, blank_lines):
    monkeypatch.setattr(scan_mod, "MIN_RANGE_BYTES", 1)  # a cut after every few bytes' next line end
    path = tmp_path / "train.txt"
    path.write_bytes(CASES[case])
    assert len(scan_mod.byte_ranges(path, 12)) > 1
    _assert_same(*_both(path, tmp_path, blank_lines))


def test_cuts_never_split_a_line_or_a_character(tmp_path, monkeypatch):
    monkeypatch.setattr(scan_mod, "MIN_RANGE_BYTES", 1)
    path = tmp_path / "t.txt"
    text = ("\u4e2d\u6587\u00e9 " * 7 + "\n") * 500 + "last"
    path.write_bytes(text.encode())
    ranges = scan_mod.byte_ranges(path, 37)
    raw = path.read_bytes()
    assert ranges[0][0] == 0 and ranges[-1][1] == len(raw) and len(ranges) > 1
    for (a, b), (c, _) in zip(ranges, ranges[1:]):
        assert b == c and raw[b - 1 : b] == b"\n"
        raw[a:b].decode("utf-8")  # whole characters


def test_long_lines_and_their_pieces(tmp_path, monkeypatch):
    """A line over LONG_LINE characters is read in pieces by both ways, a blank one too."""
    monkeypatch.setattr(scan_mod, "MIN_RANGE_BYTES", 1)
    from hlbl.data.vocab import LONG_LINE

    words = " ".join(f"w{i % 997}" for i in range(LONG_LINE // 3))
    path = tmp_path / "train.txt"
    path.write_text(f"short line\n{words}\n{' ' * (LONG_LINE + 5)}\nend\n", encoding="utf-8")
    for blank_lines in ("drop", "keep"):
        _assert_same(*_both(path, tmp_path, blank_lines, workers=2))


def test_errors_are_the_single_pass_errors(tmp_path, monkeypatch):
    monkeypatch.setattr(scan_mod, "MIN_RANGE_BYTES", 1)
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine line\n" * 50 + b"bad \xff byte\n" + b"more\n" * 50)
    blank = tmp_path / "blank.txt"
    blank.write_bytes(b"\n  \n\t\n" * 20)
    for path in (bad, blank):
        with pytest.raises(DataError) as serial:
            scan_file(path, tmp_path / "one.i32", workers=1)
        with pytest.raises(DataError) as parallel:
            scan_file(path, tmp_path / "par.i32", workers=2)
        assert str(parallel.value) == str(serial.value)
        assert not list(tmp_path.glob("*.i32*"))  # nothing half-written is left


def test_ptb_in_parallel_equals_the_single_pass(tmp_path):
    path = ptb_root() / "train.txt"
    for blank_lines in ("drop", "keep"):
        _assert_same(*_both(path, tmp_path, blank_lines, workers=2))


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_worker_reading_in_small_blocks_reads_the_same(tmp_path, monkeypatch, case):
    """A worker reads its range in blocks cut at line ends: blocks of a few bytes (a cut after
    every line) give what one block does."""
    import io

    path = tmp_path / "train.txt"
    path.write_bytes(CASES[case])
    size = path.stat().st_size
    whole = io.BytesIO()
    expect = scan_mod._scan_range(str(path), 0, size, True, whole)
    monkeypatch.setattr(scan_mod, "BLOCK_BYTES", 3)
    assert len(list(scan_mod._blocks(str(path), 0, size))) > 1
    small = io.BytesIO()
    assert scan_mod._scan_range(str(path), 0, size, True, small) == expect
    assert small.getvalue() == whole.getvalue()
