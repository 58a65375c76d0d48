"""Each finding of the crash-safety issue, reproduced: resume that destroyed runs (1), a same-size
vocabulary edit (3), tracebacks (4), invalid output and misleading messages (5), stale data (6).
Finding 2 (kill -9 during a checkpoint) is tests/test_crash.py."""

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import tiny_corpus
from hlbl import checkpoint as ckpt
from hlbl import run as hrun
from hlbl.cli import main

FAST = ["--dim", "8", "--context", "3", "--batch-size", "64", "--device", "cpu", "--quiet", "--engine", "torch"]
SRC = str(Path(__file__).parent.parent / "src")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tiny_corpus(tmp_path_factory.mktemp("robust") / "corpus", n_train=150)


def run_cli(argv, capsys):
    """(exit status, stdout, stderr) of ``hlbl argv`` in this process."""
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(rc, err, *words):
    """Exit 2 and one error line, the last (notes before it are fine), with no traceback."""
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert lines and lines[-1].startswith("hlbl: error: "), err
    assert "Traceback" not in err and sum(x.startswith("hlbl: error") for x in lines) == 1, err
    for w in words:
        assert w in lines[-1], (w, lines[-1])


def tensors(run: Path, name: str) -> dict:
    return {k: v.clone() for k, v in ckpt.load_tensors(run / name).items()}


def same(a: dict, b: dict) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ---- finding 1: --resume destroyed runs


def test_resume_without_state_json_continues_the_run_with_its_own_recipe(tmp_path, data, capsys):
    run = tmp_path / "R"
    rc, _, _ = run_cli(["train", "--data", data, "--out", run, "--epochs", "2", *FAST, "--dim", "12"], capsys)
    assert rc == 0
    straight = tmp_path / "S"
    assert run_cli(["train", "--data", data, "--out", straight, "--epochs", "3", *FAST, "--dim", "12"], capsys)[0] == 0
    (run / "state.json").unlink()  # a top-level copy: the checkpoint, not this file, is what a resume reads
    rc, _, err = run_cli(["train", "--resume", "--out", run, "--epochs", "3", "--quiet", "--engine", "torch"], capsys)
    assert rc == 0, err
    assert json.loads((run / "run.json").read_text())["model"]["dim"] == 12
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 3
    assert same(tensors(run, "last.safetensors"), tensors(straight, "last.safetensors"))


def test_a_run_stopped_before_its_first_checkpoint_resumes_with_its_own_recipe(tmp_path, data, capsys):
    run = tmp_path / "R"
    flags = [
        "--data",
        data,
        "--epochs",
        "1",
        "--dim",
        "6",
        "--context",
        "2",
        "--lr",
        "0.002",
        "--seed",
        "3",
        "--tree",
        "huffman",
        "--batch-size",
        "32",
        "--device",
        "cpu",
        "--quiet",
        "--engine",
        "torch",
    ]
    assert run_cli(["train", *flags, "--out", tmp_path / "straight"], capsys)[0] == 0
    assert run_cli(["train", *flags, "--out", run], capsys)[0] == 0
    for p in [run / "checkpoints", *(run / n for n in ("best.safetensors", "last.safetensors", "state.json"))]:
        shutil.rmtree(p) if p.is_dir() else p.unlink()  # as if killed during epoch 1
    (run / "metrics.jsonl").write_text("")
    rc, _, err = run_cli(["train", "--resume", "--out", run, "--device", "cpu", "--engine", "torch"], capsys)
    assert rc == 0, err
    assert "no complete checkpoint" in err and "the run's own recipe" in err
    info = json.loads((run / "run.json").read_text())
    assert (info["model"]["dim"], info["model"]["context"], info["train"]["lr"], info["train"]["seed"]) == (
        6,
        2,
        0.002,
        3,
    )
    assert same(tensors(run, "best.safetensors"), tensors(tmp_path / "straight", "best.safetensors"))


