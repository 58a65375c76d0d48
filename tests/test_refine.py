"""Exchange moves on word classes: estimated gains against the training NLL computed before and
after each move, the moves' bookkeeping, the parameter carry-over, and the CLI end to end."""

import json

import numpy as np
import pytest
import torch

from conftest import tiny_corpus
from hlbl.output import ClassSoftmax
from hlbl.classes import WordClasses
from hlbl.cli import main
from hlbl.data import contexts
from hlbl.errors import TreeError
from hlbl.model import LBL, LBLConfig
from hlbl.output.classes import carry_output
from hlbl.refine import (
    Move,
    RefineConfig,
    apply_moves,
    exchange_sweep,
    refine_classes,
    sample_positions,
)

V, D = 12, 5


def model_over(classes, seed=0):
    g = torch.Generator().manual_seed(seed)
    model = LBL(LBLConfig(V, dim=D, context=2, output="classes"), classes, g).double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64))
    return model


def stream(seed=1, n=400):
    rng = np.random.default_rng(seed)
    return rng.integers(0, V, n).astype(np.int32)


def train_ll(model, s, pad=0):
    """Exact log-likelihood of every position of ``s``."""
    with torch.no_grad():
        ctx = torch.from_numpy(contexts(s, np.arange(len(s)), model.config.context, pad))
        return float(model(ctx, torch.from_numpy(s.astype(np.int64))).output.sum())


def moved_model(model, move):
    new, leaf_map = apply_moves(model.out.classes, [move])
    other = LBL(model.config, new, init=False).double()
    with torch.no_grad():
        other.R.weight.copy_(model.R.weight)
        other.C.copy_(model.C)
    carry_output(model.out, other.out, leaf_map)
    return other


@pytest.mark.parametrize("shortlist", [[], [0, 6]])
def test_gains_equal_the_change_of_the_training_nll(shortlist):
    rest = [w for w in range(V) if w not in shortlist]
    classes = WordClasses(V, shortlist, [rest[0:3], rest[3:7], rest[7:]])
    model = model_over(classes)
    s = stream()
    # every occurrence sampled and every class a candidate: the estimate is exact
    sweep = exchange_sweep(model, s, 0, RefineConfig(per_word=10_000, candidates=10, max_moves=1.0))
    base = train_ll(model, s)
    S = classes.num_shortlist
    checked = 0
    for m in range(classes.num_leaves - S):
        if sweep.dest[m] < 0:
            continue
        w, src = int(classes.leaf_word[S + m]), int(classes.leaf_root[S + m] - S)
        if classes.class_sizes[src] == 1:
            continue
        other = moved_model(model, Move(w, S + m, src, int(sweep.dest[m]), 0.0))
        assert train_ll(other, s) - base == pytest.approx(sweep.gain[m], rel=1e-6, abs=1e-6)
        checked += 1
    assert checked >= 6
    # the chosen moves are the positive ones, best first, one per word
    gains = [mv.gain for mv in sweep.moves]
    assert gains == sorted(gains, reverse=True) and all(g > 0 for g in gains)
    assert len({mv.word for mv in sweep.moves}) == len(sweep.moves)
    assert len(sweep.moves) >= 1


def test_gain_for_a_word_in_two_classes():
    """A membership of a word that has another one: the own term keeps the other membership's
    probability (here the others' occurrences are single-membership words, so the sum is exact)."""
    classes = WordClasses(V, [], [[0, 1, 2, 3], [4, 5, 6, 7, 0], [8, 9, 10, 11]])
    model = model_over(classes, seed=3)
    s = stream(seed=4)
    s = s[s != 0]  # word 0 never a target: its memberships' own term is empty, join/leave exact
    sweep = exchange_sweep(model, s, 1, RefineConfig(per_word=10_000, candidates=10, max_moves=1.0))
    base = train_ll(model, s, pad=1)
    checked = 0
    for m in range(classes.num_leaves):
        if sweep.dest[m] < 0:
            continue
        w, src = int(classes.leaf_word[m]), int(classes.leaf_root[m])
        other = moved_model(model, Move(w, m, src, int(sweep.dest[m]), 0.0))
        assert train_ll(other, s, pad=1) - base == pytest.approx(sweep.gain[m], rel=1e-6, abs=1e-6)
        checked += int(w == 0)
    assert checked == 2  # both of word 0's memberships had a move to score


def test_sampling_weights_estimate_counts():
    s = stream(n=1000)
    pos, w = sample_positions(s, V, per_word=7, seed=0)
    assert np.all(np.diff(s[pos]) >= 0)  # ordered by word
    np.testing.assert_allclose(np.bincount(s[pos], weights=w, minlength=V), np.bincount(s, minlength=V))
    assert np.all(np.bincount(s[pos], minlength=V) <= 7)
    assert len(np.unique(pos)) == len(pos)
    pos2, _ = sample_positions(s, V, per_word=7, seed=0)
    np.testing.assert_array_equal(pos, pos2)  # seeded


def test_moves_bookkeeping_and_limits():
    classes = WordClasses(V, [], [[0], [1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]])
    model = model_over(classes, seed=5)
    sweep = exchange_sweep(model, stream(seed=6), 0, RefineConfig(per_word=50, max_moves=0.2))
    assert len(sweep.moves) <= int(0.2 * 12)
    assert np.bincount([mv.dest for mv in sweep.moves], minlength=3).max() <= 1  # one move into a class
    two = exchange_sweep(model, stream(seed=6), 0, RefineConfig(per_word=50, max_moves=1.0, into_class=12))
    assert len(two.moves) >= len(sweep.moves)
    new = sweep.classes
    assert all(len(c) > 0 for c in new.classes)  # class 0's only member stays
    assert sorted(np.concatenate(new.classes).tolist()) == list(range(V))
    for mv in sweep.moves:
        assert mv.word in new.classes[mv.dest].tolist() and mv.word not in new.classes[mv.source].tolist()
    np.testing.assert_array_equal(classes.leaf_word[sweep.leaf_map], new.leaf_word)
    with pytest.raises(TreeError, match="not its membership"):
        apply_moves(classes, [Move(3, 1, 2, 0, 1.0)])


