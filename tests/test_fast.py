"""The fast CPU engine against the PyTorch (autograd + torch.optim.SGD) path, on the same batches."""

import copy

import numpy as np
import pytest

from hlbl.errors import ConfigError
import torch

from conftest import multi_code_tree
from hlbl import data, fast
from hlbl.evaluate import token_log_probs
from hlbl.model import LBL, LBLConfig
from hlbl.config import TrainConfig
from hlbl.engine import train_epoch
from hlbl.optim import make_optimizer
from hlbl.tree import WordTree, random_tree


def doubled_tree(V: int, dup: int, seed: int) -> WordTree:
    """Random tree over all V words beside a random tree over the first ``dup`` words, under a new root.

    Words < dup have two codes (at different depths), the others one: exercises -1 padding of
    word_leaves and the posterior split of the gradient between paths.
    """
    a = random_tree(V, seed).children
    b = random_tree(dup, seed + 1).children.copy()
    b = np.where(b >= 0, b + 1 + len(a), b)  # internal ids after the root and tree a; leaves keep words < dup
    a = np.where(a >= 0, a + 1, a)
    return WordTree(np.concatenate([[[1, 1 + len(a)]], a, b]), V)


TREES = {
    "single": lambda: random_tree(41, 3),
    "multi_partial": lambda: doubled_tree(41, 13, 5),
    "multi_hand": multi_code_tree,  # a word with three leaves
}


def make_model(tree: WordTree, seed: int = 0, dim: int = 16, context: int = 3) -> LBL:
    V = tree.num_words
    model = LBL(LBLConfig(V, dim=dim, context=context), tree, torch.Generator().manual_seed(seed))
    counts = np.random.default_rng(seed).integers(1, 100, size=V)
    model.init_unigram(counts)
    with torch.no_grad():  # non-trivial biases and scores, so saturation and signs matter
        model.out.bias.add_(torch.randn(model.out.bias.shape, generator=torch.Generator().manual_seed(seed + 1)))
    return model


def stream_for(V: int, n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, V, size=n).astype(np.int32)


def run_both(tree, optimizer, n_tokens, batch, lr=0.05, wd=(0.1, 0.03), threads=1, model=None):
    """Train one epoch with both engines from identical copies; return (torch model, fast model, losses, start)."""
    model = make_model(tree) if model is None else model
    start = copy.deepcopy(model)
    cfg = TrainConfig(
        lr=lr,
        batch_size=batch,
        optimizer=optimizer,
        momentum=0.9,
        weight_decay_words=wd[0],
        weight_decay_other=wd[1],
        seed=7,
        progress=False,
    )
    stream = stream_for(tree.num_words, n_tokens, 11)
    pad = 0
    m_t, m_f = copy.deepcopy(model), copy.deepcopy(model)
    opt_t, opt_f = make_optimizer(m_t, cfg, lr), make_optimizer(m_f, cfg, lr)
    loss_t, _ = train_epoch(m_t, opt_t, stream, pad, cfg, 1, False)
    loss_f, _ = fast.FastEngine(threads=threads)(m_f, opt_f, stream, pad, cfg, 1, False)
    return (m_t, opt_t), (m_f, opt_f), (loss_t, loss_f), start


def assert_params_close(a: LBL, b: LBL, start: LBL, atol=2e-6):
    for (name, pa), (_, pb), (_, p0) in zip(a.named_parameters(), b.named_parameters(), start.named_parameters()):
        moved = (pa - p0).abs().max().item()
        assert moved > 50 * atol, f"{name} did not move: the comparison would be vacuous"
        err = (pa - pb).abs().max().item()
        assert err <= atol + 1e-5 * moved, f"{name}: fast and torch differ by {err:.3g} (moved {moved:.3g})"


