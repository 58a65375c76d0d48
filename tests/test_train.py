import json
import math

import numpy as np
import pytest
import torch

from conftest import tiny_corpus
from hlbl.data import load_corpus
from hlbl.evaluate import evaluate, perplexity_report
from hlbl.model import LBL, LBLConfig
from hlbl.train import TrainConfig, fit
from hlbl.tree import random_tree


def train(tmp_path, name, corpus, epochs=2, optimizer="momentum", output="tree", seed=0):
    V = len(corpus.vocab)
    tree = random_tree(V, seed) if output == "tree" else None
    model = LBL(LBLConfig(V, dim=8, context=3, output=output), tree, torch.Generator().manual_seed(seed))
    model.init_unigram(corpus.vocab.counts)
    cfg = TrainConfig(batch_size=64, max_epochs=epochs, optimizer=optimizer, seed=seed, progress=False)
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
    model, state = train(tmp_path, optimizer, corpus, epochs=1, optimizer=optimizer)
    assert math.isfinite(state["best_valid_ppl"])


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
    assert all(torch.allclose(x, y) for x, y in zip(full.state_dict().values(), resumed.state_dict().values()))


def test_early_stopping_restores_best_and_drops_the_rate(tmp_path, corpus):
    _, state = train(tmp_path, "long", corpus, epochs=40)
    lines = [json.loads(x) for x in (tmp_path / "long" / "metrics.jsonl").read_text().splitlines()]
    assert state["done"] and len(lines) < 40
    rates = [x["lr"] for x in lines]
    assert rates[0] == 1e-3 and rates[-1] == 3e-5
    assert state["best_valid_ppl"] == min(x["valid_ppl"] for x in lines)


def test_perplexity_report_is_exp_of_mean_nll():
    lp = np.log(np.array([0.5, 0.25, 0.125]))
    r = perplexity_report(lp)
    assert r["tokens"] == 3 and r["perplexity"] == pytest.approx(2 ** 2)
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