def test_flags_that_contradict_the_run_are_refused_and_named(tmp_path, data, capsys):
    run = tmp_path / "R"
    assert run_cli(["train", "--data", data, "--out", run, "--epochs", "1", *FAST], capsys)[0] == 0
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    rc, _, err = run_cli(
        ["train", "--resume", "--out", run, "--dim", "100", "--lr", "0.001", "--tree", "huffman", "--epochs", "2"],
        capsys,
    )
    one_line_error(rc, err, "--dim 100 (the run's is 8)", "--tree huffman (the run's is random)")
    assert "--lr" not in err  # 0.001 is the run's own rate: no contradiction
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    # the same values as the run's are accepted
    rc, _, err = run_cli(
        [
            "train",
            "--resume",
            "--out",
            run,
            "--dim",
            "8",
            "--context",
            "3",
            "--epochs",
            "1",
            "--device",
            "cpu",
            "--quiet",
        ],
        capsys,
    )
    assert rc == 0, err


def test_resume_never_writes_into_a_directory_that_is_not_a_run(tmp_path, data, capsys):
    other = tmp_path / "photos"
    other.mkdir()
    (other / "holiday.jpg").write_bytes(b"\xff\xd8")
    rc, _, err = run_cli(["train", "--resume", "--data", data, "--out", other, *FAST], capsys)
    one_line_error(rc, err, "not an hlbl run", str(other))
    assert [p.name for p in other.iterdir()] == ["holiday.jpg"]


# ---- finding 3: a same-size vocabulary edit


def test_weights_refuse_a_vocabulary_with_two_words_swapped(tmp_path, data, capsys):
    run = tmp_path / "R"
    assert run_cli(["train", "--data", data, "--out", run, "--epochs", "1", *FAST], capsys)[0] == 0
    vocab = json.loads((run / "vocab.json").read_text())
    w = vocab["words"]
    w[2], w[3] = w[3], w[2]
    (run / "vocab.json").write_text(json.dumps(vocab))
    rc, _, err = run_cli(["eval", run, "--device", "cpu"], capsys)
    one_line_error(rc, err, "best.safetensors", "another vocabulary")


# ---- finding 4: tracebacks instead of one-line errors


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data):
    run = tmp_path_factory.mktemp("trained") / "R"
    assert main(["train", "--data", str(data), "--out", str(run), "--epochs", "1", *FAST]) == 0
    return run


def _copy(run: Path, tmp_path: Path) -> Path:
    import shutil

    dest = tmp_path / "copy"
    shutil.copytree(run, dest)
    return dest


@pytest.mark.parametrize(
    "field,value,words",
    [
        ("epoch", "two", ["state.json", "'epoch'", "whole number"]),
        ("lr", "x", ["state.json", "'lr'", "finite number"]),
        ("lr", float("nan"), ["state.json", "'lr'", "NaN"]),
        ("done", "no", ["state.json", "'done'", "true or false"]),
        ("best_valid_ppl", None, ["state.json", "'best_valid_ppl'"]),
    ],
)
def test_a_state_json_with_a_wrong_type_is_one_line(trained, tmp_path, capsys, field, value, words):
    run = _copy(trained, tmp_path)
    path = run / "checkpoints" / "epoch-000001" / "state.json"
    state = json.loads(path.read_text())
    state[field] = value
    path.write_text(json.dumps(state))  # (json writes NaN as the non-standard NaN, which json reads)
    rc, _, err = run_cli(["train", "--resume", "--out", run, "--epochs", "2"], capsys)
    one_line_error(rc, err, *words)