@pytest.mark.parametrize("tree_name", list(TREES))
@pytest.mark.parametrize("optimizer", ["sgd", "momentum"])
def test_one_step_equals_autograd_sgd(tree_name, optimizer):
    """One batch = the whole stream: one SGD step on the summed loss, with L2 on every row."""
    (m_t, _), (m_f, _), (lt, lf), start = run_both(TREES[tree_name](), optimizer, n_tokens=96, batch=96)
    assert lf == pytest.approx(lt, rel=1e-5)
    assert_params_close(m_t, m_f, start)


@pytest.mark.parametrize("tree_name", ["single", "multi_partial"])
def test_many_steps_lazy_momentum_is_exact(tree_name):
    """Several steps with momentum and decay: rows skipped by batches are caught up exactly,
    and the momentum buffers left in the torch optimiser equal torch's own."""
    (m_t, o_t), (m_f, o_f), (lt, lf), start = run_both(TREES[tree_name](), "momentum", n_tokens=700, batch=64)
    assert lf == pytest.approx(lt, rel=1e-5)
    assert_params_close(m_t, m_f, start, atol=1e-5)
    for p_t, p_f in zip(m_t.parameters(), m_f.parameters()):
        b_t, b_f = o_t.state[p_t]["momentum_buffer"], o_f.state[p_f]["momentum_buffer"]
        assert torch.allclose(b_t, b_f, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("block", [4096, 16])
def test_windowed_epoch_order_trains_like_the_torch_engine(monkeypatch, threads, block):
    """A stream longer than ORDER_IN_MEMORY is visited through windows of the seeded bijection,
    group by group of blocks (block 16: 11 groups of 4 blocks; more than a window of either engine
    holds), read through each engine's bounded reader; both engines read the same windows (Hogwild
    threads each their own), so one thread stays exact, and the order is not the in-memory
    permutation (the switch really happened)."""
    monkeypatch.setattr(data.streams, "ORDER_IN_MEMORY", 100)
    monkeypatch.setattr(data.streams, "BLOCK_TOKENS", block)
    monkeypatch.setattr(data.streams, "GROUP_BLOCKS", 4)
    assert not data.EpochOrder(7, 1, 700).in_memory
    (m_t, _), (m_f, _), (lt, lf), start = run_both(
        TREES["single"](), "momentum", n_tokens=700, batch=64, threads=threads
    )
    if threads == 1:
        assert lf == pytest.approx(lt, rel=1e-5)
        assert_params_close(m_t, m_f, start, atol=1e-5)
    else:
        assert abs(lf - lt) < 0.05 * abs(lt)
    monkeypatch.setattr(data.streams, "ORDER_IN_MEMORY", 1 << 24)
    (m_t2, _), _, (lt2, _), _ = run_both(TREES["single"](), "momentum", n_tokens=700, batch=64)
    assert lt2 != lt


@pytest.mark.parametrize("windowed", [False, True])
def test_epochs_that_cut_a_pass_take_the_steps_of_the_whole_pass(monkeypatch, windowed):
    """epoch_tokens cuts a pass into epochs on minibatch boundaries: three epochs (256 + 256 + 188
    positions) take the whole pass's minibatches. The torch engine's parameters equal the uncut
    pass's to the bit; the fast engine, which catches every row up at each epoch's end, stays as
    close to them as it is to torch on one pass; the losses' weighted mean is the pass's loss."""
    if windowed:  # the long-stream order, read a window at a time
        monkeypatch.setattr(data.streams, "ORDER_IN_MEMORY", 100)
        monkeypatch.setattr(data.streams, "BLOCK_TOKENS", 16)
        monkeypatch.setattr(data.streams, "GROUP_BLOCKS", 4)
    tree = TREES["multi_partial"]()
    start = make_model(tree)
    stream = stream_for(tree.num_words, 700, 11)
    recipe = dict(lr=0.05, batch_size=64, momentum=0.9, weight_decay_words=0.1, weight_decay_other=0.03, seed=7)
    whole, cut = TrainConfig(**recipe, epoch_tokens=0, progress=False), TrainConfig(**recipe, epoch_tokens=250)
    assert [data.epoch_span(700, e, 250, 64).hi for e in (1, 2, 3)] == [256, 512, 700]
    models, losses = {}, {}
    for engine, runner in (("torch", train_epoch), ("fast", fast.train_epoch)):
        for name, cfg, epochs in (("whole", whole, [1]), ("cut", cut, [1, 2, 3])):
            m = copy.deepcopy(start)
            opt = make_optimizer(m, cfg, cfg.lr)
            losses[engine, name] = [runner(m, opt, stream, 0, cfg, e, False)[0] for e in epochs]
            models[engine, name] = m
    for a, b in zip(models["torch", "whole"].parameters(), models["torch", "cut"].parameters()):
        assert torch.equal(a, b)
    assert_params_close(models["torch", "whole"], models["fast", "cut"], start, atol=1e-5)
    for engine in ("torch", "fast"):
        mean = np.dot(losses[engine, "cut"], [256, 256, 188]) / 700
        assert mean == pytest.approx(losses[engine, "whole"][0], rel=1e-5)
    assert losses["torch", "cut"][0] != pytest.approx(losses["torch", "whole"][0], rel=1e-3)  # parts, not passes


def test_a_mapped_long_stream_trains_as_the_same_stream_in_memory(monkeypatch, tmp_path):
    """A memory-mapped stream past ORDER_IN_MEMORY is read through its file (data.EpochReader):
    the same parameters, to the bit, as the same tokens held in memory."""
    monkeypatch.setattr(data.streams, "ORDER_IN_MEMORY", 100)
    monkeypatch.setattr(data.streams, "BLOCK_TOKENS", 16)
    monkeypatch.setattr(data.streams, "GROUP_BLOCKS", 4)
    tree = TREES["single"]()
    stream = stream_for(tree.num_words, 700, 11).astype("<i4")
    stream.tofile(tmp_path / "s.i32")
    mapped = np.memmap(tmp_path / "s.i32", dtype="<i4", mode="r", shape=(700,))
    cfg = TrainConfig(lr=0.05, batch_size=64, optimizer="momentum", momentum=0.9, seed=7, progress=False)
    out = []
    for s in (stream, mapped):
        m = make_model(tree)
        loss, _ = fast.FastEngine(threads=1)(m, make_optimizer(m, cfg, 0.05), s, 0, cfg, 1, False)
        out.append((loss, [p.detach().clone() for p in m.parameters()]))
    assert out[0][0] == out[1][0]
    assert all(torch.equal(a, b) for a, b in zip(out[0][1], out[1][1]))


@pytest.mark.parametrize("tree_name", list(TREES))
def test_blocks_do_not_change_the_step(tree_name):
    """A step runs in blocks of examples (each row caught up before its first reader, stepped after
    its last): any block size gives the same parameters and momentum, to the bit."""
    tree = TREES[tree_name]()
    model = make_model(tree)
    cfg = TrainConfig(
        lr=0.05,
        batch_size=60,
        optimizer="momentum",
        momentum=0.9,
        weight_decay_words=0.1,
        weight_decay_other=0.03,
        seed=7,
        progress=False,
    )
    stream = stream_for(tree.num_words, 500, 11)
    results = []
    for block in (60, 1, 7, 64):  # one block; one example each; uneven blocks; larger than the batch
        m = copy.deepcopy(model)
        opt = make_optimizer(m, cfg, cfg.lr)
        loss, _ = fast.FastEngine(threads=1).train(m, opt, stream, 0, cfg, 1, False, fast.Probe(block=block))
        results.append(
            (
                loss,
                [p.detach().clone() for p in m.parameters()],
                [opt.state[p]["momentum_buffer"].clone() for p in m.parameters()],
            )
        )
    loss0, params0, bufs0 = results[0]
    assert not torch.equal(params0[0], model.R.weight)
    for loss, params, bufs in results[1:]:
        assert loss == loss0
        assert all(torch.equal(a, b) for a, b in zip(params, params0))
        assert all(torch.equal(a, b) for a, b in zip(bufs, bufs0))
    with pytest.raises(ValueError, match="block"):
        fast.FastEngine().train(
            model, make_optimizer(model, cfg, cfg.lr), stream, 0, cfg, 1, False, fast.Probe(block=0)
        )


def test_by_block_schedules_each_row_between_its_first_and_last_reader():
    """kernels._by_block on a hand-made grouping: rows are caught up before the block of their first
    entry and stepped after the block of their last."""
    from hlbl import kernels

    keys = np.array([5, 3, 5, 9, 3, 7, 8, 5], np.int32)  # 2 entries per example, 4 examples
    slot = np.full(10, -1, np.int32)
    uniq, start, ent, cursor = (np.empty(len(keys) + 1, np.int64) for _ in range(4))
    nu = kernels._csr(keys, slot, uniq, start, cursor, ent)
    assert list(uniq[:nu]) == [5, 3, 9, 7, 8]
    first, off, order = np.empty(5, np.int64), np.empty(5, np.int64), np.empty(nu, np.int64)
    kernels._by_block(uniq, nu, start, ent, 4, 2, first, off, order)  # blocks: examples {0, 1}, {2, 3}
    caught = [list(uniq[first[s] : first[s + 1]]) for s in range(2)]
    stepped = [list(uniq[order[off[s] : off[s + 1]]]) for s in range(2)]
    assert caught == [[5, 3, 9], [7, 8]]
    assert stepped == [[9], [5, 3, 7, 8]]


@pytest.mark.parametrize("tree_name", list(TREES))
def test_word_paths_hold_every_code(tree_name):
    """The kernels' path table: a record per word and code, the length, then 2 * node + bit per step."""
    tree = TREES[tree_name]()
    model = make_model(tree)
    engine = fast.FastEngine()
    paths = engine.word_paths(model.out.tree)
    assert paths.codes.shape[1] % 16 == 0 and paths.codes.shape[1] > tree.leaf_depth.max()
    assert paths.first[0] == 0 and paths.first[-1] == len(paths.codes) == len(tree.leaf_depth)
    assert paths.most == max(len(tree.codes(w)) for w in range(tree.num_words))
    for w in range(tree.num_words):
        codes = tree.codes(w)
        assert paths.first[w + 1] - paths.first[w] == len(codes)
        for k, (nodes, bits) in enumerate(codes):
            r = paths.first[w] + k
            steps = paths.codes[r, 1 : 1 + paths.codes[r, 0]]
            assert (steps >> 1).tolist() == nodes and (steps & 1).tolist() == bits
    assert engine.word_paths(model.out.tree) is paths  # built once, kept by the engine
    assert fast.FastEngine().word_paths(model.out.tree) is not paths  # each engine its own
    assert "_fast_word_paths" not in vars(model.out)  # (nothing kept on the layer)


def test_interrupted_epoch_keeps_the_bias_steps(monkeypatch):
    """The node biases live in the engine's row records during an epoch; an epoch stopped by an
    exception still copies them back (like the rows, which the steps update in place)."""
    model = make_model(TREES["single"]())
    start = model.out.bias.detach().clone()
    cfg = TrainConfig(lr=0.05, batch_size=10, optimizer="momentum", seed=7, progress=False)
    real, calls = fast.train_steps, []

    def stop_after_first_chunk(steps, *args):
        if len(calls) == 2:
            raise KeyboardInterrupt
        calls.append(len(steps))
        return real(steps, *args)

    monkeypatch.setattr(fast, "train_steps", stop_after_first_chunk)
    with pytest.raises(KeyboardInterrupt):
        fast.train_epoch(model, make_optimizer(model, cfg, cfg.lr), stream_for(41, 1000, 3), 0, cfg, 1, False)
    assert calls[1] > 0 and not torch.equal(model.out.bias, start)


def test_gradient_is_split_by_path_posterior():
    """Every word of doubled_tree(V, V) has two codes; a one-path (or averaged) gradient would not match torch."""
    (m_t, _), (m_f, _), _, start = run_both(doubled_tree(20, 20, 2), "sgd", n_tokens=60, batch=60, wd=(0.0, 0.0))
    assert_params_close(m_t, m_f, start)


def test_one_thread_is_reproducible_and_hogwild_stays_close():
    tree = TREES["multi_partial"]()
    flat = lambda m: torch.cat([p.detach().reshape(-1) for p in m.parameters()])
    (_, (a, _), (_, la), start), (_, (b, _), (_, lb), _) = (
        run_both(tree, "momentum", n_tokens=2000, batch=50, lr=0.01, threads=1) for _ in range(2)
    )
    assert torch.equal(flat(a), flat(b)) and la == lb
    _, (c, _), (_, lc), _ = run_both(tree, "momentum", n_tokens=2000, batch=50, lr=0.01, threads=2)
    # Hogwild: the same steps, overlapping in time; close to the sequential result, not equal to it.
    assert (flat(c) - flat(a)).norm() < 0.3 * (flat(a) - flat(start)).norm()
    assert lc == pytest.approx(la, rel=0.03)


@pytest.mark.parametrize("optimizer", ["sgd", "momentum"])
def test_hogwild_applies_each_steps_decay_once(optimizer):
    """With R = C = 0 the context vector is 0 and no node gets a gradient: every node row must end
    at exactly A^S[0, 0] times its start, however two threads interleave their steps. (A thread
    that caught a row up through a step another thread had not yet applied used to apply that
    step's decay and momentum a second time: rows ended 4-7x too small with SGD.)"""
    tree = random_tree(64, 0)
    model = make_model(tree, dim=32)
    with torch.no_grad():
        model.R.weight.zero_()
        model.C.zero_()
    Q0 = model.out.weight.detach().double().clone()
    lr, wd, B, mu = 0.01, 0.02, 50, (0.9 if optimizer == "momentum" else 0.0)
    cfg = TrainConfig(
        lr=lr, batch_size=B, optimizer=optimizer, weight_decay_words=0.0, weight_decay_other=wd, seed=7, progress=False
    )
    stream = stream_for(64, 20_000, 0)
    fast.FastEngine(threads=2)(model, make_optimizer(model, cfg, lr), stream, 0, cfg, 1, False)
    steps = len(stream) // B
    A = np.array([[1 - lr * wd * B, -lr * mu], [wd * B, mu]])  # the L2 term is per example: B per step
    expected = np.linalg.matrix_power(A, steps)[0, 0] * Q0
    ratio = (model.out.weight.detach().double().norm(dim=1) / expected.norm(dim=1)).numpy()
    # Lock-free writes of one row by two threads can still lose an element's update (Hogwild), and
    # a loaded machine makes that likelier: a loose bound, still far from the 4-7x of the bug.
    assert np.median(ratio) == pytest.approx(1.0, abs=0.02)
    assert ratio.min() > 0.5


@pytest.mark.parametrize("tree_name", list(TREES))
def test_scoring_matches_torch(tree_name):
    model = make_model(TREES[tree_name](), seed=4)
    stream = stream_for(model.config.vocab_size, 1000, 3)
    ref = token_log_probs(model, stream, pad=1, engine="torch")
    got = fast.token_log_probs(model, stream, pad=1)
    assert got.dtype == np.float64 and got.shape == (1000,)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    # auto (the default) takes the fast path on the CPU
    np.testing.assert_array_equal(token_log_probs(model, stream, pad=1), got)


@pytest.mark.parametrize("scale", [40.0, 900.0])
def test_saturated_nodes_are_exact(scale):
    """Scores far in both tails: log-probabilities exact (no underflow to -inf), gradients too."""
    tree = TREES["multi_partial"]()
    model = make_model(tree, seed=5)
    with torch.no_grad():
        nb = model.out.bias.numel()
        model.out.bias.copy_(
            torch.linspace(-scale, scale, nb)[torch.randperm(nb, generator=torch.Generator().manual_seed(0))]
        )
    stream = stream_for(model.config.vocab_size, 500, 6)
    ref = token_log_probs(model, stream, pad=1, engine="torch")
    got = fast.token_log_probs(model, stream, pad=1)
    assert np.isfinite(got).all() and got.min() < -100
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-3)
    (m_t, _), (m_f, _), (lt, lf), start = run_both(tree, "sgd", n_tokens=64, batch=64, lr=1e-3, model=model)
    assert lf == pytest.approx(lt, rel=1e-5)
    assert_params_close(m_t, m_f, start, atol=1e-6)


