"""Data-parallel training (hlbl.distributed + hlbl.train under a gloo process group).

One spawn of two processes (a FileStore in tmp_path: no port, no network) runs every distributed
scenario; the tests compare what the ranks saved with single-process runs of the same recipe.
The recipe goes through an odd batch size (shards of 32 and 31), a last minibatch of one position
(rank 1's shard is empty), the learning-rate drop with the best weights restored, early stopping,
and a resume. The fast engine's scenarios (averaged updates, hlbl.sync) check its own rules:
each row takes the mean of the updates of the processes that touched it, or with overlapped
rounds that mean one round late (against references written with autograd), the ranks agree to
the bit, and a resume continues a run to the bit.
"""

import json
import os
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from conftest import tiny_corpus
from hlbl import checkpoint as ckpt
from hlbl import distributed as ddp
from hlbl.data import Corpus, DataError, EpochOrder, contexts, load_corpus
from hlbl.model import LBL, LBLConfig
from hlbl.config import TrainConfig
from hlbl import fast
from hlbl.engine import choose_engine, fast_parallel_engine
from hlbl.optim import make_optimizer
from hlbl.run import fit
from hlbl.tree import random_tree

WORLD = 2
BATCH = 63  # odd: every full minibatch splits 32 + 31
TOKENS = 20 * BATCH + 1  # the last minibatch is one position: rank 1's shard of it is empty
# lr 0.01 on this corpus overshoots within a few epochs: the run drops to lr_final, then stops early.
DROP = dict(
    lr=0.01,
    lr_final=0.001,
    batch_size=BATCH,
    max_epochs=12,
    seed=0,
    progress=False,
    engine="torch",
    max_train_tokens=TOKENS,
)
RESUME = dict(batch_size=BATCH, seed=0, progress=False, engine="torch", max_train_tokens=TOKENS)
# The fast engine: momentum and weight decay (the averaged updates must apply them once), whole passes.
FAST = dict(batch_size=BATCH, seed=0, progress=False, engine="fast", epoch_tokens=0, lr=0.005, weight_decay_words=1e-3)
# The averaging rule, checked step by step: plain SGD, a synchronisation after each of ROUNDS steps.
# Minibatches of 4 positions: some rows are touched by one process only.
RULE = dict(batch_size=4, seed=0, progress=False, epoch_tokens=0, lr=0.02, optimizer="sgd")
ROUNDS = 5
# The overlapped rule (hlbl.sync.DelayedSync), checked round by round: momentum and weight decay
# (the corrections go through A^k), rounds of EVERY steps.
OVERLAP = {**RULE, "lr": 0.01, "weight_decay_words": 1e-2, "weight_decay_other": 1e-2}
del OVERLAP["optimizer"]  # (both: with momentum and without)
EVERY = 2


def make_model(corpus) -> LBL:
    V = len(corpus.vocab)
    model = LBL(LBLConfig(V, dim=8, context=3), random_tree(V, 0), torch.Generator().manual_seed(0))
    model.init_unigram(corpus.vocab.counts)
    return model