@pytest.mark.parametrize(
    "edit,words",
    [
        (lambda info: info["corpus"].update(spec=5), ["run.json", "'corpus.spec'", "a string"]),
        (lambda info: info["text"].pop("min_count"), ["run.json", "text", "min_count"]),
        (lambda info: info["options"].pop("tree"), ["run.json", "options.tree"]),
        (lambda info: info["train"].pop("epoch_tokens"), ["run.json", "epoch_tokens", "missing"]),
        (lambda info: info["train"].update(lr=float("nan")), ["run.json", "'train.lr'", "NaN"]),
        (lambda info: info["train"].update(batch_size=2.5), ["run.json", "'train.batch_size'", "whole number"]),
        (lambda info: info.update(train=[]), ["run.json", "'train'", "JSON object"]),
        (lambda info: info["model"].update(dim="8"), ["run.json", "'model.dim'"]),
    ],
)
def test_a_run_json_with_a_wrong_type_is_one_line(trained, tmp_path, capsys, edit, words):
    run = _copy(trained, tmp_path)
    info = json.loads((run / "run.json").read_text())
    edit(info)
    (run / "run.json").write_text(json.dumps(info))
    for argv in (["train", "--resume", "--out", run, "--epochs", "2"], ["eval", run, "--device", "cpu"]):
        rc, _, err = run_cli(argv, capsys)
        one_line_error(rc, err, *words)


def test_a_non_utf8_metrics_line_is_one_line(trained, tmp_path, capsys):
    run = _copy(trained, tmp_path)
    path = run / "checkpoints" / "epoch-000001" / "metrics.jsonl"
    path.write_bytes(path.read_bytes()[:-3] + b"\xff}\n")
    rc, _, err = run_cli(["train", "--resume", "--out", run, "--epochs", "2"], capsys)
    one_line_error(rc, err, "metrics.jsonl", "line 1", "not UTF-8", "0xff")


def _limited(argv: list[str], limit_bytes: int, cwd: Path) -> subprocess.CompletedProcess:
    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    env = {**os.environ, "PYTHONPATH": SRC}
    return subprocess.run(
        [sys.executable, "-m", "hlbl", *argv],
        capture_output=True,
        text=True,
        env=env,
        preexec_fn=limit,
        cwd=cwd,
        timeout=600,
    )


def test_a_file_size_limit_while_a_checkpoint_is_written_is_one_line(tmp_path, data):
    # dim 400: the weights (~50 kB) pass the 30 kB limit, the corpus cache and run files do not
    proc = _limited(
        [
            "train",
            "--data",
            str(data),
            "--out",
            "R",
            "--epochs",
            "2",
            "--dim",
            "400",
            "--context",
            "2",
            "--device",
            "cpu",
            "--quiet",
            "--engine",
            "torch",
        ],
        30_000,
        tmp_path,
    )
    one_line_error(proc.returncode, proc.stderr, "cannot write the checkpoint of epoch 1", "File too large")
    assert not list((tmp_path / "R" / "checkpoints").iterdir())  # the partial checkpoint is removed


def test_a_full_disk_while_a_checkpoint_is_written_is_one_line(trained, tmp_path, capsys, monkeypatch):
    from safetensors import SafetensorError

    def full(*args, **kwargs):
        raise SafetensorError(
            'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'
        )

    monkeypatch.setattr(ckpt, "save_file", full)
    run = _copy(trained, tmp_path)
    rc, _, err = run_cli(["train", "--resume", "--out", run, "--epochs", "2", "--device", "cpu"], capsys)
    one_line_error(rc, err, "cannot write the checkpoint of epoch 2", "No space left on device", "disk is full")
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["epoch-000001"]


def test_a_huge_batch_size_is_refused_before_numpy_is_asked(tmp_path, data, capsys):
    rc, _, err = run_cli(
        [
            "train",
            "--data",
            data,
            "--out",
            tmp_path / "R",
            "--epochs",
            "1",
            "--batch-size",
            "1000000000000",
            "--device",
            "cpu",
            "--quiet",
        ],
        capsys,
    )
    one_line_error(rc, err, "--batch-size 1000000000000 needs", "GiB")


def test_a_huge_dimension_is_refused_before_torch_is_asked(tmp_path, data, capsys):
    rc, _, err = run_cli(
        [
            "train",
            "--data",
            data,
            "--out",
            tmp_path / "R",
            "--epochs",
            "1",
            "--dim",
            "1000000000000",
            "--device",
            "cpu",
            "--quiet",
        ],
        capsys,
    )
    one_line_error(rc, err, "--dim 1000000000000", "GiB")
    assert not (tmp_path / "R").exists()