def test_unsupported_models_are_named():
    tree = random_tree(10, 0)
    flat = LBL(LBLConfig(10, dim=4, context=2, output="flat"))
    assert "tree output" in fast.unsupported(flat)
    full = LBL(LBLConfig(10, dim=4, context=2, full_context=True), tree)
    assert "diagonal" in fast.unsupported(full)
    ok = LBL(LBLConfig(10, dim=4, context=2), tree)
    assert fast.unsupported(ok, cfg=TrainConfig(optimizer="adam")) is not None
    assert fast.unsupported(ok, cfg=TrainConfig()) is None
    with pytest.raises(ValueError, match="token ids"):
        fast.token_log_probs(ok, np.array([0, 3, 10], np.int32), 0)
    with pytest.raises(ValueError, match="pad id"):
        fast.train_epoch(
            ok, make_optimizer(ok, TrainConfig(), 1e-3), np.zeros(10, np.int32), 10, TrainConfig(), 1, False
        )
    with pytest.raises(ValueError, match="fast engine"):
        fast.train_epoch(
            flat, make_optimizer(flat, TrainConfig(), 1e-3), np.zeros(10, np.int32), 0, TrainConfig(), 1, False
        )


def test_engine_factory_picks_one_implementation():
    from hlbl.engine import choose_engine

    tree = random_tree(10, 0)
    hlbl = LBL(LBLConfig(10, dim=4, context=2), tree)
    flat = LBL(LBLConfig(10, dim=4, context=2, output="flat"))
    assert isinstance(choose_engine(hlbl, TrainConfig()), fast.FastEngine)  # auto, CPU, momentum
    assert isinstance(choose_engine(hlbl, TrainConfig(optimizer="sgd", engine="fast")), fast.FastEngine)
    assert choose_engine(hlbl, TrainConfig(engine="torch")) is train_epoch
    assert choose_engine(hlbl, TrainConfig(optimizer="adam")) is train_epoch  # auto falls back
    assert choose_engine(flat, TrainConfig()) is train_epoch
    with pytest.raises(ConfigError, match="engine 'fast' cannot train this model"):
        choose_engine(flat, TrainConfig(engine="fast"))
    with pytest.raises(ValueError, match="engine 'gpu' is unknown"):
        TrainConfig(engine="gpu")


