import json
import math

import numpy as np
import pytest
import torch

from conftest import tiny_corpus
from hlbl.data import load_corpus
from hlbl.evaluate import evaluate, perplexity_report
from hlbl.model import LBL, LBLConfig
import hlbl.engine as hengine
import hlbl.run as hrun
import hlbl.train as tr
from hlbl.errors import ConfigError
from hlbl.schedule import resolve
from hlbl.warmstart import warm_start
from hlbl.config import TrainConfig
from hlbl.optim import make_optimizer
from hlbl.run import fit
from hlbl.tree import random_tree


def train(tmp_path, name, corpus, epochs=2, optimizer="momentum", output="tree", seed=0, **recipe):
    V = len(corpus.vocab)
    tree = random_tree(V, seed) if output == "tree" else None
    model = LBL(LBLConfig(V, dim=8, context=3, output=output), tree, torch.Generator().manual_seed(seed))
    model.init_unigram(corpus.vocab.counts)
    cfg = TrainConfig(batch_size=64, max_epochs=epochs, optimizer=optimizer, seed=seed, progress=False, **recipe)
    state = fit(model, corpus, cfg, tmp_path / name, log=lambda *a: None)
    return model, state


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return load_corpus(tiny_corpus(tmp_path_factory.mktemp("c") / "corpus", n_train=400))


@pytest.mark.parametrize("output", ["tree", "flat"])
def test_training_learns_the_toy_grammar(tmp_path, corpus, output):
    pad = corpus.vocab.eos
    V = len(corpus.vocab)
    model, _ = train(tmp_path, "r", corpus, epochs=6, output=output)
    ppl = evaluate(model, corpus["test"], pad)["perplexity"]
    unigram = np.asarray(corpus.vocab.counts, float)
    unigram = unigram[unigram > 0] / unigram.sum()
    assert ppl < 0.6 * math.exp(-(unigram * np.log(unigram)).sum()) < V