def _peak_rss_mib(argv: list[str], stdin: bytes) -> tuple[int, str]:
    code = (
        "import resource, sys; from hlbl.cli import main; rc = main(sys.argv[1:]); "
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024, file=sys.stderr); sys.exit(rc)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, *argv],
        input=stdin,
        capture_output=True,
        env={**os.environ, "PYTHONPATH": SRC},
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return int(proc.stderr.decode().strip().splitlines()[-1]), proc.stdout.decode()


@pytest.mark.parametrize("command", ["score", "predict"])
def test_a_long_stdin_line_is_read_in_bounded_memory(trained, command):
    """A 40 MB line held whole, and split into 8M token strings, costs over half a gigabyte."""
    words = ("the cat sees a dog " * 2_100_000).strip()
    base, _ = _peak_rss_mib([command, str(trained), "--device", "cpu"], b"the cat\n")
    peak, out = _peak_rss_mib([command, str(trained), "--device", "cpu"], ("the cat\n" + words + "\na dog\n").encode())
    assert peak - base < 150, (base, peak)
    lines = out.strip().splitlines()
    if command == "score":
        assert [int(x.split("\t")[1]) for x in lines[:3]] == [3, 10_500_001, 3]
    else:
        assert len(lines) == 3


def test_a_long_line_scores_as_the_whole_line_would(trained, monkeypatch, capsys):
    import io

    from hlbl.cli import infer
    from hlbl.scoring import score_sentences

    monkeypatch.setattr("hlbl.lines.LONG_LINE_BYTES", 1000)
    feeds = []
    real_feed = infer._LongSentence.feed
    monkeypatch.setattr(
        infer._LongSentence, "feed", lambda self, text: feeds.append(len(text)) or real_feed(self, text)
    )
    line = " ".join(["the", "cat", "eats", "a", "fish", "zebra"] * 6000)  # longer than a 64 kB read
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(f"a dog\n{line}\n".encode())))
    rc, out, _ = run_cli(["score", trained, "--device", "cpu"], capsys)
    assert rc == 0
    got = [x.split("\t") for x in out.splitlines()[:2]]
    model, vocab, _ = hrun.load_model(trained)
    want = score_sentences(model, vocab, ["a dog", line])
    for g, w in zip(got, want):
        assert float(g[0]) == pytest.approx(w.log10_prob, abs=1e-5) and int(g[1]) == w.tokens and int(g[2]) == w.oov
    assert len(feeds) >= 2 and max(feeds) < 70_000  # read in pieces, not whole


# ---- finding 5: invalid output and misleading messages


def test_tree_banana_lists_the_valid_values(tmp_path, data, capsys):
    rc, _, err = run_cli(["train", "--data", data, "--out", tmp_path / "R", "--tree", "banana", *FAST], capsys)
    one_line_error(rc, err, "--tree banana", "random", "huffman", "tree file")


def test_a_diverged_run_names_what_is_not_finite(tmp_path, data, capsys):
    rc, _, err = run_cli(
        [
            "train",
            "--data",
            data,
            "--out",
            tmp_path / "R",
            "--epochs",
            "1",
            "--dim",
            "8",
            "--context",
            "1000",
            "--device",
            "cpu",
            "--quiet",
            "--engine",
            "torch",
        ],
        capsys,
    )
    one_line_error(rc, err, "validation perplexity inf", "(context=1000: ")  # the library's names: lr, context


def test_an_unreadable_checkpoint_is_not_reported_as_missing(trained, tmp_path, capsys):
    run = _copy(trained, tmp_path)
    (run / "best.safetensors").unlink()
    (run / "best.safetensors").mkdir()  # present, but not readable as a file
    rc, _, err = run_cli(["eval", run, "--device", "cpu"], capsys)
    one_line_error(rc, err, "best.safetensors", "cannot read")
    assert "missing" not in err
    (run / "best.safetensors").rmdir()
    rc, _, err = run_cli(["eval", run, "--device", "cpu"], capsys)
    one_line_error(rc, err, "best.safetensors", "missing")