def test_carry_output_without_moves_is_the_same_layer():
    classes = WordClasses(V, [2], [[0, 1, 3], [4, 5, 6, 7], [8, 9, 10, 11]])
    model = model_over(classes)
    new, leaf_map = apply_moves(classes, [])
    layer = ClassSoftmax(D, new).double()
    carry_output(model.out, layer, leaf_map)
    h = torch.randn(6, D, dtype=torch.float64)
    torch.testing.assert_close(layer.log_prob(h), model.out.log_prob(h))


def test_standard_errors_of_sampled_estimates():
    classes = WordClasses(V, [], [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]])
    model = model_over(classes, seed=2)
    s = stream(seed=9, n=600)  # about 50 occurrences a word
    exact = exchange_sweep(model, s, 0, RefineConfig(per_word=1000))
    assert np.all(exact.se == 0)  # every occurrence scored
    sampled = exchange_sweep(model, s, 0, RefineConfig(per_word=10, sigmas=1e6))
    scored = sampled.dest >= 0
    assert np.all(sampled.se[scored] > 0)
    assert sampled.moves == []  # nothing gains a million standard errors


def test_several_sweeps_compose_their_moves():
    classes = WordClasses(V, [], [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]])
    model = model_over(classes, seed=2)
    s = stream(seed=9)
    cfg = RefineConfig(per_word=50, max_moves=0.1)
    one, h1 = refine_classes(model, s, 0, cfg, sweeps=1)
    two, h2 = refine_classes(model, s, 0, cfg, sweeps=3)
    assert h2[0] == h1[0] and len(h2) >= 2 and h2[0]["moves"] >= 1
    assert len(two.moves) == sum(h["moves"] for h in h2)
    # the composed map takes every final leaf back to the original leaf of the same word
    np.testing.assert_array_equal(classes.leaf_word[two.leaf_map], two.classes.leaf_word)
    assert len(set(two.leaf_map.tolist())) == classes.num_leaves
    # the second sweep is the first sweep of the model after the first sweep's moves
    after = LBL(model.config, one.classes, init=False).double()
    with torch.no_grad():
        after.R.weight.copy_(model.R.weight)
        after.C.copy_(model.C)
    carry_output(model.out, after.out, one.leaf_map)
    again = exchange_sweep(after, s, 0, RefineConfig(per_word=50, max_moves=0.1, seed=1))
    assert [m.word for m in again.moves] == [
        m.word for m in two.moves[len(one.moves) : len(one.moves) + len(again.moves)]
    ]
    with pytest.raises(ValueError):
        refine_classes(model, s, 0, cfg, sweeps=0)


def test_refine_needs_classes():
    from hlbl.tree import random_tree

    model = LBL(LBLConfig(V, dim=D, context=2, output="tree"), random_tree(V, 0), torch.Generator().manual_seed(0))
    with pytest.raises(TreeError, match="the classes output layer"):
        exchange_sweep(model, stream(), 0)
    with pytest.raises(ValueError):
        RefineConfig(max_moves=0)


def test_cli_refine_then_train_keeps_the_output_layer(tmp_path, capsys, monkeypatch):
    data = tiny_corpus(tmp_path)
    run = tmp_path / "run"
    base = ["--data", str(data), "--dim", "8", "--context", "2", "--batch-size", "50", "--threads", "1"]
    assert main(["train", *base, "--output", "classes", "--epochs", "2", "--out", str(run)]) == 0
    out = tmp_path / "refined.json"
    assert main(["tree", "refine", "--from", str(run), "--out", str(out), "--max-moves", "0.5"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["moves"] >= 0 and report["out"] == str(out)
    assert WordClasses.load(out).num_classes == WordClasses.load(run / "tree.json").num_classes
    run2 = tmp_path / "run2"
    args = ["train", *base, "--output", "classes", "--tree", str(out), "--init-from", str(run), "--keep-output"]
    assert main([*args, "--epochs", "1", "--out", str(run2)]) == 0
    err = capsys.readouterr().err
    assert "output layer carried over" in err
    # a resume may repeat the command, --init-from given relative to the working directory
    monkeypatch.chdir(tmp_path)
    again = ["train", *base, "--output", "classes", "--tree", "refined.json", "--init-from", "run", "--keep-output"]
    assert main([*again, "--epochs", "2", "--out", "run2", "--resume"]) == 0
    assert len((run2 / "metrics.jsonl").read_text().splitlines()) == 2
    # --keep-output refuses classes that are not the source's up to moves
    C = WordClasses.load(run / "tree.json").num_classes
    other = tmp_path / "other.json"
    assert main(["tree", "build", "--data", str(data), "--classes", str(C + 1), "--out", str(other)]) == 0
    capsys.readouterr()
    bad = ["train", *base, "--output", "classes", "--tree", str(other), "--init-from", str(run), "--keep-output"]
    assert main([*bad, "--epochs", "1", "--out", str(tmp_path / "run3")]) == 2
    assert "--keep-output" in capsys.readouterr().err
