"""``hlbl reproduce``: the whole pipeline on a tiny corpus, its tables, and resuming."""

import json
from pathlib import Path

import numpy as np
import pytest

import hlbl.reproduce as rp
import hlbl.run as hrun
from hlbl.config import TrainConfig
from hlbl.cli import main

COLUMNS = "| model | tree | test perplexity | valid perplexity | minutes per epoch | words/s |"
TREE_CELLS = [
    "RANDOM",
    "BALANCED",
    "ADAPTIVE",
    "ADAPTIVE(0.25)",
    "ADAPTIVE(0.4)",
    "ADAPTIVE(0.4) x2",
    "ADAPTIVE(0.4) x4",
]


def tiny_corpus(root):
    """A corpus with some structure: sentences from a few word classes in a fixed pattern."""
    rng = np.random.default_rng(0)
    classes = [[f"{c}{i}" for i in range(8)] for c in "abcde"]
    root.mkdir()
    for split, n in (("train", 250), ("valid", 25), ("test", 25)):
        lines = []
        for _ in range(n):
            k = rng.integers(3, 8)
            lines.append(" ".join(rng.choice(classes[j % 5]) for j in range(k)))
        (root / f"{split}.txt").write_text("\n".join(lines) + "\n")
    return root


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    base = tmp_path_factory.mktemp("repro")
    data = tiny_corpus(base / "corpus")
    out = base / "out"
    argv = [
        "reproduce",
        "--data",
        str(data),
        "--out",
        str(out),
        "--work",
        str(out / "work"),
        "--quick",
        "--quiet",
        "--threads",
        "1",
    ]
    assert main(argv) == 0
    return data, out, argv


def test_tables_and_plot(done):
    _, out, _ = done
    t1 = (out / "table1.md").read_text()
    t3 = (out / "table3.md").read_text()
    for t in (t1, t3):
        assert "Produced by `hlbl reproduce" in t and "at commit `" in t
        assert "Missing" not in t
    assert "`--quick` smoke test: 16-d vectors" in t3
    assert any(line.startswith(COLUMNS) for line in t3.splitlines())
    rows = [line.split(" | ") for line in t3.splitlines() if line.startswith("| HLBL")]
    assert [r[1] for r in rows] == TREE_CELLS
    assert any(line.startswith("| LBL | - |") for line in t3.splitlines())
    assert any(line.startswith("| KN5 | - |") for line in t3.splitlines())
    assert (out / "perplexity_vs_time.png").read_bytes()[:4] == b"\x89PNG"
    res = json.loads((out / "results.json").read_text())
    assert len(res["rows"]) == 9 and all(np.isfinite(r["test_perplexity"]) for r in res["rows"])
    # Table 1 statistics follow the paper's structure on any corpus.
    stats = {
        r["name"]: json.loads((out / "work" / "trees" / f"{r['name']}.build.json").read_text())["stats"]
        for r in res["rows"]
        if r["name"].startswith("T")
    }
    for s in stats.values():
        assert s["internal_nodes"] == s["leaves"] - 1
    assert stats["T1"]["codes_per_word"] == pytest.approx(1.0)
    assert stats["T6"]["codes_per_word"] >= 2 * 1.0 - 1e-9 and stats["T7"]["codes_per_word"] >= 4 - 1e-9


def test_rerun_skips_finished_steps(done, monkeypatch):
    _, out, argv = done

    def forbidden(*a, **k):
        raise AssertionError("a finished step was recomputed")

    for name in ("fit", "build_tree_from_features", "word_features"):
        monkeypatch.setattr(rp, name, forbidden)
    before = (out / "work" / "results" / "T3.json").read_bytes()
    assert main(argv) == 0
    assert (out / "work" / "results" / "T3.json").read_bytes() == before


def test_interrupted_training_resumes(done, monkeypatch, tmp_path):
    """A run killed after its first epoch, rerun, ends exactly where an uninterrupted one did."""
    import dataclasses
    import shutil

    data, out, argv = done
    before = json.loads((out / "work" / "results" / "T3.json").read_text())
    assert before["epochs"] == 2, "the test needs T3 to have trained two epochs"
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    (copy / "work" / "results" / "T3.json").unlink()
    shutil.rmtree(copy / "work" / "runs" / "T3")
    argv = [str(copy) if a == str(out) else str(copy / "work") if a == str(out / "work") else a for a in argv]
    real_fit = rp.fit

    def killed_after_one_epoch(model, corpus, cfg, run_dir, resume=False, **kw):
        real_fit(model, corpus, dataclasses.replace(cfg, max_epochs=1), run_dir, resume=resume, **kw)
        raise KeyboardInterrupt

    monkeypatch.setattr(rp, "fit", killed_after_one_epoch)
    assert main(argv) == 130
    assert json.loads((copy / "work" / "runs" / "T3" / "state.json").read_text())["epoch"] == 1
    calls = []

    def counting_fit(model, corpus, cfg, run_dir, resume=False, **kw):
        calls.append((run_dir.name, resume))
        return real_fit(model, corpus, cfg, run_dir, resume=resume, **kw)

    monkeypatch.setattr(rp, "fit", counting_fit)  # a new run
    monkeypatch.setattr(hrun, "fit", counting_fit)  # the one resume, hlbl.run.Run.resume
    assert main(argv) == 0
    assert calls == [("T3", True)]
    after = json.loads((copy / "work" / "results" / "T3.json").read_text())
    assert after["tree"] == "ADAPTIVE"
    for key in ("test_perplexity", "valid_perplexity", "epochs", "stopped_early"):
        assert after[key] == before[key], key


