"""One text file in, a corpus out (hlbl.data.split, ``hlbl data split``, ``--data FILE``)."""

import json
import os

import numpy as np
import pytest

from hlbl.cli import main
from hlbl.data import load_corpus, resolve_corpus
from hlbl.data.split import assign_lines, line_keys, split_counts, split_file
from hlbl.errors import DataError


def text_file(path, n=200, blank_every=0):
    """``n`` numbered lines (each line names itself, so where it went can be checked)."""
    lines = ["" if blank_every and i % blank_every == 0 else f"line {i} w{i % 7}" for i in range(n)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return lines


def read_splits(root):
    return {s: (root / f"{s}.txt").read_text(encoding="utf-8").splitlines() for s in ("train", "valid", "test")}


def test_every_line_lands_in_exactly_one_split_in_file_order(tmp_path):
    lines = text_file(tmp_path / "t.txt", 500, blank_every=37)
    split = split_file(tmp_path / "t.txt", tmp_path / "cache")
    got = read_splits(split.root)
    assert sorted(sum(got.values(), [])) == sorted(lines)  # a multiset: nothing lost, nothing twice
    named = [line for part in got.values() for line in part if line]
    assert len(named) == len(set(named)) == sum(1 for x in lines if x)
    for part in got.values():  # the file's order within each split
        idx = [int(x.split()[1]) for x in part if x]
        assert idx == sorted(idx)
    assert split.lines == {s: len(v) for s, v in got.items()}


@pytest.mark.parametrize("n,valid,test", [(500, 0.1, 0.1), (1000, 0.05, 0.2), (3, 0.1, 0.1), (7, 0.3, 0.3)])
def test_the_fractions_are_the_documented_counts(tmp_path, n, valid, test):
    text_file(tmp_path / "t.txt", n)
    split = split_file(tmp_path / "t.txt", tmp_path / "cache", valid, test)
    nv, nt = max(1, round(valid * n)), max(1, round(test * n))
    assert split.lines == {"train": n - nv - nt, "valid": nv, "test": nt}
    assert {s: len(v) for s, v in read_splits(split.root).items()} == split.lines


def test_the_split_is_deterministic_and_the_seed_changes_it(tmp_path):
    text_file(tmp_path / "t.txt", 300)
    a = read_splits(split_file(tmp_path / "t.txt", tmp_path / "c1").root)
    b = read_splits(split_file(tmp_path / "t.txt", tmp_path / "c2").root)  # another cache: made again
    c = read_splits(split_file(tmp_path / "t.txt", tmp_path / "c1", seed=1).root)
    assert a == b and a != c
    # the keys are the module's own splitmix64: fixed values, whatever numpy's random streams do
    assert line_keys(2, 0).tolist() == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4]
    assert line_keys(1, 1).tolist() != line_keys(1, 0).tolist()
    assert np.bincount(assign_lines(1000), minlength=3).tolist() == [800, 100, 100]


def test_a_second_split_is_found_in_the_cache_and_changed_text_is_split_again(tmp_path):
    text_file(tmp_path / "t.txt", 100)
    first = split_file(tmp_path / "t.txt", tmp_path / "cache")
    again = split_file(tmp_path / "t.txt", tmp_path / "cache")
    assert not first.reused and again.reused and again.root == first.root
    meta = json.loads((first.root / "split.json").read_text())
    assert meta["format"] == "hlbl-split" and meta["lines"] == first.lines and meta["seed"] == 0
    (first.root / "test.txt").write_text("damaged\n")  # a damaged entry is made again
    assert not split_file(tmp_path / "t.txt", tmp_path / "cache").reused
    text_file(tmp_path / "t.txt", 101)
    other = split_file(tmp_path / "t.txt", tmp_path / "cache")
    assert other.root != first.root and sum(other.lines.values()) == 101


