"""Text rules and the vocabulary (hlbl.data.vocab)."""

import numpy as np
import pytest

from conftest import write_corpus
from hlbl.data import vocab as vocab_module
from hlbl.data import load_corpus
from hlbl.data.vocab import EOS, UNK, Vocab, count_file, iter_sentences
from hlbl.errors import ConfigError, DataError


def test_vocabulary_rules(tmp_path):
    root = write_corpus(tmp_path / "c", {"train": ["b a a", "c a b", "d"], "valid": ["a z"], "test": ["q"]})
    c = load_corpus(root, min_count=1)
    assert c.vocab.words[:4] == (EOS, "a", "b", "c")  # by count, ties by text ("<" < "a")
    assert UNK in c.vocab.words and c.vocab.counts[c.vocab.unk] == 0
    assert c.vocab.decode(c["valid"]) == ["a", UNK, EOS]
    small = load_corpus(root, max_vocab=4, min_count=1)
    assert len(small.vocab) == 4 and set(small.vocab.words) == {"a", "b", EOS, UNK}
    # the two dropped training tokens (c, d) become <unk> and count as such
    assert small.vocab.counts[small.vocab.unk] == 2
    assert small.vocab.decode(small["train"][:4]) == ["b", "a", "a", EOS]
    assert len(load_corpus(root, min_count=2).vocab) == 4


def test_line_endings_blank_lines_and_cache(tmp_path):
    root = tmp_path / "c"
    root.mkdir()
    (root / "train.txt").write_bytes(b"a b\r\n\r\n  \nb a\rc\n")
    (root / "valid.txt").write_bytes(b"a\n")
    (root / "test.txt").write_bytes(b"b")  # no final newline
    c = load_corpus(root, min_count=1)
    assert c.vocab.decode(c["train"]) == ["a", "b", EOS, "b", "a", EOS, "c", EOS]
    assert c.vocab.decode(c["test"]) == ["b", EOS]
    again = load_corpus(root, min_count=1)
    assert np.array_equal(again["train"], c["train"])


def test_vocab_json_round_trip_and_errors():
    v = Vocab(("a", EOS, UNK), (3, 2, 0))
    assert Vocab.from_json(v.to_json()) == v
    with pytest.raises(DataError, match="lacks"):
        Vocab(("a", EOS), (1, 1))
    head = {"format": "hlbl-vocab", "version": 1}
    with pytest.raises(DataError, match="malformed"):
        Vocab.from_json({**head, "words": ["a"]})
    for words, counts in (([1, EOS, UNK], [3, 2, 0]), (["a", EOS, UNK], [3, 2.7, 0]), (["a", EOS, UNK], [3, -2, 0])):
        with pytest.raises(DataError, match="malformed vocabulary"):
            Vocab.from_json({**head, "words": words, "counts": counts})
    with pytest.raises(DataError, match="not an hlbl vocabulary"):
        Vocab.from_json({"words": list(v.words), "counts": list(v.counts)})  # no format name
    with pytest.raises(DataError, match="version None is not supported"):
        Vocab.from_json({**v.to_json(), "version": None})


def test_non_utf8_error_names_the_line_and_a_bom_is_no_word(tmp_path):
    root = write_corpus(tmp_path / "c", {"train": ["a b"], "valid": ["a"], "test": ["b"]})
    good = "".join(f"line {i} ok\n" for i in range(3000)).encode()
    (root / "train.txt").write_bytes(good + b"caf\xe9\n" + good)
    with pytest.raises(DataError, match="bad byte 0xe9 on line 3001, byte 4 of the line"):
        load_corpus(root)
    (root / "train.txt").write_bytes("\ufeffThe cat\nthe dog\n".encode("utf-8"))
    assert (
        "\ufeffThe" not in load_corpus(root, min_count=1).vocab.words
        and "The" in load_corpus(root, min_count=1).vocab.words
    )


def test_min_count_auto_holds_out_singletons_only_when_training_has_no_unk(tmp_path):
    root = write_corpus(tmp_path / "c", {"train": ["b a a", "c a b", "d"], "valid": ["a z"], "test": ["q"]})
    auto = load_corpus(root).vocab  # no <unk> in training: words seen once (c, d) become <unk>
    assert set(auto.words) == {EOS, UNK, "a", "b"} and auto.counts[auto.unk] == 2
    root2 = write_corpus(tmp_path / "p", {"train": ["b a <unk>", "c a b", "d"], "valid": ["a"], "test": ["q"]})
    kept = load_corpus(root2).vocab  # PTB-style: <unk> already in the text, every word kept
    assert {"c", "d"} <= set(kept.words) and kept.counts[kept.unk] == 1
    with pytest.raises(ConfigError, match="^min_count must be a positive whole number or auto, got 0$"):
        load_corpus(root, min_count=0)


def test_large_files_show_progress_on_a_terminal_only(tmp_path, monkeypatch):
    import io
    import sys

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    root = write_corpus(tmp_path / "c", {"train": ["a b c"] * 200_000, "valid": ["a"], "test": ["b"]})
    monkeypatch.setattr(vocab_module, "PROGRESS_BYTES", 0)
    for stream, shown in ((Terminal(), True), (io.StringIO(), False)):
        monkeypatch.setattr(sys, "stderr", stream)
        assert count_file(root / "train.txt")["a"] == 200_000
        assert ("counting train.txt" in stream.getvalue()) == shown


def test_a_very_long_line_is_read_in_pieces_with_one_eos(tmp_path, monkeypatch):
    """text8-style corpora are one huge line: read in pieces (bounded memory), same stream."""
    words = [f"w{i % 37}" for i in range(5000)]
    root = tmp_path / "c"
    root.mkdir()
    (root / "train.txt").write_text(" ".join(words) + "\nshort line\n\n" + "  ".join(words[:300]) + "  \n")
    (root / "valid.txt").write_text("w1 w2\n")
    (root / "test.txt").write_text("w3\n")
    whole = load_corpus(root, cache_dir=tmp_path / "cache1")
    monkeypatch.setattr(vocab_module, "LONG_LINE", 50)  # pieces of ~50 characters, cut at spaces
    pieces = list(iter_sentences(root / "train.txt"))
    assert len(pieces) > 100 and sum(end for _, end in pieces) == 3
    assert [t for p, _ in pieces for t in p] == words + ["short", "line"] + words[:300]
    cut = load_corpus(root, cache_dir=tmp_path / "cache2")
    assert cut.vocab == whole.vocab and np.array_equal(cut["train"], whole["train"])
    assert int((whole["train"] == whole.vocab.eos).sum()) == 3


def test_a_vocabulary_pickles_after_its_index_is_built():
    import copy
    import pickle

    v = Vocab(("<eos>", "<unk>", "a"), (3, 0, 2))
    assert v.index["a"] == 2
    assert pickle.loads(pickle.dumps(v)) == v and copy.deepcopy(v).index == v.index


def test_encoding_maps_unknown_words_to_unk_and_counts_them():
    vocab = Vocab([EOS, UNK, "the", "cat"], [5, 0, 3, 2])
    assert vocab.encode_counting_oov(["the", "dog", "cat", "emu"]) == ([2, 1, 3, 1], 2)
    assert vocab.encode_counting_oov(["the", UNK]) == ([2, 1], 0)  # <unk> itself is a word
    assert vocab.encode(["dog", "the"]) == [1, 2]
    assert vocab.encode_counting_oov([]) == ([], 0)
