"""The training file read by the byte kernel on every core (``hlbl.data.scan``,
``hlbl.data.text_kernel``) gives exactly the Python pass's provisional ids, words, counts and
statistics: on PTB and on the text rules' edge cases, with byte ranges and blocks cut as small as
possible (so every line end is a cut and cuts fall beside multibyte characters); its whitespace is
Python's for every code point, and it rejects exactly the bytes Python's decoder rejects."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import ptb_root

from hlbl.data import scan as scan_mod
from hlbl.data import scan_file
from hlbl.data import text_kernel as tk
from hlbl.errors import DataError


def _both(path: Path, tmp: Path, blank_lines: str, workers: int = 3):
    one = scan_file(path, tmp / "one.i32", blank_lines, workers=0)
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
            scan_file(path, tmp_path / "one.i32", workers=0)
        with pytest.raises(DataError) as parallel:
            scan_file(path, tmp_path / "par.i32", workers=2)
        assert str(parallel.value) == str(serial.value)
        assert not list(tmp_path.glob("*.i32*"))  # nothing half-written is left


def test_a_failing_range_stops_the_others(tmp_path, monkeypatch):
    """A bad byte at the start of the last range is the error at once: the first range, long, stops
    at its next block instead of being read to its end."""
    monkeypatch.setattr(scan_mod, "MIN_RANGE_BYTES", 1)
    monkeypatch.setattr(scan_mod, "BLOCK_BYTES", 64)
    path = tmp_path / "train.txt"
    path.write_bytes(b"fine words here\n" * 200_000 + b"\xff bad\n")
    size = path.stat().st_size
    ranges = [(0, size - 7), (size - 7, size)]
    monkeypatch.setattr(scan_mod, "byte_ranges", lambda p, parts: ranges)
    read = []
    blocks = scan_mod.blocks

    def counted(*args):
        for block in blocks(*args):
            read.append(len(block[1]))
            yield block

    monkeypatch.setattr(scan_mod, "blocks", counted)
    with pytest.raises(DataError, match="not UTF-8"):
        scan_file(path, tmp_path / "ids.i32", workers=2)
    assert sum(read) < size // 2
    assert not list(tmp_path.glob("ids.i32*"))


def test_ptb_in_parallel_equals_the_single_pass(tmp_path):
    path = ptb_root() / "train.txt"
    for blank_lines in ("drop", "keep"):
        _assert_same(*_both(path, tmp_path, blank_lines, workers=2))


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("workers", [1, 2])
def test_reading_in_small_blocks_reads_the_same(tmp_path, monkeypatch, case, workers):
    """A range is read in blocks cut at line ends: blocks of a few bytes (a cut after every line)
    give what the Python pass does, with one range and with several."""
    monkeypatch.setattr(scan_mod, "MIN_RANGE_BYTES", 1)
    monkeypatch.setattr(scan_mod, "BLOCK_BYTES", 3)
    path = tmp_path / "train.txt"
    path.write_bytes(CASES[case])
    for blank_lines in ("drop", "keep"):
        _assert_same(*_both(path, tmp_path, blank_lines, workers=workers))


def test_blocks_end_at_line_ends(tmp_path):
    raw = b"ab\ncd\r\nef\rgh\n" * 5
    path = tmp_path / "t.txt"
    path.write_bytes(raw)
    cut = list(scan_mod.blocks(path, 0, len(raw), 4))
    assert len(cut) > 1 and b"".join(b for _, b in cut) == raw
    assert [o for o, _ in cut] == [0] + list(np.cumsum([len(b) for _, b in cut]))[:-1]
    for offset, b in cut:  # a \n, or a \r that no \n follows
        end = offset + len(b)
        assert b.endswith(b"\n") or (b.endswith(b"\r") and raw[end : end + 1] != b"\n")
    lone = tmp_path / "cr.txt"  # lines ended by lone \r only: cut after one, never inside \r\n
    lone.write_bytes(b"one two\rthree\r" * 4 + b"x\r\n")
    cut = list(scan_mod.blocks(lone, 0, lone.stat().st_size, 5))
    assert len(cut) > 1 and b"".join(b for _, b in cut) == lone.read_bytes()
    assert all(b.endswith(b"\r") for _, b in cut[:-1]) and cut[-1][1].endswith(b"\r\n")


def test_a_large_vocabulary_grows_the_table(tmp_path):
    """Tens of thousands of distinct words (the table starts with room for 4,096): ids in order of
    first appearance and counts as the Python pass's."""
    rng = np.random.default_rng(0)
    words = [f"w{i}\u00e9" for i in range(30_000)]
    lines = [" ".join(words[j] for j in rng.integers(0, len(words), 12)) for _ in range(8_000)]
    path = tmp_path / "train.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    _assert_same(*_both(path, tmp_path, "drop", workers=1))


def test_whitespace_is_pythons_for_every_code_point():
    """A token beside each code point is split off exactly when Python's str.split() splits there
    (surrogates, which UTF-8 cannot hold, aside)."""
    points = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF and c not in (10, 13)]
    text = "".join(f"a{chr(c)}b\n" for c in points).encode("utf-8")
    data = np.frombuffer(text, np.uint8)
    out = np.empty(len(data) + 1, np.int32)
    table, n, _, status, _ = tk.scan_block(data, 0, len(data), True, False, tk.ASCII_SPACE, tk.new_table(), out)
    assert status == tk.OK
    words = tk.words_of(table)
    got = [words[i] for i in out[:n]]
    want = [w for c in points for w in (f"a{chr(c)}b".split() + ["<eos>"])]
    assert got == want


def test_bad_utf8_is_what_pythons_decoder_rejects():
    """Random byte strings (rich in the bytes UTF-8 rules are about): the kernel stops exactly
    where Python's strict decoder first fails, and reads on where it does not."""
    rng = np.random.default_rng(1)
    alphabet = np.array(
        [
            0x61,
            0x20,
            0x0A,
            0x80,
            0x8F,
            0x90,
            0x9F,
            0xA0,
            0xBF,
            0xC0,
            0xC2,
            0xDF,
            0xE0,
            0xED,
            0xEF,
            0xF0,
            0xF4,
            0xF5,
            0xFF,
        ],
        np.uint8,
    )
    for _ in range(3000):
        raw = rng.choice(alphabet, int(rng.integers(1, 12))).tobytes()
        data = np.frombuffer(raw, np.uint8)
        out = np.empty(len(raw) + 1, np.int32)
        _, _, _, status, pos = tk.scan_block(data, 0, len(raw), False, True, tk.ASCII_SPACE, tk.new_table(), out)
        try:
            raw.decode("utf-8")
            assert status == tk.OK, raw
        except UnicodeDecodeError as e:
            assert status == tk.BAD_UTF8 and pos == e.start, (raw, pos, e.start)