def test_fixed_seed_gives_identical_results(tmp_path, corpus):
    a, _ = train(tmp_path, "a", corpus)
    b, _ = train(tmp_path, "b", corpus)
    c, _ = train(tmp_path, "c", corpus, seed=1)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.equal(a.R.weight, c.R.weight)
    la = (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()
    lb = (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["valid_ppl"] for x in la] == [json.loads(x)["valid_ppl"] for x in lb]


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adagrad"])
def test_optimizer_options_run(tmp_path, corpus, optimizer):
    V = len(corpus.vocab)
    start = LBL(LBLConfig(V, dim=8, context=3), random_tree(V, 0), torch.Generator().manual_seed(0))
    start.init_unigram(corpus.vocab.counts)
    unigram_ppl = evaluate(start, corpus["valid"], corpus.vocab.eos)["perplexity"]
    model, state = train(tmp_path, optimizer, corpus, epochs=1, optimizer=optimizer)
    for (name, a), (_, b) in zip(model.named_parameters(), start.named_parameters()):
        assert not torch.equal(a, b), f"{optimizer} did not move {name}"
    assert state.best_valid_ppl < unigram_ppl


def test_resume_continues_where_it_stopped(tmp_path, corpus):
    full, _ = train(tmp_path, "full", corpus, epochs=3)
    V = len(corpus.vocab)
    half = LBL(LBLConfig(V, dim=8, context=3), random_tree(V, 0), torch.Generator().manual_seed(0))
    half.init_unigram(corpus.vocab.counts)
    cfg = TrainConfig(batch_size=64, max_epochs=2, progress=False)
    fit(half, corpus, cfg, tmp_path / "half", log=lambda *a: None)
    cfg.max_epochs = 3
    resumed = LBL(LBLConfig(V, dim=8, context=3), random_tree(V, 0))
    fit(resumed, corpus, cfg, tmp_path / "half", resume=True, log=lambda *a: None)
    assert all(torch.equal(x, y) for x, y in zip(full.state_dict().values(), resumed.state_dict().values()))


def test_a_long_split_is_cut_into_epochs_that_resume_mid_pass(tmp_path, corpus):
    """epoch_tokens below the split's length: each epoch is a part of a pass, recorded in
    metrics.jsonl, and a run resumed after a part continues as the uninterrupted run does."""
    n = len(corpus["train"])
    tokens = n // 3 + 1  # three parts a pass (rounded up to minibatches of 64)
    parts = -(-n // (-(-tokens // 64) * 64))
    full, _ = train(tmp_path, "full", corpus, epochs=parts + 2, epoch_tokens=tokens)
    lines = [json.loads(x) for x in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    assert [(x["pass"], x["part"], x["parts"]) for x in lines] == [
        (1 + k // parts, 1 + k % parts, parts) for k in range(parts + 2)
    ]
    V = len(corpus.vocab)
    half = LBL(LBLConfig(V, dim=8, context=3), random_tree(V, 0), torch.Generator().manual_seed(0))
    half.init_unigram(corpus.vocab.counts)
    cfg = TrainConfig(batch_size=64, max_epochs=2, progress=False, epoch_tokens=tokens)
    fit(half, corpus, cfg, tmp_path / "half", log=lambda *a: None)
    cfg.max_epochs = parts + 2
    resumed = LBL(LBLConfig(V, dim=8, context=3), random_tree(V, 0))
    fit(resumed, corpus, cfg, tmp_path / "half", resume=True, log=lambda *a: None)
    assert all(torch.equal(x, y) for x, y in zip(full.state_dict().values(), resumed.state_dict().values()))
    uncut, _ = train(tmp_path, "uncut", corpus, epochs=parts + 2, epoch_tokens=0)
    assert not torch.equal(uncut.R.weight, full.R.weight)  # (uncut: parts + 2 whole passes)


def test_early_stopping_restores_best_and_drops_the_rate(tmp_path, corpus):
    _, state = train(tmp_path, "long", corpus, epochs=40)
    lines = [json.loads(x) for x in (tmp_path / "long" / "metrics.jsonl").read_text().splitlines()]
    assert state.done and len(lines) < 40
    rates = [x["lr"] for x in lines]
    assert rates[0] == 1e-3 and rates[-1] == 3e-5
    assert state.best_valid_ppl == min(x["valid_ppl"] for x in lines)


def test_perplexity_report_is_exp_of_mean_nll():
    lp = np.log(np.array([0.5, 0.25, 0.125]))
    r = perplexity_report(lp)
    assert r["tokens"] == 3 and r["perplexity"] == pytest.approx(2**2)
    with pytest.raises(ValueError):
        perplexity_report(np.array([]))


def test_every_token_is_predicted_with_eos_padding(corpus):
    V = len(corpus.vocab)
    model = LBL(LBLConfig(V, dim=4, context=3), random_tree(V, 0))
    with torch.no_grad():
        model.out.weight.zero_()
    model.init_unigram(np.ones(V))
    r = evaluate(model, corpus["valid"], corpus.vocab.eos)
    assert r["tokens"] == len(corpus["valid"])
    assert r["perplexity"] == pytest.approx(V, rel=1e-5)  # a uniform model has perplexity V


@pytest.mark.parametrize("engine", ["torch", "fast"])
def test_the_seed_sets_the_example_order(tmp_path, corpus, engine):
    """Same tree and initial weights, only TrainConfig.seed differs: the epoch order must differ."""
    V = len(corpus.vocab)

    def run(seed, name):
        model = LBL(LBLConfig(V, dim=8, context=3), random_tree(V, 0), torch.Generator().manual_seed(0))
        model.init_unigram(corpus.vocab.counts)
        cfg = TrainConfig(batch_size=64, max_epochs=1, seed=seed, engine=engine, progress=False)
        fit(model, corpus, cfg, tmp_path / f"{engine}-{name}", log=lambda *a: None)
        return model.R.weight.detach().clone()

    a, b = run(0, "a"), run(1, "b")
    assert torch.equal(a, run(0, "again")) and not torch.equal(a, b)


def test_the_recipe_reaches_the_optimiser():
    model = LBL(LBLConfig(20, dim=4, context=2), random_tree(20, 0))
    cfg = TrainConfig(batch_size=50, momentum=0.7, weight_decay_words=2e-4, weight_decay_other=3e-6)
    groups = {g["name"]: g for g in make_optimizer(model, cfg, 0.01).param_groups}
    # The penalty is per example and the loss a sum over the batch: decay x batch size; biases none.
    assert groups["words"]["weight_decay"] == pytest.approx(2e-4 * 50)
    assert groups["other"]["weight_decay"] == pytest.approx(3e-6 * 50)
    assert groups["biases"]["weight_decay"] == 0.0
    assert all(g["lr"] == 0.01 and g["momentum"] == 0.7 for g in groups.values())
    ids = {k: {id(p) for p in g["params"]} for k, g in groups.items()}
    assert ids["words"] == {id(model.R.weight)}
    assert ids["biases"] == {id(p) for n, p in model.named_parameters() if n.endswith("bias")}
    assert {id(model.C), id(model.out.weight)} <= ids["other"]


@pytest.fixture
def scripted(monkeypatch):
    """fit() with scripted validation perplexities; records, per epoch, the optimiser's learning
    rates and the weights at the start of the epoch and when it is validated."""
    record = {"lr": {}, "start": {}, "validated": {}, "script": []}
    clone = lambda m: {k: v.detach().clone() for k, v in m.state_dict().items()}  # noqa: E731
    real_runner = hengine.choose_engine  # (run.fit imports it from hlbl.engine when it trains)

    def runner(model, cfg):
        run = real_runner(model, cfg)

        def wrapped(model, optimizer, stream, pad, cfg, epoch, show):
            record["lr"][epoch] = {g["lr"] for g in optimizer.param_groups}
            record["start"][epoch] = clone(model)
            record["epoch"] = epoch
            return run(model, optimizer, stream, pad, cfg, epoch, show)

        return wrapped

    def fake_evaluate(model, *a, **k):
        record["validated"][record["epoch"]] = clone(model)
        return {"perplexity": record["script"][record["epoch"] - 1], "tokens": 1, "nll": 0.0}

    monkeypatch.setattr(hengine, "choose_engine", runner)
    monkeypatch.setattr(tr, "evaluate", fake_evaluate)
    return record


def _same(a: dict, b: dict) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def test_early_stopping_restores_the_best_weights_and_lowers_the_rate(tmp_path, corpus, scripted):
    scripted["script"] = [10.0, 9.0, 11.0, 8.0, 12.0, 7.0]  # epoch 3 rises: drop; epoch 5 rises: stop
    model, state = train(tmp_path, "es", corpus, epochs=40)
    assert state.epoch == 5 and state.done and state.best_valid_ppl == 8.0
    assert scripted["lr"] == {1: {1e-3}, 2: {1e-3}, 3: {1e-3}, 4: {3e-5}, 5: {3e-5}}
    assert _same(scripted["start"][4], scripted["validated"][2])  # epoch 4 starts from the best so far
    assert not _same(scripted["start"][4], scripted["validated"][3])
    final = {k: v for k, v in model.state_dict().items()}
    assert _same(final, scripted["validated"][4])  # the run ends on the best weights
    best = LBL(model.config, model.tree)
    from hlbl import checkpoint as ckpt

    ckpt.load_weights(tmp_path / "es" / "best.safetensors", best)
    assert _same(best.state_dict(), scripted["validated"][4])


def test_the_halving_schedule_decays_on_small_gains_and_stops_after_its_decays(tmp_path, corpus, scripted):
    # 1: first; 2: -10% (keep); 3: -0.1% (< lr_min_gain: halve, keep these weights, the best);
    # 4: rises (halve from the best = epoch 3's); 5: improves; 6: rises with no decay left: stop.
    scripted["script"] = [10.0, 9.0, 8.991, 9.5, 8.0, 8.5, 7.0]
    model, state = train(tmp_path, "h", corpus, epochs=40, lr_schedule="halve", lr_decays=2)
    assert state.epoch == 6 and state.done and state.best_valid_ppl == 8.0
    assert scripted["lr"] == {1: {1e-3}, 2: {1e-3}, 3: {1e-3}, 4: {5e-4}, 5: {2.5e-4}, 6: {2.5e-4}}
    assert state.phase == 2
    assert _same(scripted["start"][4], scripted["validated"][3])  # a small gain keeps its weights
    assert _same(scripted["start"][5], scripted["validated"][3])  # a rise goes back to the best
    assert _same(model.state_dict(), scripted["validated"][5])


@pytest.mark.parametrize("cut", [False, True])
def test_the_auto_schedule_is_two_rate_for_whole_passes_and_halving_for_a_cut_split(tmp_path, corpus, scripted, cut):
    """The default schedule: on the same validation figures, a split whose epochs are whole
    passes drops to lr_final on the first rise; a split cut into several epochs a pass halves on
    a small gain instead."""
    scripted["script"] = [10.0, 9.0, 8.991, 9.5, 8.0, 8.5, 7.0]
    tokens = len(corpus["train"]) // 3 if cut else 0
    assert TrainConfig().lr_schedule == "auto"
    _, state = train(tmp_path, "auto", corpus, epochs=4, epoch_tokens=tokens)
    if cut:
        assert resolve(TrainConfig(), 3) == "halve"
        assert scripted["lr"] == {1: {1e-3}, 2: {1e-3}, 3: {1e-3}, 4: {5e-4}}
    else:
        assert resolve(TrainConfig(), 1) == "two-rate" and resolve(TrainConfig(lr_schedule="halve"), 1) == "halve"
        assert scripted["lr"] == {1: {1e-3}, 2: {1e-3}, 3: {1e-3}, 4: {1e-3}}  # (epoch 4 rose: 3e-5 next)
        assert state.lr == 3e-5


def test_a_bad_schedule_setting_is_refused_by_name():
    for bad in ({"lr_schedule": "cosine"}, {"lr_decay": 1.0}, {"lr_decays": -1}, {"lr_min_gain": 1.5}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            TrainConfig(**bad)


def test_warm_start_keeps_words_and_context_and_starts_nodes_from_the_unigram(tmp_path, corpus):
    src, _ = train(tmp_path, "src", corpus, epochs=1)
    V = len(corpus.vocab)
    tree = random_tree(V, 5)  # another tree, as after a rebuild
    model = LBL(LBLConfig(V, dim=8, context=3), tree, torch.Generator().manual_seed(1))
    model.init_unigram(corpus.vocab.counts)
    warm_start(model, src, corpus.vocab, corpus.vocab)
    assert torch.equal(model.R.weight, src.R.weight) and torch.equal(model.C, src.C)
    assert not model.out.weight.any()  # zero node vectors: the prediction is the unigram, any context
    counts = np.asarray(corpus.vocab.counts, float)
    unigram = np.where(counts > 0, counts, 0.5) / np.where(counts > 0, counts, 0.5).sum()  # (init_unigram's rule)
    ctx = torch.tensor([[0, 1, 2]])
    assert np.allclose(model.log_prob(ctx).exp()[0].detach().numpy(), unigram, atol=1e-6)
    other = LBL(LBLConfig(V, dim=6, context=3), tree)
    with pytest.raises(ConfigError, match="its dim is 8, this run's 6"):
        warm_start(other, src, corpus.vocab, corpus.vocab)


def test_warm_start_keep_output_on_the_same_tree_is_the_source_model(tmp_path, corpus):
    src, _ = train(tmp_path, "src", corpus, epochs=1)
    V = len(corpus.vocab)
    ctx = torch.tensor([[0, 1, 2], [3, 4, 5]])
    same = LBL(LBLConfig(V, dim=8, context=3), src.tree, torch.Generator().manual_seed(7))
    warm_start(same, src, corpus.vocab, corpus.vocab, keep_output=True)
    assert torch.equal(same.log_prob(ctx), src.log_prob(ctx))  # every weight carried over
    other = LBL(LBLConfig(V, dim=8, context=3), random_tree(V, 5))
    with pytest.raises(ConfigError, match="own tree"):
        warm_start(other, src, corpus.vocab, corpus.vocab, keep_output=True)
    flat = LBL(LBLConfig(V, dim=8, context=3, output="flat"))
    with pytest.raises(ConfigError, match="tree output, this model flat"):
        warm_start(flat, src, corpus.vocab, corpus.vocab, keep_output=True)


def test_resume_after_the_rate_drop_keeps_the_low_rate(tmp_path, corpus, scripted):
    scripted["script"] = [10.0, 9.0, 11.0, 8.0, 12.0]
    straight, _ = train(tmp_path, "straight", corpus, epochs=5)
    scripted["lr"].clear()
    _, state = train(tmp_path, "halves", corpus, epochs=3)
    assert state.phase == 1 and state.lr == 3e-5
    V = len(corpus.vocab)
    resumed = LBL(LBLConfig(V, dim=8, context=3), random_tree(V, 0))
    cfg = TrainConfig(batch_size=64, max_epochs=5, progress=False)
    fit(resumed, corpus, cfg, tmp_path / "halves", resume=True, log=lambda *a: None)
    assert scripted["lr"][4] == scripted["lr"][5] == {3e-5}
    assert all(torch.equal(x, y) for x, y in zip(straight.state_dict().values(), resumed.state_dict().values()))


def test_top_level_files_of_a_later_epoch_do_not_stop_a_resume(tmp_path, corpus):
    """Top-level weights of a later epoch than the state (a crash between two writes of files that
    belong together) must not stop a resume: it reads only the newest complete checkpoint, and
    refuses files of two epochs inside one checkpoint."""
    from hlbl import checkpoint as ckpt

    model, _ = train(tmp_path, "torn", corpus, epochs=1)
    run = tmp_path / "torn"
    ckpt.save_weights(run / "last.safetensors", model, epoch=2)  # a newer file, its checkpoint never committed
    V = len(corpus.vocab)
    resumed = LBL(LBLConfig(V, dim=8, context=3), random_tree(V, 0))
    state = fit(
        resumed, corpus, TrainConfig(batch_size=64, max_epochs=2, progress=False), run, resume=True, log=lambda *a: None
    )
    assert state.epoch == 2
    inside = run / "checkpoints" / "epoch-000002"
    ckpt.save_weights(inside / "last.safetensors", model, epoch=1)  # hand-mixed epochs inside a checkpoint
    with pytest.raises(ckpt.CheckpointError, match="ends epoch 1 but state.json says 2"):
        fit(
            resumed,
            corpus,
            TrainConfig(batch_size=64, max_epochs=3, progress=False),
            run,
            resume=True,
            log=lambda *a: None,
        )


def test_ctrl_c_while_a_checkpoint_is_written_waits_for_the_whole_checkpoint(
    tmp_path, corpus, monkeypatch, python_sigint
):
    """Ctrl-C between the epoch's tensor files and its state used to leave a run that could never
    be resumed; now the interrupt takes effect once all three files are written."""
    import os
    import signal

    from hlbl import checkpoint as ckpt

    real = ckpt.write_weights

    def interrupted_save(path, model, epoch=None, vocab=None):
        if path.name == "last.safetensors" and epoch == 2:
            os.kill(os.getpid(), signal.SIGINT)  # arrives while the checkpoint is half written
        real(path, model, epoch, vocab)

    monkeypatch.setattr(hrun, "write_weights", interrupted_save)
    with pytest.raises(KeyboardInterrupt):
        train(tmp_path, "int", corpus, epochs=3)
    assert ckpt.read_state(tmp_path / "int" / "state.json")["epoch"] == 2
    monkeypatch.setattr(hrun, "write_weights", real)
    V = len(corpus.vocab)
    resumed = LBL(LBLConfig(V, dim=8, context=3), random_tree(V, 0))
    state = fit(
        resumed,
        corpus,
        TrainConfig(batch_size=64, max_epochs=3, progress=False),
        tmp_path / "int",
        resume=True,
        log=lambda *a: None,
    )
    assert state.epoch == 3
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_train_config_round_trips_through_json_and_refuses_unknown_settings():
    cfg = TrainConfig(lr=0.01, batch_size=7, optimizer="sgd", hogwild=2)
    assert TrainConfig.from_json(cfg.to_json()) == cfg
    assert TrainConfig.from_json(cfg.to_json(), max_epochs=3).max_epochs == 3
    with pytest.raises(ValueError, match="unknown training setting.*nesterov"):
        TrainConfig.from_json({**cfg.to_json(), "nesterov": True})
    with pytest.raises(ValueError, match="momentum"):
        TrainConfig.from_json({**cfg.to_json(), "momentum": 1.5})
    for bad in (None, [1], {**cfg.to_json(), "seed": 1.5}):  # a hand-edited run.json
        with pytest.raises(ValueError):
            TrainConfig.from_json(bad)


def test_a_run_directory_in_use_is_refused(tmp_path, corpus):
    from hlbl import atomic
    from hlbl.data import DataError

    with atomic.exclusive_directory(tmp_path / "busy"):  # as another training would hold it
        with pytest.raises(DataError, match="in use by another training process"):
            train(tmp_path, "busy", corpus, epochs=1)
    train(tmp_path, "busy", corpus, epochs=1)  # free again


def test_a_refused_engine_leaves_no_run_directory(tmp_path, corpus):

    V = len(corpus.vocab)
    flat = LBL(LBLConfig(V, dim=8, context=3, output="flat"), None, torch.Generator().manual_seed(0))
    with pytest.raises(ConfigError, match="engine 'fast' cannot train this model"):
        fit(flat, corpus, TrainConfig(engine="fast", progress=False), tmp_path / "r", log=lambda *a: None)
    assert not (tmp_path / "r").exists()


def test_resume_drops_metrics_of_epochs_after_the_checkpoint(tmp_path, corpus):
    """A run killed after writing an epoch's metrics line but before its checkpoint runs that epoch
    again: its line must not appear twice."""
    train(tmp_path, "m", corpus, epochs=1)
    path = tmp_path / "m" / "metrics.jsonl"
    path.write_text(path.read_text() + json.dumps({"epoch": 2, "valid_ppl": 1.0}) + "\n" + '{"epoch": 3, "val')
    V = len(corpus.vocab)
    resumed = LBL(LBLConfig(V, dim=8, context=3), random_tree(V, 0))
    said = []
    fit(
        resumed,
        corpus,
        TrainConfig(batch_size=64, max_epochs=2, progress=False),
        tmp_path / "m",
        resume=True,
        log=said.append,
    )
    assert any("dropped 1 line(s) of epochs after the checkpoint and a torn last line" in x for x in said), said
    assert [json.loads(x)["epoch"] for x in path.read_text().splitlines()] == [1, 2]
    assert json.loads(path.read_text().splitlines()[1])["valid_ppl"] > 1.0  # the rerun's line, not the stale one


def test_a_time_budget_stops_at_a_checkpoint_and_a_resume_goes_on(tmp_path):
    """A spent budget ends the call after its first epoch, on a complete checkpoint, without
    marking the run done; resuming then gives the same weights as one uninterrupted run."""
    logs = []
    root = tiny_corpus(tmp_path / "corpus", n_train=400)
    corpus = load_corpus(root)
    V = len(corpus.vocab)

    def model():
        m = LBL(LBLConfig(V, dim=8, context=3), random_tree(V, 0), torch.Generator().manual_seed(0))
        m.init_unigram(corpus.vocab.counts)
        return m

    recipe = dict(batch_size=64, max_epochs=3, progress=False, engine="torch")
    straight = model()
    fit(straight, corpus, TrainConfig(**recipe), tmp_path / "straight", log=lambda *a: None)
    cut = model()
    cfg = TrainConfig(**recipe, time_budget=1e-9)
    state = fit(cut, corpus, cfg, tmp_path / "cut", corpus_spec=str(root), log=logs.append)
    assert state.epoch == 1 and not state.done
    assert any("time budget" in line for line in logs)
    state = hrun.Run.resume(tmp_path / "cut", log=lambda *a: None, time_budget=None)
    assert state.epoch == 3
    a, _, _ = hrun.load_model(tmp_path / "cut", which="last")
    b, _, _ = hrun.load_model(tmp_path / "straight", which="last")
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_a_time_budget_must_be_positive():
    with pytest.raises(ConfigError, match="time_budget"):
        TrainConfig(time_budget=0)