def params(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _worker(rank: int, root: str) -> None:
    """One rank: join the group, run every scenario, save what the parent checks (per rank)."""
    root = Path(root)
    torch.set_num_threads(1)  # two processes on a small machine
    # gloo picks its network interface from the hostname, which a CI container may not resolve.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(
        "gloo", init_method=f"file://{root / 'store'}", rank=rank, world_size=WORLD, timeout=timedelta(seconds=60)
    )  # a mismatched collective fails instead of hanging
    try:
        out = {"world": ddp.world_size(), "logs": []}
        log = out["logs"].append
        corpus = load_corpus(root / "corpus")

        # The fast engine runs as one of the processes; auto picks it too.
        model = make_model(corpus)
        out["fast_engines"] = [choose_engine(model, TrainConfig(engine=e)).mixer is not None for e in ("fast", "auto")]
        stream = np.ascontiguousarray(corpus["train"][:TOKENS])
        model = make_model(corpus)
        cfg = TrainConfig(**RULE, weight_decay_words=0.0, weight_decay_other=0.0)
        mixer = ddp.UpdateMixer(1)
        fast.FastEngine(mixer=mixer).train(
            model, make_optimizer(model, cfg, cfg.lr), stream, corpus.vocab.eos, cfg, 1, False,
            fast.Probe(max_batches=ROUNDS),
        )  # fmt: skip
        out["fast_rule"] = params(model)
        out["sync_bytes"] = (mixer.syncs, mixer.bytes_per_sync, ddp.sync_bytes(model, momentum=False))
        for optimizer in ("momentum", "sgd"):
            model = make_model(corpus)
            cfg = TrainConfig(**OVERLAP, optimizer=optimizer)
            fast.FastEngine(mixer=ddp.UpdateMixer(EVERY, overlap=True)).train(
                model, make_optimizer(model, cfg, cfg.lr), stream, corpus.vocab.eos, cfg, 1, False,
                fast.Probe(max_batches=EVERY * ROUNDS),
            )  # fmt: skip
            out[f"fast_overlap_rule_{optimizer}"] = params(model)
        # 1: the one-process step at batch 2B; 4: rounds of 4 steps; "4o": overlapped
        for every, overlap in ((1, False), (4, False), (4, True)):
            cfg = TrainConfig(**FAST, sync_every=every, sync_overlap=overlap)
            model = make_model(corpus)
            opt = make_optimizer(model, cfg, cfg.lr)
            engine = fast_parallel_engine(cfg, model.config.vocab_size)
            losses = [engine(model, opt, stream, corpus.vocab.eos, cfg, e, False)[0] for e in (1, 2)]
            buffers = {k: opt.state[p]["momentum_buffer"].clone() for k, p in model.named_parameters()}
            out[f"fast_sync{every}{'o' if overlap else ''}"] = (params(model), buffers, losses)

        # fit: two epochs, then a resume to three, against three at once (rounds of 4 steps),
        # blocking and overlapped (its metrics then record the rounds' ends too).
        for late in ("", "_overlap"):
            for name, epochs, again in (("fast_resume", 2, False), ("fast_resume", 3, True), ("fast_whole", 3, False)):
                model = make_model(corpus)
                cfg = TrainConfig(**FAST, sync_every=4, max_epochs=epochs, sync_overlap=bool(late))
                fit(model, corpus, cfg, root / (name + late), resume=again, log=log)
                out[name + late] = params(model)

        # Gradient sum: a parameter with a gradient on one rank only gets that rank's gradient on
        # both; one with no gradient on any rank stays None (the optimiser must skip it).
        a, b, c = (torch.nn.Parameter(torch.zeros(n)) for n in (3, 2, 2))
        a.grad = torch.full((3,), 1.0) if rank == 0 else None
        c.grad = torch.full((2,), float(rank + 1))
        ddp.all_reduce_gradients([a, b, c])
        out["grad_one_rank"], out["grad_no_rank"], out["grad_sum"] = a.grad.tolist(), b.grad, c.grad.tolist()

        # Ranks that built different runs are stopped on every rank, before any step.
        ddp.check_same("the same", "cpu", "a test string")
        try:
            ddp.check_same(f"rank {rank}", "cpu", "a test string")
        except DataError as e:
            out["mismatch_error"] = str(e)

        # The same sizes and vocabulary but other text on rank 1: refused too (each rank reads its
        # shards from its own copy of the corpus).
        other = Corpus(
            corpus.name, corpus.vocab, {**corpus.splits, "train": np.ascontiguousarray(corpus["train"][::-1])}
        )
        try:
            fit(make_model(corpus), other if rank == 1 else corpus, TrainConfig(**DROP), root / "other_text", log=log)
        except DataError as e:
            out["other_text_error"] = str(e)

        model = make_model(corpus)
        out["drop_start"] = params(model)
        out["drop_state"] = fit(model, corpus, TrainConfig(**DROP), root / "drop", log=log).to_json()
        out["drop"] = params(model)

        model = make_model(corpus)
        fit(model, corpus, TrainConfig(**RESUME, max_epochs=2), root / "resume", log=log)
        model = make_model(corpus)  # a fresh process would build it again, then load last.safetensors
        fit(model, corpus, TrainConfig(**RESUME, max_epochs=3), root / "resume", resume=True, log=log)
        out["resume"] = params(model)
        torch.save(out, root / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Per rank, what the 2-process run saved; and the single-process runs of the same recipes."""
    root = tmp_path_factory.mktemp("dist")
    with pytest.MonkeyPatch.context() as env:  # (module scope: conftest's per-test cache is not set up yet)
        env.setenv("HLBL_CACHE", str(root / "cache"))  # the spawned ranks inherit it
        corpus = load_corpus(tiny_corpus(root / "corpus", n_train=200))  # encoded here: the ranks only read the cache
        assert len(corpus["train"]) > TOKENS
        mp.spawn(_worker, args=(str(root),), nprocs=WORLD, join=True)
    ranks = [torch.load(root / f"rank{r}.pt") for r in range(WORLD)]

    single = {}
    model = make_model(corpus)
    fit(model, corpus, TrainConfig(**DROP), root / "single_drop", log=lambda *a: None)
    single["drop"] = params(model)
    model = make_model(corpus)
    fit(model, corpus, TrainConfig(**RESUME, max_epochs=3), root / "single_resume", log=lambda *a: None)
    single["resume"] = params(model)
    return root, ranks, single


def assert_close(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for name in want:
        assert torch.allclose(got[name], want[name], rtol=1e-5, atol=1e-5), (
            f"{name}: max diff {(got[name] - want[name]).abs().max():.3g}"
        )


def test_shard_bounds_split_contiguously_and_can_be_empty():
    for n in (0, 1, 2, 5, 63, 64):
        for world in (1, 2, 3):
            bounds = [ddp.shard_bounds(n, r, world) for r in range(world)]
            assert bounds[0][0] == 0 and bounds[-1][1] == n
            assert all(hi == lo for (_, hi), (lo, _) in zip(bounds, bounds[1:]))
            assert max(hi - lo for lo, hi in bounds) - min(hi - lo for lo, hi in bounds) <= 1
    assert ddp.shard_bounds(1, 1, 2) == (1, 1)  # the empty shard of a one-position minibatch
    assert ddp.shard_bounds(BATCH, 0, 2) == (0, 32) and ddp.shard_bounds(BATCH, 1, 2) == (32, 63)


def test_without_a_process_group_everything_is_single_process(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert ddp.init_from_env("cpu") == "cpu" and not dist.is_initialized()
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert ddp.init_from_env("cpu") == "cpu" and not dist.is_initialized()
    assert ddp.rank() == 0 and ddp.world_size() == 1
    ddp.cleanup()  # nothing to leave: no error


def test_two_processes_take_the_single_process_steps(runs):
    root, ranks, single = runs
    assert [r["world"] for r in ranks] == [WORLD, WORLD]
    moved = [n for n in single["drop"] if not torch.equal(ranks[0]["drop"][n], ranks[0]["drop_start"][n])]
    assert moved == list(single["drop"]), "training must move every parameter"
    for r in ranks:
        assert_close(r["drop"], single["drop"])
        assert_close(r["resume"], single["resume"])
    # Same epochs, learning rates and decisions; valid perplexity and the global training loss agree.
    got, want = metrics(root / "drop"), metrics(root / "single_drop")
    assert [(m["epoch"], m["lr"], m["improved"]) for m in got] == [(m["epoch"], m["lr"], m["improved"]) for m in want]
    for g, w in zip(got, want):
        assert g["valid_ppl"] == pytest.approx(w["valid_ppl"], rel=1e-5)
        assert g["train_loss"] == pytest.approx(w["train_loss"], rel=1e-5)
    assert [m["epoch"] for m in metrics(root / "resume")] == [1, 2, 3]  # two epochs, then one resumed


def test_lr_drop_and_best_weights_are_the_same_on_every_rank(runs):
    root, ranks, _ = runs
    lrs = [m["lr"] for m in metrics(root / "drop")]
    assert 0.01 in lrs and 0.001 in lrs, "the test needs the learning-rate drop (best weights restored)"
    assert all(r["drop_state"]["done"] for r in ranks), "the test needs early stopping to end the run"
    assert ranks[0]["drop_state"]["lr"] == ranks[1]["drop_state"]["lr"] == 0.001
    # Both ranks end holding the best weights, bit for bit: the ones rank 0 saved.
    best = ckpt.load_tensors(root / "drop" / "best.safetensors")
    for r in ranks:
        for name, p in r["drop"].items():
            assert torch.equal(p, best[name]), name
    # (A rank that missed the restore at the drop would have summed gradients of other weights
    # into every later step: the metrics after the drop would differ from the single process.)


def test_only_rank_0_logs(runs):
    _, ranks, _ = runs
    assert any("valid perplexity rose" in line for line in ranks[0]["logs"])
    assert any("resuming after epoch 2" in line for line in ranks[0]["logs"])
    assert ranks[1]["logs"] == []


def test_gradients_are_summed_and_unused_ones_stay_none(runs):
    _, ranks, _ = runs
    for r in ranks:
        assert r["grad_one_rank"] == [1.0, 1.0, 1.0]  # rank 0's gradient; rank 1 had none
        assert r["grad_no_rank"] is None
        assert r["grad_sum"] == [3.0, 3.0]  # 1 + 2


def test_ranks_that_built_different_runs_are_stopped(runs):
    _, ranks, _ = runs
    for r in ranks:
        assert "disagree on a test string" in r["mismatch_error"]


def test_ranks_reading_different_text_are_stopped(runs):
    _, ranks, _ = runs
    for r in ranks:
        assert "disagree on the model, its word tree, the corpus" in r["other_text_error"]


def test_fast_engine_runs_under_a_process_group(runs):
    _, ranks, _ = runs
    for r in ranks:
        assert r["fast_engines"] == [True, True]


def test_fast_rows_take_the_mean_update_of_the_processes_that_touched_them(runs):
    """The averaging rule against a reference written with autograd: in each round, process r's
    update of a row is -lr x its minibatch's summed gradient; the row moves by the mean of the
    updates of the processes whose minibatch touched it (C: both; a rare word's row: often one)."""
    root, ranks, _ = runs
    corpus = load_corpus(root / "corpus")
    stream = np.ascontiguousarray(corpus["train"][:TOKENS])
    model = make_model(corpus)
    order = EpochOrder(RULE["seed"], 1, len(stream))
    one_only = 0
    for t in range(ROUNDS):
        moves = {k: torch.zeros_like(p) for k, p in model.named_parameters()}
        counts = {k: torch.zeros(p.shape[0]) for k, p in model.named_parameters()}
        for r in range(WORLD):
            g = t * WORLD + r  # the global minibatch process r takes in round t
            pos = order.window(g * RULE["batch_size"], (g + 1) * RULE["batch_size"])
            ctx = torch.from_numpy(contexts(stream, pos, model.config.context, corpus.vocab.eos))
            model.zero_grad()
            (model(ctx, torch.from_numpy(stream[pos].astype(np.int64))).loss * len(pos)).backward()
            for k, p in model.named_parameters():
                moves[k] -= RULE["lr"] * p.grad
                counts[k] += p.grad.reshape(p.shape[0], -1).ne(0).any(1).float()
        with torch.no_grad():
            for k, p in model.named_parameters():
                share = 1 / counts[k].clamp(min=1)
                p += moves[k] * share.reshape((-1,) + (1,) * (p.dim() - 1))
        one_only += int((counts["R.weight"] == 1).sum() + (counts["out.weight"] == 1).sum())
    assert one_only > 0  # some rows were moved by one process only: the rule is not a plain mean
    for r in ranks:
        assert_close(r["fast_rule"], params(model))
        syncs, sent, predicted = r["sync_bytes"]
        assert syncs == ROUNDS and 0 < sent <= predicted  # the cost model's bytes bound what a sync sends


def _delayed_reference(corpus, stream: np.ndarray, optimizer: str) -> dict[str, torch.Tensor]:
    """hlbl.sync.DelayedSync's rule written with autograd and torch's SGD: WORLD models, each
    stepping on its own minibatches; after round t, the rows some process touched in round t-1
    take that round's mean m, as A^k m where this process did not touch them in round t and
    x + A^k (m - x_{t-1}) where it did; the last round's mean applies at once. Without momentum
    a zero buffer stands in (A's momentum terms are 0 then)."""
    cfg = TrainConfig(**OVERLAP, optimizer=optimizer)
    models = [make_model(corpus) for _ in range(WORLD)]
    opts = [make_optimizer(m, cfg, cfg.lr) for m in models]
    order = EpochOrder(cfg.seed, 1, len(stream))
    B = cfg.batch_size

    def state(r: int) -> dict[str, list[torch.Tensor]]:  # (value, momentum buffer) by name, live
        def buffer(p):
            b = opts[r].state[p].get("momentum_buffer")
            return torch.zeros_like(p) if b is None else b

        return {k: [p.data, buffer(p)] for k, p in models[r].named_parameters()}

    def power(r: int, name: str) -> np.ndarray:  # A^EVERY of the parameter's group
        p = dict(models[r].named_parameters())[name]
        g = next(g for g in opts[r].param_groups if any(q is p for q in g["params"]))
        return fast._powers(g["lr"], g.get("momentum", 0.0), g["weight_decay"], EVERY)[EVERY]

    def shaped(flags: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return flags.reshape((-1,) + (1,) * (like.dim() - 1))

    pending = None  # (means, snapshots per process, counts) of the previous round
    for t in range(ROUNDS):
        touched = []
        for r in range(WORLD):
            mine = {k: torch.zeros(p.shape[0], dtype=torch.bool) for k, p in models[r].named_parameters()}
            for s in range(EVERY):
                g = (t * EVERY + s) * WORLD + r  # process r's local step t * EVERY + s + 1
                pos = order.window(g * B, (g + 1) * B)
                ctx = torch.from_numpy(contexts(stream, pos, models[r].config.context, corpus.vocab.eos))
                opts[r].zero_grad()
                (models[r](ctx, torch.from_numpy(stream[pos].astype(np.int64))).loss * len(pos)).backward()
                for k, p in models[r].named_parameters():
                    mine[k] |= p.grad.reshape(p.shape[0], -1).ne(0).any(1)
                opts[r].step()
            touched.append(mine)
        states = [state(r) for r in range(WORLD)]
        with torch.no_grad():
            if pending is not None:
                means, snaps, counts = pending
                for r in range(WORLD):
                    for k, (x, b) in states[r].items():
                        A = torch.tensor(power(r, k), dtype=torch.float32)
                        m, s, hit = means[k], snaps[r][k], shaped(counts[k] > 0, x)
                        own = shaped(touched[r][k], x)
                        new_x = torch.where(own, x + A[0, 0] * (m[0] - s[0]) + A[0, 1] * (m[1] - s[1]),
                                            A[0, 0] * m[0] + A[0, 1] * m[1])  # fmt: skip
                        new_b = torch.where(own, b + A[1, 0] * (m[0] - s[0]) + A[1, 1] * (m[1] - s[1]),
                                            A[1, 0] * m[0] + A[1, 1] * m[1])  # fmt: skip
                        x.copy_(torch.where(hit, new_x, x))
                        b.copy_(torch.where(hit, new_b, b))
            counts = {k: sum(touched[r][k].float() for r in range(WORLD)) for k in states[0]}
            means = {
                k: [sum(states[r][k][i] * shaped(touched[r][k], x) for r in range(WORLD)) / shaped(counts[k].clamp(min=1), x)
                    for i, x in enumerate(states[0][k])]
                for k in states[0]
            }  # fmt: skip
            if t < ROUNDS - 1:
                pending = (means, [{k: [v.clone() for v in xs] for k, xs in st.items()} for st in states], counts)
            else:  # the last round: its means at once
                for r in range(WORLD):
                    for k, xs in states[r].items():
                        for x, m in zip(xs, means[k]):
                            x.copy_(torch.where(shaped(counts[k] > 0, x), m, x))
    return params(models[0])


@pytest.mark.parametrize("optimizer", ["momentum", "sgd"])
def test_fast_overlapped_rows_take_the_means_one_round_late(runs, optimizer):
    """DelayedSync against its rule written with autograd (weight decay, with and without
    momentum, rounds of 2 steps)."""
    root, ranks, _ = runs
    corpus = load_corpus(root / "corpus")
    want = _delayed_reference(corpus, np.ascontiguousarray(corpus["train"][:TOKENS]), optimizer)
    for r in ranks:
        assert_close(r[f"fast_overlap_rule_{optimizer}"], want)
    blocking = ranks[0]["fast_rule"]  # (another recipe: the delayed rule must not be the blocking one)
    assert any(not torch.allclose(want[k], blocking[k], atol=1e-6) for k in want)


def test_fast_ranks_agree_to_the_bit_and_learn(runs):
    _, ranks, _ = runs
    for every in (1, 4, "4o"):
        a, b = (r[f"fast_sync{every}"] for r in ranks)
        for k in a[0]:
            assert torch.equal(a[0][k], b[0][k]) and torch.equal(a[1][k], b[1][k]), k
        assert a[2] == b[2] and a[2][1] < a[2][0]  # the same global loss, and it falls
    # rounds of 4 steps are not the synchronous steps: the rule of one step does not hold there
    one, four, late = (ranks[0][f"fast_sync{k}"][0] for k in ("1", "4", "4o"))
    assert any(not torch.allclose(one[k], four[k], atol=1e-6) for k in one)
    assert any(not torch.allclose(late[k], four[k], atol=1e-6) for k in one)  # overlapped: the means a round late


@pytest.mark.parametrize("late", ["", "_overlap"])
def test_fast_resume_continues_to_the_bit(runs, late):
    root, ranks, _ = runs
    for r in ranks:
        for k, v in r["fast_whole" + late].items():
            assert torch.equal(r["fast_resume" + late][k], v), k
    for k, v in ranks[0]["fast_whole" + late].items():
        assert torch.equal(ranks[1]["fast_whole" + late][k], v), k
    sync = metrics(root / ("fast_whole" + late))[-1]["sync"]  # what the epoch's rounds' ends cost
    assert sync["overlap"] is bool(late) and sync["rounds"] >= 2 and sync["bytes_a_round"] > 0
    assert sync["seconds"] >= 0
    if late:  # one round late is another run than at once
        assert any(not torch.equal(ranks[0]["fast_whole"][k], v) for k, v in ranks[0]["fast_whole_overlap"].items())


def test_torchrun_cli_matches_one_process(tmp_path):
    """The launch line of docs/distributed.md, end to end: 2 processes under torchrun print one result, equal to
    a one-process --engine torch run up to float rounding."""
    import shutil
    import subprocess
    import sys

    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    if torchrun is None:
        pytest.fail("torchrun is not installed beside this Python (it comes with torch)")
    data = tiny_corpus(tmp_path / "c", n_train=400)
    args = [
        "-m",
        "hlbl",
        "train",
        "--data",
        str(data),
        "--engine",
        "torch",
        "--device",
        "cpu",
        "--epochs",
        "2",
        "--dim",
        "8",
        "--threads",
        "1",
        "--batch-size",
        "63",
        "--quiet",
    ]
    env = {**os.environ, "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo")}  # as in _worker
    two = subprocess.run(
        [torchrun, "--standalone", "--nproc_per_node", "2", *args, "--out", str(tmp_path / "two")],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    one = subprocess.run(
        [sys.executable, *args, "--out", str(tmp_path / "one")], capture_output=True, text=True, timeout=240
    )
    assert two.returncode == 0 and one.returncode == 0, two.stderr[-2000:] + one.stderr[-2000:]
    results = [json.loads(r.stdout.splitlines()[0]) for r in (two, one)]
    assert sum(line.startswith("{") for line in two.stdout.splitlines()) == 1  # only process 0 prints
    for key in ("valid_perplexity", "test_perplexity"):
        assert results[0][key] == pytest.approx(results[1][key], rel=1e-5)


@pytest.mark.slow  # three torchrun launches (nine interpreters, about 40 CPU-seconds); the default suite has the launch
# (test_torchrun_cli_matches_one_process) and the fast engine's resume under a process group to the bit
# (test_fast_resume_continues_to_the_bit)
def test_torchrun_fast_engine_trains_checkpoints_and_resumes(tmp_path):
    """``torchrun ... -m hlbl train --engine fast``: 2 processes train, process 0 writes the run's
    checkpoints, and a resume after epoch 2 ends where 3 epochs at once end, to the bit."""
    import shutil
    import subprocess
    import sys

    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    assert torchrun is not None, "torchrun is not installed beside this Python (it comes with torch)"
    data = tiny_corpus(tmp_path / "c", n_train=400)
    args = ["-m", "hlbl", "train", "--data", str(data), "--engine", "fast", "--dim", "8", "--threads", "1"]
    args += ["--batch-size", "63", "--sync-every", "4", "--quiet"]
    env = {**os.environ, "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo")}

    def two(out: str, *more: str) -> dict:
        launch = [torchrun, "--standalone", "--nproc_per_node", "2", *args, "--out", str(tmp_path / out), *more]
        done = subprocess.run(launch, capture_output=True, text=True, timeout=240, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.splitlines()[0])

    whole = two("whole", "--epochs", "3")
    two("part", "--epochs", "2")
    assert (tmp_path / "part" / "checkpoints").is_dir()
    resumed = two("part", "--epochs", "3", "--resume")
    for key in ("valid_perplexity", "test_perplexity"):
        assert resumed[key] == whole[key]
    lines = metrics(tmp_path / "part")
    assert [x["epoch"] for x in lines] == [1, 2, 3] and lines[-1]["train_loss"] < lines[0]["train_loss"]


def test_the_process_group_has_a_collective_timeout_the_user_can_set(monkeypatch):
    """A rank that stops (not killed) leaves the others waiting at most this long, not torch's
    30-minute default; HLBL_COLLECTIVE_TIMEOUT (seconds) changes it, a bad value is one line."""
    seen = {}
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **k: seen.update(k))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("HLBL_COLLECTIVE_TIMEOUT", raising=False)
    ddp.init_from_env("cpu")
    assert seen["timeout"] == timedelta(seconds=ddp.DEFAULT_COLLECTIVE_TIMEOUT) < timedelta(minutes=30)
    monkeypatch.setenv("HLBL_COLLECTIVE_TIMEOUT", "42.5")
    ddp.init_from_env("cpu")
    assert seen["timeout"] == timedelta(seconds=42.5)
    for bad in ("0", "-1", "soon", "nan", "inf"):
        monkeypatch.setenv("HLBL_COLLECTIVE_TIMEOUT", bad)
        with pytest.raises(DataError, match="HLBL_COLLECTIVE_TIMEOUT"):
            ddp.init_from_env("cpu")
