"""Frequency-scaled rates of the context word vectors (TrainConfig.word_rate_power): the
multipliers, a run that uses them, its run.json, and runs written before the setting existed."""

import json

import numpy as np
import pytest
import torch

from conftest import tiny_corpus
from hlbl.cli import main
from hlbl.config import TrainConfig
from hlbl.data import load_corpus
from hlbl.errors import ConfigError
from hlbl.model import LBL, LBLConfig
from hlbl.optim import word_rates
from hlbl.run import Run, fit
from hlbl.tree import random_tree


def test_rates_rise_below_the_middle_word_up_to_the_cap():
    # 1,611 tokens: the most frequent word alone is more than half, so c_ref = 1000
    counts = [1000, 500, 100, 10, 1, 0]
    got = word_rates(counts, power=0.5, cap=10.0)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, [1.0, 2**0.5, 10**0.5, 10.0, 10.0, 10.0], rtol=1e-6)
    np.testing.assert_array_equal(word_rates(counts, power=0.0, cap=10.0), np.ones(6, np.float32))
    # c_ref is the count of the word at the middle of the tokens, not the largest count
    flat = word_rates([100, 100, 100, 100, 25], power=1.0, cap=100.0)
    np.testing.assert_allclose(flat, [1, 1, 1, 1, 4], rtol=1e-6)
    with pytest.raises(ValueError, match="non-empty"):
        word_rates([], 0.5, 10.0)


@pytest.mark.parametrize(
    "field, value", [("word_rate_power", -0.5), ("word_rate_power", float("nan")), ("word_rate_cap", 0.5)]
)
def test_bad_settings_are_refused_by_name(field, value):
    with pytest.raises(ConfigError, match=field):
        TrainConfig(**{field: value})


def test_set_word_rates_checks_its_input():
    model = LBL(LBLConfig(5, dim=4, context=2), random_tree(5, 0))
    for bad in (np.ones(4), np.array([1, 1, 0, 1, 1.0]), np.array([1, 1, np.inf, 1, 1])):
        with pytest.raises(ValueError, match="5 positive finite"):
            model.set_word_rates(bad)


def _fit(tmp_path, corpus, name, engine="fast", **train):
    V = len(corpus.vocab)
    model = LBL(LBLConfig(V, dim=8, context=3), random_tree(V, 0), torch.Generator().manual_seed(0))
    model.init_unigram(corpus.vocab.counts)
    cfg = TrainConfig(lr=0.01, batch_size=64, max_epochs=2, seed=0, progress=False, engine=engine, **train)
    fit(model, corpus, cfg, tmp_path / name, log=lambda *a: None)
    return model


def test_a_run_with_word_rates_records_them_and_trains_alike_on_both_engines(tmp_path):
    corpus = load_corpus(tiny_corpus(tmp_path / "corpus", n_train=200))
    plain = _fit(tmp_path, corpus, "plain")
    fast = _fit(tmp_path, corpus, "fast", word_rate_power=0.5, word_rate_cap=5.0)
    slow = _fit(tmp_path, corpus, "torch", engine="torch", word_rate_power=0.5, word_rate_cap=5.0)
    assert fast.word_rate is None  # the rates are the run's, not left on the model
    assert not torch.allclose(plain.R.weight, fast.R.weight, atol=1e-4)
    assert torch.allclose(fast.R.weight, slow.R.weight, atol=1e-4, rtol=1e-4)
    record = Run.open(tmp_path / "fast").record.train
    assert (record.word_rate_power, record.word_rate_cap) == (0.5, 5.0)


def test_a_run_json_written_before_the_setting_reads_as_no_scaling(tmp_path):
    corpus = load_corpus(tiny_corpus(tmp_path / "corpus", n_train=100))
    _fit(tmp_path, corpus, "old")
    path = tmp_path / "old" / "run.json"
    info = json.loads(path.read_text())
    for key in ("word_rate_power", "word_rate_cap"):
        del info["train"][key]
    path.write_text(json.dumps(info))
    train = Run.open(tmp_path / "old").record.train
    assert train.word_rate_power == 0.0


def test_the_flag_reaches_the_run_and_a_bad_value_is_one_line(tmp_path, capsys):
    data = tiny_corpus(tmp_path / "corpus", n_train=100)
    common = ["train", "--data", str(data), "--epochs", "1", "--dim", "8", "--tree", "huffman", "--quiet"]
    assert main([*common, "--out", str(tmp_path / "r"), "--word-rate-power", "0.5"]) == 0
    assert Run.open(tmp_path / "r").record.train.word_rate_power == 0.5
    capsys.readouterr()
    assert main([*common, "--out", str(tmp_path / "bad"), "--word-rate-cap", "0.5"]) == 2
    err = capsys.readouterr().err.strip()
    assert "word_rate_cap" in err or "--word-rate-cap" in err
    assert len(err.splitlines()) == 1