def test_fit_with_either_engine_gives_the_same_model(tmp_path):
    """Whole training runs (early stopping, lr drop, checkpoints) agree across engines."""
    import json

    from conftest import tiny_corpus
    from hlbl.data import load_corpus
    from hlbl.run import fit

    corpus = load_corpus(tiny_corpus(tmp_path / "corpus", n_train=200))
    V = len(corpus.vocab)
    models, metrics = {}, {}
    for engine in ("torch", "fast"):
        model = LBL(LBLConfig(V, dim=8, context=3), random_tree(V, 0), torch.Generator().manual_seed(0))
        model.init_unigram(corpus.vocab.counts)
        cfg = TrainConfig(lr=0.01, lr_final=0.001, batch_size=64, max_epochs=12, seed=0, progress=False, engine=engine)
        state = fit(model, corpus, cfg, tmp_path / engine, log=lambda *a: None)
        assert state.done, "the test needs early stopping to end the run"
        models[engine] = model
        lines = (tmp_path / engine / "metrics.jsonl").read_text().splitlines()
        metrics[engine] = [(m["epoch"], m["lr"], m["improved"], m["valid_ppl"]) for m in map(json.loads, lines)]
    lrs = [m[1] for m in metrics["torch"]]
    assert 0.01 in lrs and 0.001 in lrs, "the test needs the learning-rate drop (best weights restored)"
    assert [m[:3] for m in metrics["torch"]] == [m[:3] for m in metrics["fast"]]
    for a, b in zip(metrics["torch"], metrics["fast"]):
        assert a[3] == pytest.approx(b[3], rel=1e-4)
    for (name, a), (_, b) in zip(models["torch"].named_parameters(), models["fast"].named_parameters()):
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4), name