def test_an_unreadable_json_file_is_not_reported_as_missing(tmp_path, monkeypatch):
    path = tmp_path / "state.json"
    path.write_text("{}")

    def denied(self):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "read_bytes", denied)
    with pytest.raises(ckpt.CheckpointError, match="cannot read training state .Permission denied"):
        ckpt.read_state(path)


def _arpa_with_a_zero(tmp_path: Path, data: Path) -> Path:
    lm = tmp_path / "lm.arpa"
    assert main(["ngram", "train", "--data", str(data), "--order", "1", "--out", str(lm)]) == 0
    lines = [
        ("-inf\t" + x.split("\t", 1)[1]) if x.split("\t")[1:2] == ["cat"] else x for x in lm.read_text().splitlines()
    ]
    lm.write_text("\n".join(lines) + "\n")
    return lm


def test_ngram_eval_never_prints_infinity(tmp_path, data, capsys):
    lm = _arpa_with_a_zero(tmp_path, data)
    rc, out, err = run_cli(["ngram", "eval", lm, "--data", data], capsys)
    assert "Infinity" not in out
    one_line_error(rc, err, str(lm), "probability 0", "'cat'")


def test_interpolating_with_an_ngram_zero_blames_the_ngram_model(trained, tmp_path, data, capsys):
    lm = _arpa_with_a_zero(tmp_path, data)
    with __import__("warnings").catch_warnings():
        __import__("warnings").simplefilter("error")  # no numpy divide-by-zero warning
        rc, out, err = run_cli(["eval", trained, "--data", data, "--interpolate", lm, "--device", "cpu"], capsys)
    assert rc == 0, err
    report = json.loads(out)  # strict JSON: no Infinity
    assert report["components"][1]["perplexity"] is None and 0 < report["perplexity"] < 1e6
    assert "probability 0" in err and "non-finite weights" not in err
    rc, out, err = run_cli(
        ["eval", trained, "--data", data, "--interpolate", lm, "--weight", "0", "--device", "cpu"], capsys
    )
    one_line_error(rc, err, str(lm), "probability 0", f"the mixture weight of {trained} is 0")


def test_a_cache_write_failure_names_the_cache(tmp_path, data, monkeypatch, capsys):
    cache = tmp_path / "cache"
    cache.write_text("a file where the cache directory should be")
    monkeypatch.setenv("HLBL_CACHE", str(cache))
    rc, _, err = run_cli(["train", "--data", data, "--out", tmp_path / "R", *FAST], capsys)
    one_line_error(rc, err, "corpus cache", str(cache))


# ---- finding 6: stale data


def test_same_size_text_with_the_old_timestamp_is_encoded_again(tmp_path):
    from hlbl.data import load_corpus

    root = tiny_corpus(tmp_path / "c", n_train=50)
    first = load_corpus(root, splits=("train", "valid"))
    valid = root / "valid.txt"
    st = valid.stat()
    text = valid.read_text()
    swapped = text.replace("cat", "XqX").replace("dog", "cat").replace("XqX", "dog")
    assert len(swapped) == len(text) and swapped != text
    valid.write_text(swapped)
    os.utime(valid, ns=(st.st_atime_ns, st.st_mtime_ns))
    again = load_corpus(root, vocab=first.vocab, splits=("valid",))
    assert list(again["valid"]) != list(first["valid"])


