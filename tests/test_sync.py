"""hlbl.sync without a process group: the overlapped rule's arithmetic against numpy, with a
stand-in for the other process, its buffers, and runs written before its setting (the rule
within training is checked against autograd by two processes in test_distributed.py)."""

import json

import numpy as np
import pytest
import torch

from conftest import tiny_corpus
from hlbl import sync
from hlbl.config import TrainConfig
from hlbl.data import load_corpus
from hlbl.errors import ConfigError
from hlbl.fast import _powers
from hlbl.model import LBL, LBLConfig
from hlbl.run import Run, fit
from hlbl.tree import random_tree


class OneOther:
    """A mixer of this process and one other that touched every row, its values ``other`` (laid
    out as DelayedSync's send buffer: the flags, then each table's pairs' value and buffer)."""

    rank, world, every, overlap = 0, 2, 2, True

    def __init__(self):
        self.other = None

    def sum_async(self, values):
        def wait():
            values[:] += self.other

        return wait


def tables(V=7, N=6, n=3, d=4, momentum=True):
    rng = np.random.default_rng(0)
    P = _powers(0.1, 0.9 if momentum else 0.0, 0.01, 8)

    def pair(*shape):
        value = rng.random(shape, dtype=np.float32)
        return sync.Pair(value, rng.random(shape, dtype=np.float32) if momentum else None, P)

    records = rng.random((N, 4), dtype=np.float32)  # biases live in strided records
    bias = sync.Pair(records[:, 0], records[:, 1] if momentum else None, P)
    return [pair(V, d)], [pair(n, d)], [pair(N, d), bias], np.zeros(V, np.int64), np.zeros(N, np.int64)


@pytest.mark.parametrize("momentum", [True, False])
def test_the_means_land_a_round_late_on_the_rows_caught_up_since(momentum):
    """Round r's mean m of a row (this process's x_r where it touched it, the other's y) becomes
    A^k m where this process does not touch the row in round r+1 and x + A^k (m - x_r) where it
    does; A^k as the catch-up's gradient-free steps, k = 3 steps between the rounds' ends."""
    words, context, nodes, last_w, last_n = tables(momentum=momentum)
    group = OneOther()
    s = sync.DelayedSync(words, context, nodes, last_w, last_n, group)
    s.prepare()
    rng = np.random.default_rng(1)
    group.other = rng.random(s.send.size, dtype=np.float32)
    flags = sum(len(t[0].value) for t in s.tables)
    group.other[:flags] = 1.0  # the other process touched every row
    touched = [np.arange(7) % 2 == 0, np.ones(3, bool), np.arange(6) < 3]
    x_r = [[a.copy() for a in p.arrays] for t in s.tables for p in t]
    s.launch(touched, 2)
    for table in s.tables:  # round r+1: this process's rows move (here by the gradient-free steps
        for pair in table:  # and a nudge standing for its gradients)
            sync.gradient_free(pair, 3)
            pair.value += 0.01
    x = [[a.copy() for a in p.arrays] for t in s.tables for p in t]
    again = [np.arange(7) < 4, np.zeros(3, bool), np.arange(6) % 2 == 1]
    s.land(again, 5)

    at, i = flags, 0
    for t, table in enumerate(s.tables):
        for pair in table:
            mine = touched[t].reshape((-1,) + (1,) * (pair.value.ndim - 1))
            means = []
            for a in x_r[i]:
                y = group.other[at : at + a.size].reshape(a.shape)
                means.append((a * mine + y) / (mine + 1.0))
                at += a.size
            A = pair.powers[3]
            if not momentum:  # (no buffer: only A's first entry acts)
                means.append(np.zeros_like(means[0]))
                x_r[i].append(np.zeros_like(means[0]))
                x[i].append(np.zeros_like(means[0]))
            own = again[t].reshape(mine.shape)
            want = [
                np.where(own, x[i][e] + A[e, 0] * (means[0] - x_r[i][0]) + A[e, 1] * (means[1] - x_r[i][1]),
                         A[e, 0] * means[0] + A[e, 1] * means[1])
                for e in range(len(pair.arrays))
            ]  # fmt: skip
            for got, w in zip(pair.arrays, want):
                np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-6)
            i += 1


def test_buffers_are_kept_for_the_next_epoch_and_a_failed_allocation_is_a_setting_error(monkeypatch):
    kept = {}
    first = sync.DelayedSync(*tables(), OneOther(), kept)
    second = sync.DelayedSync(*tables(), OneOther(), kept)
    assert second.send is first.send and second.snap is first.snap
    bigger = tables(V=9)  # (made before numpy's allocation fails)

    def no_memory(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(sync.np, "empty", no_memory)
    with pytest.raises(ConfigError, match="sync_overlap needs .* GiB more memory") as e:
        sync.DelayedSync(*bigger, OneOther(), kept)
    assert e.value.field == "sync_overlap"


def test_a_run_json_written_before_the_setting_reads_as_blocking_rounds(tmp_path):
    corpus = load_corpus(tiny_corpus(tmp_path / "corpus", n_train=50))
    V = len(corpus.vocab)
    model = LBL(LBLConfig(V, dim=4, context=2), random_tree(V, 0), torch.Generator().manual_seed(0))
    fit(model, corpus, TrainConfig(max_epochs=1, progress=False), tmp_path / "old", log=lambda *a: None)
    path = tmp_path / "old" / "run.json"
    info = json.loads(path.read_text())
    assert info["train"].pop("sync_overlap") is False
    path.write_text(json.dumps(info))
    assert Run.open(tmp_path / "old").record.train.sync_overlap is False