def test_work_directory_defaults_to_runs_not_out(tmp_path, monkeypatch):
    data = tiny_corpus(tmp_path / "corpus")
    monkeypatch.chdir(tmp_path)
    r = rp.Reproduction(rp.ReproConfig(data=str(data), out="tables", quick=True), log=lambda *a: None)
    assert r.work == Path("runs") / "reproduce-corpus-quick" and (tmp_path / r.work / "runs").is_dir()
    assert r.out == Path("tables")
    # The tables go to results/NAME, whatever the corpus (a smoke test's into its work directory).
    assert rp.Reproduction(rp.ReproConfig(data=str(data)), log=lambda *a: None).out == Path("results") / "corpus"
    quick = rp.Reproduction(rp.ReproConfig(data=str(data), quick=True), log=lambda *a: None)
    assert quick.out == quick.work / "tables"
    monkeypatch.chdir(data)  # "." names the corpus after its directory, not the empty string
    here = rp.Reproduction(rp.ReproConfig(data="."), log=lambda *a: None)
    assert here.out == Path("results") / "corpus" and here.work == Path("runs") / "reproduce-corpus"
    assert rp.ReproConfig().epochs == TrainConfig().max_epochs  # the same cap as `hlbl train`


def test_a_corpus_with_sentence_boundary_tokens_is_refused_before_training(tmp_path, monkeypatch, capsys):
    from conftest import write_corpus

    data = write_corpus(tmp_path / "c", {s: ["a <s> b c", "b c a </s>"] * 20 for s in ("train", "valid", "test")})
    monkeypatch.chdir(tmp_path)
    assert main(["reproduce", "--data", str(data), "--quick", "--quiet"]) == 2
    assert "ARPA files reserve" in capsys.readouterr().err
    assert not list((tmp_path / "runs").glob("*/runs/T1"))
    assert main(["reproduce", "--data", str(data), "--quick", "--quiet", "--skip", "T2,T3,T4,T5,T6,T7,flat,KN5"]) == 0


def test_more_epochs_for_t1_rebuild_the_features_and_the_learned_trees(tmp_path, monkeypatch, capsys):
    data = tiny_corpus(tmp_path / "corpus")
    monkeypatch.chdir(tmp_path)
    skip = ["--skip", "T3,T4,T5,T6,T7,flat,KN5", "--quick", "--threads", "1"]
    assert main(["reproduce", "--data", str(data), "--epochs", "1", *skip, "--quiet"]) == 0
    work = tmp_path / "runs" / "reproduce-corpus-quick"
    assert not (work / "trees" / "T3.json").exists()  # a skipped step builds nothing, not even its tree
    tree_before = (work / "trees" / "T2.json").read_bytes()
    features_before = (work / "features.npz").read_bytes()
    assert main(["reproduce", "--data", str(data), "--epochs", "2", *skip]) == 0
    assert "T1 has trained on since its features were computed" in capsys.readouterr().err
    assert (work / "features.npz").read_bytes() != features_before
    assert (work / "trees" / "T2.json").read_bytes() != tree_before
    assert json.loads((work / "results" / "T2.json").read_text())["epochs"] == 2  # trained again, on the new tree


def test_bad_options_are_one_line_errors(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing may be written, but if it were, not into the checkout
    assert main(["reproduce", "--data", str(tmp_path / "none"), "--out", str(tmp_path / "o"), "--quick"]) == 2
    assert main(["reproduce", "--data", "ptb", "--out", str(tmp_path / "o"), "--skip", "T9"]) == 2
    err = capsys.readouterr().err
    assert err.count("hlbl: error:") == 2
    assert not (tmp_path / "runs").exists()


def test_a_work_directory_serves_one_configuration(tmp_path, monkeypatch, capsys):
    data = tiny_corpus(tmp_path / "corpus")
    monkeypatch.chdir(tmp_path)
    skip = ["--skip", "T2,T3,T4,T5,T6,T7,flat,KN5", "--quiet", "--threads", "1"]
    assert main(["reproduce", "--data", str(data), "--out", "A", "--quick", *skip]) == 0
    capsys.readouterr()
    assert main(["reproduce", "--data", str(data), "--out", "B", "--quick", "--dim", "8", *skip]) == 2
    assert "another dim" in capsys.readouterr().err
    # a larger epoch cap is the same reproduction, continued
    assert main(["reproduce", "--data", str(data), "--out", "A", "--quick", "--epochs", "2", *skip]) == 0