def test_a_torn_metrics_line_is_reported_at_resume(trained, tmp_path, capsys):
    run = _copy(trained, tmp_path)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"epoch": 2, "train_lo')  # a torn line, as a crash in the middle of an append leaves
    rc, _, err = run_cli(["train", "--resume", "--out", run, "--epochs", "2", "--device", "cpu"], capsys)
    assert rc == 0, err
    assert "torn last line" in err
    assert [json.loads(x)["epoch"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2]


# ---- run directories: a finished run is never replaced, a loaded run is checked before torch


def test_a_trained_run_without_its_checkpoints_is_never_trained_again_from_scratch(tmp_path, data, capsys):
    run = tmp_path / "R"
    assert run_cli(["train", "--data", data, "--out", run, "--epochs", "2", *FAST], capsys)[0] == 0
    shutil.rmtree(run / "checkpoints")  # to free space, or a copy that skipped it
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    rc, _, err = run_cli(["train", "--resume", "--out", run, "--epochs", "3", "--quiet", "--engine", "torch"], capsys)
    one_line_error(rc, err, "has trained", "new run directory")
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before


@pytest.mark.parametrize(
    "gone",
    [
        ("checkpoints", "state.json"),
        ("checkpoints", "best.safetensors"),
        ("checkpoints", "state.json", "best.safetensors"),
        ("checkpoints", "state.json", "best.safetensors", "last.safetensors"),
    ],
)
def test_any_trace_of_training_refuses_a_resume_from_scratch(tmp_path, data, capsys, gone):
    """Trained weights (best or last) or a metrics log with epochs mark a run as trained, whatever
    else of it is gone: neither the CLI nor Python's Run.resume starts it again."""
    from hlbl.run import Run

    run = tmp_path / "R"
    assert run_cli(["train", "--data", data, "--out", run, "--epochs", "2", *FAST], capsys)[0] == 0
    for name in gone:
        shutil.rmtree(run / name) if (run / name).is_dir() else (run / name).unlink()
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    rc, _, err = run_cli(["train", "--resume", "--out", run, "--epochs", "3", "--quiet", "--engine", "torch"], capsys)
    one_line_error(rc, err, "has trained", "new run directory")
    with pytest.raises(ckpt.CheckpointError, match="has trained"):
        Run.resume(run, log=lambda msg: None, max_epochs=3)
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before


def test_a_new_run_never_writes_over_a_run_finished_while_it_was_loading(tmp_path, data):
    """The emptiness check is made under the directory's lock: a training that read its corpus
    before another one finished into the same new directory refuses, leaving that run whole."""
    import torch

    from hlbl.config import LBLConfig, TrainConfig
    from hlbl.data import DataError, load_corpus
    from hlbl.model import LBL
    from hlbl.run import fit
    from hlbl.tree import random_tree

    corpus = load_corpus(data)
    V = len(corpus.vocab)
    late = LBL(LBLConfig(V, dim=8, context=3), random_tree(V, 0), torch.Generator().manual_seed(0))
    run = tmp_path / "R"
    assert main(["train", "--data", str(data), "--out", str(run), "--epochs", "1", *FAST]) == 0  # finishes first
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    cfg = TrainConfig(batch_size=64, max_epochs=1, progress=False, engine="torch")
    with pytest.raises(DataError, match="is not empty"):
        fit(late, corpus, cfg, run, log=lambda *a: None)
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before


@pytest.mark.parametrize("command", ["eval", "predict", "resume"])
def test_a_run_json_with_a_huge_dimension_is_one_line(tmp_path, trained, command, capsys, monkeypatch):
    run = _copy(trained, tmp_path)
    info = json.loads((run / "run.json").read_text())
    info["model"]["dim"] = 1_000_000_000
    (run / "run.json").write_text(json.dumps(info))
    argv = {
        "eval": ["eval", run],
        "predict": ["predict", run],
        "resume": ["train", "--resume", "--out", run, "--quiet"],
    }[command]
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO("the\n"))
    rc, _, err = run_cli(argv, capsys)
    one_line_error(rc, err, "run.json", "GiB")


def test_an_emptied_newer_checkpoint_falls_back_to_the_older_complete_one(tmp_path, data, capsys):
    run = tmp_path / "R"
    assert run_cli(["train", "--data", data, "--out", run, "--epochs", "1", *FAST], capsys)[0] == 0
    (run / "checkpoints" / "epoch-000002").mkdir()  # emptied by hand, beside the complete epoch 1
    rc, _, err = run_cli(["train", "--resume", "--out", run, "--epochs", "2", "--quiet", "--engine", "torch"], capsys)
    assert rc == 0, err
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["epoch-000002"]
    assert (run / "checkpoints" / "epoch-000002" / "state.json").is_file()


