import json

import pytest

from conftest import tiny_corpus
from hlbl.cli import main


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    data = tiny_corpus(root / "corpus")
    rc = main(["train", "--data", str(data), "--out", str(root / "run"), "--epochs", "1", "--dim", "8",
               "--tree", "huffman", "--quiet", "--device", "cpu"])
    assert rc == 0
    return root, data


def test_train_output_format(tmp_path, capsys):
    data = tiny_corpus(tmp_path / "corpus")
    assert main(["train", "--data", str(data), "--out", str(tmp_path / "r"), "--epochs", "1", "--dim", "8",
                 "--output", "flat", "--quiet", "--device", "cpu", "--max-train-tokens", "500"]) == 0
    out = capsys.readouterr().out.splitlines()
    result = json.loads(out[0])
    assert result["test_perplexity"] > 1 and result["test_tokens"] == 40 * 7
    assert out[1].startswith("context: ") and out[2].startswith("sample: ")


def test_eval_counts_every_test_token(trained, capsys):
    root, _ = trained
    main(["eval", str(root / "run"), "--split", "test", "--device", "cpu"])
    line = json.loads(capsys.readouterr().out)
    assert line["tokens"] == 40 * 7  # 40 sentences of 6 words + <eos>


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


def test_help_on_every_command(capsys):
    for argv in (["--help"], ["train", "--help"], ["eval", "--help"], ["tree", "stats", "--help"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 0
    assert "--data" in capsys.readouterr().out


def test_optimiser_flags_reach_the_recipe(tmp_path, capsys):
    data = tiny_corpus(tmp_path / "corpus")
    assert main(["train", "--data", str(data), "--out", str(tmp_path / "r"), "--epochs", "1", "--dim", "8",
                 "--quiet", "--device", "cpu", "--max-train-tokens", "500", "--momentum", "0.5",
                 "--weight-decay-words", "0", "--weight-decay", "2e-5"]) == 0
    train = json.loads((tmp_path / "r" / "run.json").read_text())["train"]
    assert (train["momentum"], train["weight_decay_words"], train["weight_decay_other"]) == (0.5, 0.0, 2e-5)
