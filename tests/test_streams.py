"""Contexts, epoch orders and reading encoded streams (hlbl.data.streams)."""

import numpy as np
import pytest

from hlbl.data.streams import (
    EpochOrder,
    EpochReader,
    mapped_file,
    batches,
    contexts,
    epoch_order,
    epoch_span,
    read_tokens,
    stream_fingerprint,
    stream_pieces,
    stream_windows,
)


def test_contexts_are_padded_with_eos():
    stream = np.array([5, 6, 7, 8], dtype=np.int32)
    ctx = contexts(stream, np.arange(4), 3, pad=0)
    assert ctx.tolist() == [[0, 0, 0], [0, 0, 5], [0, 5, 6], [5, 6, 7]]
    got = list(batches(stream, 2, 3, pad=0))
    assert [t.tolist() for _, t in got] == [[5, 6, 7], [8]]
    assert got[1][0].tolist() == [[6, 7]]


def test_epoch_order_is_the_seeded_permutation_in_int32():
    order = epoch_order(3, 2, 10_001)
    assert order.dtype == np.int32
    assert np.array_equal(order, np.random.default_rng([3, 2]).permutation(10_001))
    assert not np.array_equal(order, epoch_order(3, 3, 10_001)) and not np.array_equal(order, epoch_order(4, 2, 10_001))


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
        assert mapped_file(view) is not None
        out = np.empty(50, np.int32)
        read_tokens(view, 9, out)
        assert np.array_equal(out, ids[first + 9 : first + 59])
        assert np.array_equal(np.concatenate([part.copy() for part in stream_pieces(view, 333)]), np.asarray(view))
    assert mapped_file(whole[::2]) is None  # not contiguous: read as an array
    assert mapped_file(ids) is None


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