def test_a_checkpoint_of_another_tree_is_named_as_such(tmp_path, data, capsys):
    a, b = tmp_path / "A", tmp_path / "B"
    assert run_cli(["train", "--data", data, "--out", a, "--epochs", "1", *FAST], capsys)[0] == 0
    assert run_cli(["train", "--data", data, "--out", b, "--epochs", "2", *FAST, "--tree", "huffman"], capsys)[0] == 0
    # B's file ends epoch 2, A's state epoch 1: the tree, not the epoch, is what is wrong with it
    shutil.copy(b / "checkpoints" / "epoch-000002" / "last.safetensors", a / "checkpoints" / "epoch-000001")
    rc, _, err = run_cli(["train", "--resume", "--out", a, "--epochs", "2", "--quiet", "--engine", "torch"], capsys)
    one_line_error(rc, err, "another word tree")


# ---- fault sweep: readers of standard input, ARPA files and trees


def _stdin(monkeypatch, data: bytes) -> None:
    import io

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))


@pytest.mark.parametrize("command", ["score", "predict"])
def test_a_stdin_token_without_whitespace_is_one_unknown_word_read_in_bounded_memory(
    trained, monkeypatch, capsys, command
):
    """12 MB without a space: held whole and joined again at every read, it took quadratic time
    and twice its size; no word of any vocabulary is that long."""
    import tracemalloc

    from hlbl.scoring import score_sentences

    _stdin(monkeypatch, b"the cat " + b"x" * (12 << 20) + b" a\nthe dog\n")
    tracemalloc.start()
    try:
        rc, out, err = run_cli([command, trained, "--device", "cpu", "--json"], capsys)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert rc == 0, err
    assert peak < 6 << 20, peak
    rows = [json.loads(x) for x in out.splitlines()]
    if command == "score":
        model, vocab, _ = hrun.load_model(trained)
        want = score_sentences(model, vocab, ["the cat xyzzy a", "the dog"])
        assert [(r["tokens"], r["oov"]) for r in rows[:2]] == [(5, 1), (3, 0)]
        assert rows[0]["log10_prob"] == pytest.approx(want[0].log10_prob, abs=1e-5)
    else:
        assert rows[0]["context"].endswith(" cat <unk> a") and rows[0]["oov"] == 1 and len(rows) == 2


def test_lone_cr_line_ends_split_a_large_input_as_a_small_one(trained, monkeypatch, capsys):
    """Over 1 MiB with only \r line ends was one sentence; the corpus reader's rule is the same at any size."""
    text = ["the cat sees a dog " * 25 + str(i) for i in range(2400)]
    runs = {}
    for end in ("\n", "\r"):
        _stdin(monkeypatch, end.join(text).encode())
        rc, out, err = run_cli(["score", trained, "--device", "cpu"], capsys)
        assert rc == 0, err
        runs[end] = json.loads(out.splitlines()[-1])
    assert runs["\r"] == runs["\n"] and runs["\n"]["sentences"] == 2400


def _edited_arpa(tmp_path: Path, data: Path, edit) -> Path:
    """A bigram model of ``data`` with ``edit(fields)`` applied to each unigram line's fields."""
    lm = tmp_path / "lm.arpa"
    assert main(["ngram", "train", "--data", str(data), "--order", "2", "--out", str(lm)]) == 0
    lines, section = [], ""
    for x in lm.read_text().splitlines():
        section = x if x.startswith("\\") else section
        fields = x.split("\t")
        lines.append("\t".join(edit(fields) if section == "\\1-grams:" and len(fields) > 1 else fields))
    lm.write_text("\n".join(lines) + "\n")
    return lm


def _with_backoff(value: str):
    return lambda f: f[:2] + [value] if len(f) == 3 else f


