"""The examples run: each in its quick mode, as a user would start it."""

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def run_example(script: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, env=env, timeout=600)


def lstm_example():
    """examples/lstm_lm/lstm_lm.py imported by path (examples are not a package)."""
    spec = importlib.util.spec_from_file_location("lstm_lm", ROOT / "examples" / "lstm_lm" / "lstm_lm.py")
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    return ex


def test_the_lstm_example_trains_every_output_layer_in_quick_mode(tmp_path):
    out = tmp_path / "results.json"
    proc = run_example(ROOT / "examples" / "lstm_lm" / "lstm_lm.py", "--quick", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = {r["output"]: r for r in json.loads(out.read_text())}
    assert set(results) == {
        "full", "adaptive", "tree", "learned-tree", "sampled", "hybrid", "hybrid-huffman", "classes"
    }  # fmt: skip
    for r in results.values():
        # exact evaluation of a toy grammar over ~60 words: far below the uniform model's perplexity
        assert 1.0 < r["test_ppl"] < 40, r
        assert len(r["sample"].split()) == 8
        # the bands (ranks 0-10, 10-30, 30-58) split the test tokens and their loss, nothing lost or counted twice
        bands = r["test_bands"]
        assert [b["ranks"] for b in bands] == [[0, 10], [10, 30], [30, 58]]
        total = sum(b["tokens"] for b in bands)
        mean = sum(b["mean_nll"] * b["tokens"] for b in bands if b["tokens"]) / total
        assert math.exp(mean) == pytest.approx(r["test_ppl"], rel=1e-9)
        assert sum(b["token_share"] for b in bands) == pytest.approx(1.0)
    assert results["learned-tree"]["tree"]["words"] == 58 and "learned tree from hidden features" in proc.stderr
    # progress within each epoch (every 20 of the 53 batches in quick mode), bootstraps included
    assert "| tree | epoch   1 |    20/   53 batches | lr 20 | ms/batch" in proc.stderr
    assert "| learned-tree bootstrap (tree) | epoch   1 |    40/   53 batches" in proc.stderr
    assert results["hybrid"]["tree"]["words"] == 58 - 10  # the tail tree: the words outside the head of 10
    assert results["hybrid"]["bootstrap_output"] == "hybrid-huffman"
    # k-means classes on the Huffman model's hidden states: round(sqrt(58)) = 8 classes by default
    assert results["classes"]["classes"]["words"] == 58 and results["classes"]["bootstrap_output"] == "tree"
    assert results["classes"]["classes"]["classes"] <= 8 and "learned classes from hidden features" in proc.stderr


def test_every_output_layer_of_the_lstm_example_gives_a_distribution(tmp_path):
    """Each output layer (the learned kinds on a Huffman tree or frequency classes) gives rows that
    sum to one in eval mode, the forward pass's log P(target) is their entry, and sampling draws
    words of the vocabulary."""
    import hlbl

    ex = lstm_example()
    corpus = ex.Corpus(ex.synthetic_corpus(tmp_path / "toy"))
    args = ex.parse_args(["--quick"])
    V = len(corpus)
    structures = {"classes": hlbl.frequency_classes(corpus.counts, 8, shortlist=3)}
    x = corpus.splits["test"][:24].view(6, 4)
    y = corpus.splits["test"][1:25].view(6, 4)
    for kind in ex.OUTPUTS:
        torch.manual_seed(0)
        model = ex.build_model(corpus, "tree" if kind == "learned-tree" else kind, args, structures.get(kind))
        model.eval()
        with torch.no_grad():
            h, _ = model.hidden(x, None)
            h = h.reshape(-1, model.nhid)
            lp = model.head.log_prob(h).double()
            out, _ = model(x, y, None)
        assert lp.shape == (24, V), kind
        assert torch.allclose(lp.exp().sum(1), torch.ones(24, dtype=torch.float64), atol=1e-5), kind
        assert torch.allclose(out.output.double(), lp.gather(1, y.reshape(-1, 1))[:, 0], atol=1e-5), kind
        assert ex.generate(model, corpus, 5, seed=1).count(" ") == 4, kind


def test_the_lstm_example_gives_the_band_losses_of_a_saved_run(tmp_path):
    """--bands-of: the best model of a --checkpoint directory tested again, per band, without training."""
    ex = lstm_example()
    corpus = ex.Corpus(ex.synthetic_corpus(tmp_path / "toy"))
    args = ex.parse_args(["--quick", "--head", "5", "--max-steps", "30", "--checkpoint", str(tmp_path / "ck")])
    args.head = 5  # (--quick sets 10)
    r = ex.run(corpus, "hybrid-huffman", args, log=lambda m: None)
    again = ex.bands_of(corpus, [tmp_path / "ck" / "hybrid-huffman"], ex.parse_args(["--quick"]))  # its own head
    assert again[0]["output"] == "hybrid-huffman"
    assert again[0]["test_ppl"] == pytest.approx(r["test_ppl"], rel=1e-12)
    assert again[0]["test_bands"] == r["test_bands"]
    with pytest.raises(SystemExit, match="not a run directory"):
        ex.bands_of(corpus, [tmp_path], args)


def test_the_lstm_example_prints_progress_every_log_interval_batches(tmp_path):
    """--log-interval N: word_language_model's line every N batches of an epoch (batches done of
    the epoch's, lr, ms/batch, the mean training loss of those N batches and its exp); 0: none."""
    import re

    ex = lstm_example()
    corpus = ex.Corpus(ex.synthetic_corpus(tmp_path / "toy"))
    train = ex.batchify(corpus.splits["train"], 20)
    for interval, lines in ((10, 3), (0, 0), (None, 1)):  # None: the --quick default, 20
        argv = ["--quick", "--max-steps", "30"] + ([] if interval is None else ["--log-interval", str(interval)])
        args = ex.parse_args(argv)
        torch.manual_seed(0)
        model = ex.build_model(corpus, "tree", args)
        printed = []
        stats = ex.train_epoch(model, train, args, 20.0, log=printed.append, epoch=3, name="tree")
        assert len(printed) == lines, printed
        for i, line in enumerate(printed, 1):
            m = re.fullmatch(
                r"\| tree \| epoch   3 \| +(\d+)/   30 batches \| lr 20 \| ms/batch +([\d.]+) "
                r"\| loss +([\d.]+) \| ppl +([\d.]+)",
                line,
            )
            assert m and int(m[1]) == i * args.log_interval, line
            assert float(m[2]) > 0 and float(m[4]) == pytest.approx(math.exp(float(m[3])), rel=0.01)
        assert stats["seconds"] > 0
    assert ex.parse_args([]).log_interval == 200  # word_language_model's default
    ex.train_epoch(model, train, ex.parse_args(["--quick", "--max-steps", "30"]), 20.0)  # no log: nothing printed


def test_the_lstm_example_refuses_an_unknown_output():
    proc = run_example(ROOT / "examples" / "lstm_lm" / "lstm_lm.py", "--output", "tree,nope")
    assert proc.returncode == 2 and "unknown output 'nope'" in proc.stderr


def test_the_lstm_example_tests_the_best_validation_epoch_and_stops_when_the_schedule_runs_out(tmp_path):
    ex = lstm_example()
    corpus = ex.Corpus(ex.synthetic_corpus(tmp_path / "toy"))
    # lr 200 overshoots on the toy grammar, so some epoch fails to improve; --stop-lr 100 then ends the run
    args = ex.parse_args(["--quick", "--epochs", "6", "--lr", "200", "--stop-lr", "100", "--log-every", "1000"])
    r = ex.run(corpus, "tree", args, log=lambda m: None)
    valid = [e["valid_ppl"] for e in r["epochs"]]
    assert r["valid_ppl"] == min(valid) and valid[r["best_epoch"] - 1] == min(valid)
    assert [e["lr"] for e in r["epochs"]] == [200.0] * len(valid)  # one anneal (to 50 < 100) ends it
    assert len(valid) < 6 and valid[-1] >= min(valid[:-1])  # stopped by the schedule, not the cap


def test_the_lstm_example_trains_the_tree_layer_with_adam(tmp_path):
    ex = lstm_example()
    corpus = ex.Corpus(ex.synthetic_corpus(tmp_path / "toy"))
    args = ex.parse_args(["--quick", "--optimizer", "adam", "--epochs", "2", "--log-every", "1000"])
    assert args.lr == 0.001  # Adam's default, not the recipe's SGD rate of 20
    r = ex.run(corpus, "tree", args, log=lambda m: None)
    valid = [e["valid_ppl"] for e in r["epochs"]]
    assert valid[1] < valid[0] < len(corpus)  # learns from the first epoch on, and keeps learning


def test_the_lstm_example_names_a_missing_device_in_one_line():
    proc = run_example(ROOT / "examples" / "lstm_lm" / "lstm_lm.py", "--quick", "--device", "nope")
    assert proc.returncode == 2 and "--device" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_the_lstm_example_runs_unchanged_on_a_gpu(tmp_path):
    out = tmp_path / "results.json"
    proc = run_example(ROOT / "examples" / "lstm_lm" / "lstm_lm.py", "--quick", "--device", "cuda", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    for r in json.loads(out.read_text()):
        assert 1.0 < r["test_ppl"] < 40, r


@pytest.mark.parametrize(
    "kind, optimizer", [("learned-tree", "sgd"), ("tree", "adam"), ("adaptive", "adam"), ("classes", "sgd")]
)
def test_the_lstm_example_resumes_from_its_checkpoint_as_if_never_stopped(tmp_path, kind, optimizer):
    ex = lstm_example()
    corpus = ex.Corpus(ex.synthetic_corpus(tmp_path / "toy"))

    def train(epochs: int, where: str) -> dict:
        argv = ["--quick", "--epochs", str(epochs), "--optimizer", optimizer, "--log-every", "1000"]
        return ex.run(corpus, kind, ex.parse_args(argv + ["--checkpoint", str(tmp_path / where)]), log=lambda m: None)

    straight = train(3, "a")
    train(1, "b")  # stopped after one epoch
    resumed = train(3, "b")  # a new process would do the same: nothing but the directory carries over
    for key in ("valid_ppl", "train_loss", "lr"):
        assert [e[key] for e in resumed["epochs"]] == [e[key] for e in straight["epochs"]], key
    assert resumed["test_ppl"] == straight["test_ppl"] and resumed["best_epoch"] == straight["best_epoch"]
    assert train(3, "b")["test_ppl"] == straight["test_ppl"]  # done: tested again without training


def test_the_lstm_example_refuses_a_checkpoint_of_another_recipe_or_a_damaged_one(tmp_path):
    ex = lstm_example()
    corpus = ex.Corpus(ex.synthetic_corpus(tmp_path / "toy"))
    args = lambda *more: ex.parse_args(["--quick", "--epochs", "1", "--checkpoint", str(tmp_path / "c"), *more])  # noqa: E731
    ex.run(corpus, "tree", args(), log=lambda m: None)
    with pytest.raises(SystemExit, match="holds a run with lr = 20.0, not 5.0"):
        ex.run(corpus, "tree", args("--lr", "5"), log=lambda m: None)
    saved = tmp_path / "c" / "tree" / "checkpoint.safetensors"
    saved.write_bytes(saved.read_bytes()[:100])  # cut short, as by a full disk
    with pytest.raises(SystemExit, match="checkpoint.safetensors: cannot resume from it"):
        ex.run(corpus, "tree", args("--epochs", "2"), log=lambda m: None)


def test_the_lstm_example_learns_a_tree_from_a_trained_run(tmp_path, monkeypatch):
    """--bootstrap-from: another round of the bootstrap, the tree learned from the hidden states of
    the best model a --checkpoint run saved (no Huffman model trained); a run of another shape is
    refused in one line."""
    ex = lstm_example()
    corpus = ex.Corpus(ex.synthetic_corpus(tmp_path / "toy"))
    quick = ["--quick", "--epochs", "1", "--log-every", "1000"]
    first = ex.run(corpus, "learned-tree", ex.parse_args(quick + ["--checkpoint", str(tmp_path / "c")]), log=print)
    ex.run(corpus, "adaptive", ex.parse_args(quick + ["--checkpoint", str(tmp_path / "c")]), log=print)
    src = tmp_path / "c" / "learned-tree"
    again = ex.parse_args(quick + ["--bootstrap-from", str(src)])
    second = ex.run(corpus, "learned-tree", again, log=print)
    assert second["bootstrap_from"] == str(src) and second["bootstrap_output"] == "learned-tree"
    assert second["tree"]["words"] == first["tree"]["words"] == len(corpus)

    def no_training(*a, **k):
        raise AssertionError("the bootstrap trained a model instead of loading the saved one")

    monkeypatch.setattr(ex, "train_epoch", no_training)
    ex.learn_tree(corpus, ex.batchify(corpus.splits["train"], again.batch_size), again, print)
    again.nhid = 24
    with pytest.raises(SystemExit, match="a model with nhid = 16, not 24"):
        ex.learn_tree(corpus, ex.batchify(corpus.splits["train"], again.batch_size), again, print)
    with pytest.raises(SystemExit, match="not a run directory"):
        ex.run(corpus, "learned-tree", ex.parse_args(quick + ["--bootstrap-from", str(tmp_path)]), log=print)
    # any output layer's model gives hidden states: a tree for a trained adaptive-softmax model
    again.nhid = 16
    again.bootstrap_from = str(tmp_path / "c" / "adaptive")
    tree, info = ex.learn_tree(corpus, ex.batchify(corpus.splits["train"], again.batch_size), again, print)
    assert info["bootstrap_output"] == "adaptive" and tree.num_words == len(corpus)
    again.tree_features = "embedding"
    with pytest.raises(SystemExit, match="embedding takes a full softmax model"):
        ex.learn_tree(corpus, ex.batchify(corpus.splits["train"], again.batch_size), again, print)


def test_the_lstm_example_learns_word_classes_keeps_them_and_refuses_a_mismatch(tmp_path, monkeypatch):
    """--output classes: k-means classes on the bootstrap's hidden states (--classes, by default
    round(sqrt(V)); the --class-shortlist most frequent words under the root), saved as
    classes.json in the --checkpoint run directory. A stopped run goes on with them, no second
    bootstrap; --bands-of and --bootstrap-from read the run; other settings, a foreign or damaged
    file, or sizes the vocabulary cannot take are refused in one line."""
    import hlbl

    ex = lstm_example()
    corpus = ex.Corpus(ex.synthetic_corpus(tmp_path / "toy"))
    ck, saved = tmp_path / "c", tmp_path / "classes.json"
    quick = ["--quick", "--max-steps", "20", "--log-every", "1000"]

    def run(*more: str) -> dict:
        argv = quick + ["--checkpoint", str(ck), "--class-shortlist", "5", *more]
        return ex.run(corpus, "classes", ex.parse_args(argv), log=lambda m: None)

    first = run("--save-classes", str(saved))
    classes = hlbl.WordClasses.load(ck / "classes" / "classes.json")
    assert classes.fingerprint() == hlbl.WordClasses.load(saved).fingerprint()
    assert classes.shortlist.tolist() == [0, 1, 2, 3, 4]  # word ids are ranks by training count
    assert first["classes"]["shortlist"] == 5 and 2 <= classes.num_classes <= 8 == round(math.sqrt(len(corpus)))
    assert json.loads((ck / "classes" / "recipe.json").read_text())["classes"] == 8  # the default, resolved
    with monkeypatch.context() as m:
        m.setattr(ex, "bootstrap_features", lambda *a, **k: pytest.fail("the resumed run bootstrapped again"))
        resumed = run("--epochs", "2")
        assert len(resumed["epochs"]) == 2 and resumed["classes"] == first["classes"]
        assert resumed["epochs"][0] == first["epochs"][0]
        again = ex.bands_of(corpus, [ck / "classes"], ex.parse_args(["--quick"]))[0]
        assert again["output"] == "classes" and again["test_ppl"] == pytest.approx(resumed["test_ppl"], rel=1e-12)
    second = ex.run(corpus, "classes", ex.parse_args(quick + ["--bootstrap-from", str(ck / "classes")]), log=print)
    assert second["bootstrap_output"] == "classes" and second["bootstrap_from"] == str(ck / "classes")
    with pytest.raises(SystemExit, match="holds a run with classes = 8, not 5"):
        run("--classes", "5")
    hlbl.frequency_classes(np.ones(40), 4).save(ck / "classes" / "classes.json")
    with pytest.raises(SystemExit, match="word classes over 40 words, not this run's 58"):
        run()
    hlbl.huffman_tree(corpus.counts).save(ck / "classes" / "classes.json")
    with pytest.raises(SystemExit, match="not hlbl word classes"):
        run()
    with pytest.raises(SystemExit, match="--classes 60 --class-shortlist 0: a vocabulary of 58 words"):
        ex.run(corpus, "classes", ex.parse_args(quick + ["--classes", "60"]), log=lambda m: None)


@pytest.mark.parametrize("kind", ["classes", "hybrid"])
def test_the_lstm_example_relearns_its_structure_within_a_run_and_resumes_across_it(tmp_path, kind):
    """--rebuild-at 2: after epoch 2 the structure is learned again from the model's own hidden
    states and the output layer starts afresh on it, the rest of the model carried over. A run
    stopped before the rebuild, or after it, goes on exactly as the run that never stopped."""
    ex = lstm_example()
    corpus = ex.Corpus(ex.synthetic_corpus(tmp_path / "toy"))

    def train(epochs: int, where: str, *more: str) -> dict:
        argv = ["--quick", "--epochs", str(epochs), "--max-steps", "25", "--log-every", "1000", "--head", "10"]
        argv += ["--rebuild-at", "2"]
        args = ex.parse_args(argv + ["--checkpoint", str(tmp_path / where), *more])
        return ex.run(corpus, kind, args, log=lambda m: None)

    straight = train(4, "a")
    (rebuild,) = straight["rebuilds"]
    assert rebuild["epoch"] == 2 and rebuild["structure"]["words"] == (48 if kind == "hybrid" else 58)
    assert 1.0 < straight["test_ppl"] < 40 and straight["best_epoch"] > 2  # the best of the last structure
    assert (tmp_path / "a" / kind / ex.Checkpoint.rebuilt_name(kind, 2)).is_file()
    train(2, "b")  # stopped before the rebuild
    train(3, "b")  # and after it: the checkpoint holds a model on the rebuilt structure
    resumed = train(4, "b")
    for key in ("valid_ppl", "train_loss", "lr"):
        assert [e[key] for e in resumed["epochs"]] == [e[key] for e in straight["epochs"]], key
    assert resumed["test_ppl"] == straight["test_ppl"]
    # the saved run's best model is read back on its last rebuilt structure, not the bootstrap's
    (banded,) = ex.bands_of(corpus, [tmp_path / "a" / kind], ex.parse_args(["--quick", "--head", "10"]))
    assert banded["test_ppl"] == pytest.approx(straight["test_ppl"], rel=1e-9)
    with pytest.raises(SystemExit, match="holds a run with rebuild_at"):
        train(4, "b", "--rebuild-at", "3")


def test_the_lstm_example_refuses_a_rebuild_without_a_learned_structure():
    ex = lstm_example()
    with pytest.raises(SystemExit, match="--rebuild-at relearns a learned structure"):
        ex.main(["--output", "adaptive", "--rebuild-at", "2"])
    with pytest.raises(SystemExit):
        ex.parse_args(["--output", "learned-tree", "--rebuild-at", "0"])