def test_line_endings_and_a_byte_order_mark_follow_the_corpus_rules(tmp_path):
    (tmp_path / "t.txt").write_bytes(b"\xef\xbb\xbfa b\r\nc d\re f\ng h\ni j")  # no final newline
    got = read_splits(split_file(tmp_path / "t.txt", tmp_path / "cache").root)
    assert sorted(sum(got.values(), [])) == ["a b", "c d", "e f", "g h", "i j"]


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda p: p.write_text(""), "the file is empty"),
        (lambda p: p.mkdir(), "is a directory"),
        (lambda p: p.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xd8"), "not UTF-8 text"),
        (lambda p: p.write_bytes(b"ab\ncd\x00\x00\x01\nef\n"), "binary data"),
        (lambda p: p.write_text("one\ntwo\n"), "too few to split"),
        (lambda p: os.mkfifo(p), "not a regular file"),
        (lambda p: None, "no such file"),
    ],
)
def test_bad_input_is_one_line(tmp_path, make, message):
    make(tmp_path / "in")
    with pytest.raises(DataError, match=message) as e:
        split_file(tmp_path / "in", tmp_path / "cache")
    assert "\n" not in str(e.value)
    assert not (tmp_path / "cache" / "splits").exists() or not any((tmp_path / "cache" / "splits").rglob("*.txt"))


def test_bad_fractions_are_refused():
    for valid, test, message in [(0, 0.1, "between 0 and 1"), (0.5, 0.5, "leave no training"), (0.1, 1.5, "between")]:
        with pytest.raises(DataError, match=message):
            split_counts(100, valid, test)


def test_hlbl_data_split_prints_the_directory_and_data_file_uses_the_same_split(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HLBL_CACHE", str(tmp_path / "cache"))
    text_file(tmp_path / "t.txt", 120)
    assert main(["data", "split", str(tmp_path / "t.txt"), "--valid", "0.2", "--seed", "3"]) == 0
    out, err = capsys.readouterr()
    root = tmp_path / out.strip()
    assert out.count("\n") == 1 and root.is_relative_to(tmp_path / "cache" / "splits") and "split into" in err
    assert json.loads((root / "split.json").read_text())["lines"]["valid"] == 24
    # --data FILE: the default split, cached, and a corpus like any other
    corpus = load_corpus(tmp_path / "t.txt")
    assert corpus.root == resolve_corpus(tmp_path / "t.txt") != root
    assert len(corpus.splits) == 3 and corpus.vocab.index["line"] >= 0
    monkeypatch.chdir(tmp_path)  # a bare name of a file in the current directory, too
    assert resolve_corpus("t.txt") == corpus.root
    capsys.readouterr()
    assert main(["data", "split", str(tmp_path / "nothere.txt")]) == 2
    assert capsys.readouterr().err.startswith("hlbl: error: ")
    with pytest.raises(SystemExit, match="2"):
        main(["data", "split", "x", "--test", "1"])
    assert "--test: expected a number between 0 and 1" in capsys.readouterr().err


def test_ngram_train_takes_one_file(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HLBL_CACHE", str(tmp_path / "cache"))
    text_file(tmp_path / "t.txt", 100)
    assert (
        main(["ngram", "train", "--data", str(tmp_path / "t.txt"), "--order", "2", "--out", str(tmp_path / "m.arpa")])
        == 0
    )
    assert (tmp_path / "m.arpa").read_text().startswith("#") or "\\data\\" in (tmp_path / "m.arpa").read_text()


def test_a_run_trained_on_one_file_records_the_file_and_eval_finds_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HLBL_CACHE", str(tmp_path / "cache"))
    rng = np.random.default_rng(0)
    words = ["the", "cat", "dog", "sees", "a", "bird"]
    (tmp_path / "t.txt").write_text("\n".join(" ".join(rng.choice(words, 5)) for _ in range(150)) + "\n")
    run = str(tmp_path / "run")
    common = ["--epochs", "1", "--dim", "8", "--context", "2", "--quiet", "--device", "cpu"]
    assert main(["train", "--data", str(tmp_path / "t.txt"), "--out", run, *common]) == 0
    assert json.loads((tmp_path / "run" / "run.json").read_text())["corpus"]["spec"] == str(
        (tmp_path / "t.txt").resolve()
    )
    capsys.readouterr()
    monkeypatch.chdir(tmp_path / "cache")  # from anywhere
    assert main(["eval", run, "--device", "cpu"]) == 0
    assert "perplexity" in capsys.readouterr().out