@pytest.mark.parametrize(
    "edit, words",
    [
        (
            _with_backoff("1e30"),
            [".arpa:", ": log10 back-off '1e30' is out of range"],
        ),  # perplexity 0.0, or a traceback
        # each word P = 1; line 6: the \\1-grams: header after the protocol record and the \\data\\ section
        (lambda f: ["0"] + f[1:], [":6: the unigram probabilities sum to 15, more than 1"]),
        (lambda f: [f[0].replace(".", "_", 1)] + f[1:] if f[1] == "a" else f, ["bad log10 probability '-1_"]),
    ],
)
@pytest.mark.parametrize("command", ["ngram eval", "eval --interpolate"])
def test_an_arpa_value_no_model_has_is_one_line_naming_the_line(trained, tmp_path, data, capsys, edit, words, command):
    lm = _edited_arpa(tmp_path, data, edit)
    argv = (
        ["ngram", "eval", lm, "--data", data]
        if command == "ngram eval"
        else ["eval", trained, "--data", data, "--interpolate", lm, "--weight", "auto", "--device", "cpu"]
    )
    rc, _, err = run_cli(argv, capsys)
    one_line_error(rc, err, str(lm), *words)


def test_back_offs_in_range_that_make_a_probability_above_1_are_one_line(trained, tmp_path, data, capsys):
    """Weights of 10^5 turn some valid-split probability into 10^3.97: refused when the file is read
    (the context's probabilities sum to more than 1), no traceback from tuning the weight."""
    lm = _edited_arpa(tmp_path, data, _with_backoff("5"))
    argv = ["eval", trained, "--data", data, "--interpolate", lm, "--weight", "auto", "--device", "cpu"]
    rc, _, err = run_cli(argv, capsys)
    one_line_error(rc, err, f"{lm}: the probabilities after", "more than 1")


@pytest.fixture
def fifo(tmp_path):
    """A named pipe; a reader that opens it would wait for a writer forever: after 20 s writers
    come and go (so the old behaviour fails the test instead of hanging it)."""
    import threading

    path = tmp_path / "pipe"
    os.mkfifo(path)
    done = threading.Event()

    def unblock():
        done.wait(20)
        while not done.wait(0.1):
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:  # no reader waiting: nothing to unblock
                pass

    threading.Thread(target=unblock, daemon=True).start()
    yield path
    done.set()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes")
@pytest.mark.parametrize("reader", ["tree stats", "ngram eval", "tree.json", "vocab.json", "train --tree"])
def test_a_named_pipe_where_a_file_is_read_is_one_line(trained, tmp_path, data, fifo, capsys, reader):
    run = _copy(trained, tmp_path) if reader.endswith(".json") else None
    if run is not None:
        (run / reader).unlink()
        (run / reader).symlink_to(fifo)
    argv = {
        "tree stats": ["tree", "stats", fifo],
        "ngram eval": ["ngram", "eval", fifo, "--data", data],
        "tree.json": ["eval", run, "--device", "cpu"],
        "vocab.json": ["eval", run, "--device", "cpu"],
        "train --tree": ["train", "--data", data, "--out", tmp_path / "R", "--tree", fifo, *FAST],
    }[reader]
    rc, _, err = run_cli(argv, capsys)
    one_line_error(rc, err, reader if run is not None else str(fifo), "not a regular file")


def test_a_tree_too_deep_for_the_memory_is_one_line_and_its_stats_still_work(tmp_path, data, capsys, monkeypatch):
    """A caterpillar's padded paths grow as depth squared: refused, with the numbers, before training
    (the bound is a quarter of the process's memory; made tiny here for a tree of the corpus's 14 words)."""
    import numpy as np

    from hlbl.data import load_corpus
    from hlbl.tree import WordTree, leaf

    V = len(load_corpus(data, splits=("train",)).vocab)
    children = np.array([[leaf(j), j + 1] for j in range(V - 1)])
    children[-1] = [leaf(V - 2), leaf(V - 1)]
    path = tmp_path / "deep.json"
    WordTree(children, V).save(path)
    monkeypatch.setattr("hlbl.tree.memory_limit", lambda: 8 << 10)
    rc, _, err = run_cli(["train", "--data", data, "--out", tmp_path / "R", "--tree", path, *FAST], capsys)
    one_line_error(rc, err, str(path), f"{V:,} leaves and depth {V - 1:,}", "padded path tables")
    rc, out, err = run_cli(["tree", "stats", path], capsys)
    assert rc == 0 and json.loads(out)["max_depth"] == V - 1, err