def test_hogwild_runs_the_threads_it_is_given():
    tree = TREES["single"]()
    model = make_model(tree)
    cfg = TrainConfig(batch_size=20, seed=0, progress=False)
    opt = make_optimizer(model, cfg, cfg.lr)
    probe = fast.Probe()
    fast.FastEngine(threads=2).train(model, opt, stream_for(tree.num_words, 400, 1), 0, cfg, 1, False, probe)
    assert probe.stats["threads"] == 2
    fast.FastEngine().train(model, opt, stream_for(tree.num_words, 400, 1), 0, cfg, 2, False, probe)
    assert probe.stats["threads"] == 1  # cfg.hogwild's default


def test_scoring_in_chunks_gives_the_same_numbers(monkeypatch):
    """The scorer runs in pieces (progress on long splits), each with the context tokens before
    it: the scores are exactly those of one call, at every chunk size."""
    model = make_model(TREES["single"]())
    stream = stream_for(model.config.vocab_size, 3000, 5)
    whole = fast.token_log_probs(model, stream, 0)
    for size in (1, 2, 37, 1000):
        monkeypatch.setattr(fast, "SCORE_CHUNK", size)
        np.testing.assert_array_equal(fast.token_log_probs(model, stream, 0), whole)


@pytest.mark.parametrize("optimizer", ["sgd", "momentum"])
def test_word_rates_scale_the_same_rows_in_both_engines(optimizer):
    """Per-word gradient multipliers (TrainConfig.word_rate_power): the fast engine's scaled row
    steps equal autograd's through LBL.set_word_rates (decay and momentum caught up lazily as
    before), and they change the result."""
    tree = TREES["multi_partial"]()
    model = make_model(tree)
    rates = np.random.default_rng(3).uniform(0.5, 8.0, size=tree.num_words).astype(np.float32)
    scaled = copy.deepcopy(model)
    scaled.set_word_rates(rates)
    (m_t, _), (m_f, _), (lt, lf), start = run_both(tree, optimizer, n_tokens=700, batch=64, model=scaled)
    assert lf == pytest.approx(lt, rel=1e-5)
    assert_params_close(m_t, m_f, start, atol=1e-5)
    wd = (0.0, 0.03)  # no decay of R: its rows move by their gradient steps only
    plain = run_both(tree, optimizer, n_tokens=700, batch=64, wd=wd, model=copy.deepcopy(model))[1][0]
    fast_ = run_both(tree, optimizer, n_tokens=700, batch=64, wd=wd, model=scaled)[1][0]
    with torch.no_grad():  # (a statistic of the weights, not a loss)
        moved = (fast_.R.weight - start.R.weight).abs().sum(1)
        ratio = moved / (plain.R.weight - start.R.weight).abs().sum(1).clamp(min=1e-12)
    assert float(ratio[torch.from_numpy(rates) > 4].median()) > 2.0  # the rates took effect
