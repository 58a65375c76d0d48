"""What a new user meets after training: the run's corpus found with nothing set, the blank-line
protocol of perplexity reports, and out-of-vocabulary words told apart from the text's own <unk>."""

import io
import json
import math
import sys

import numpy as np
import pytest

from conftest import tiny_corpus, write_corpus
from hlbl.cli import main
from hlbl.data import DataError, load_corpus, resolve_corpus
from hlbl.errors import ConfigError

TRAIN = ["the cat sat", "", "a dog ran", "the dog sat", "", "", "a cat ran"]


def corpus_with_blank_lines(root):
    """train: 4 sentences and 3 blank lines; valid: 2 and 1; test: 2, 1, and the text's own <unk>."""
    return write_corpus(
        root,
        {
            "train": TRAIN * 20,
            "valid": ["the cat ran", "", "a dog sat"],
            "test": ["the <unk> sat", "  ", "a zebra ran"],
        },
    )


def test_blank_lines_drop_or_keep(tmp_path):
    """drop (the default): a blank line is no sentence; keep: every line gets one <eos>, as in
    WikiText's protocol; each protocol has its own cache entries."""
    data = corpus_with_blank_lines(tmp_path / "c")
    drop = load_corpus(data)
    keep = load_corpus(data, blank_lines="keep")
    assert len(drop["train"]) == 20 * (4 * 3 + 4) and len(keep["train"]) == 20 * (4 * 3 + 7)
    eos = drop.vocab.eos
    assert keep.vocab.counts[keep.vocab.eos] == 20 * 7 and drop.vocab.counts[eos] == 20 * 4
    assert list(keep.vocab.decode(keep["valid"])) == ["the", "cat", "ran", "<eos>", "<eos>", "a", "dog", "sat", "<eos>"]
    assert (
        drop.token_counts("valid")["blank_lines_dropped"] == 1
        and keep.token_counts("valid")["blank_lines_dropped"] == 0
    )
    assert drop.token_counts("test")["blank_lines"] == "drop" and keep.token_counts("test")["blank_lines"] == "keep"
    assert len(load_corpus(data)["train"]) == len(drop["train"])  # from the cache: still the drop protocol
    with pytest.raises(ConfigError, match="^blank_lines must be one of drop, keep .*got 'skip'"):
        load_corpus(data, blank_lines="skip")


def test_unk_in_the_text_is_not_counted_as_out_of_vocabulary(tmp_path):
    data = corpus_with_blank_lines(tmp_path / "c")
    counts = load_corpus(data).token_counts("test")
    assert counts["unk_in_text"] == 1 and counts["oov"] == 1  # <unk> written in the text; zebra never seen


def test_the_run_records_its_protocol_and_eval_uses_it(tmp_path, monkeypatch, capsys):
    data = corpus_with_blank_lines(tmp_path / "c")
    assert (
        main(
            [
                "train",
                "--data",
                str(data),
                "--out",
                str(tmp_path / "run"),
                "--epochs",
                "1",
                "--dim",
                "4",
                "--quiet",
                "--device",
                "cpu",
                "--blank-lines",
                "keep",
            ]
        )
        == 0
    )
    final = json.loads(capsys.readouterr().out.splitlines()[0])
    assert final["blank_lines"] == "keep" and final["test_blank_lines_dropped"] == 0
    assert final["test_tokens"] == 4 + 1 + 4 and final["test_oov"] == 1 and final["test_unk_in_text"] == 1
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["text"]["blank_lines"] == "keep" and info["corpus"]["path"] == str(data.resolve())
    assert main(["eval", str(tmp_path / "run"), "--device", "cpu"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["tokens"] == 9 and rep["blank_lines"] == "keep" and rep["blank_lines_dropped"] == 0
    assert (rep["oov"], rep["unk_in_text"]) == (1, 1)
    assert main(["eval", str(tmp_path / "run"), "--device", "cpu", "--blank-lines", "drop"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["tokens"] == 8 and rep["blank_lines"] == "drop" and rep["blank_lines_dropped"] == 1
    # hlbl score reads stdin with the run's protocol too: a blank line is the empty sentence <eos>
    for flags, sentences, dropped in (([], 3, 0), (["--blank-lines", "drop"], 2, 1)):
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"the cat sat\n\na dog ran\n"), encoding="utf-8"))
        assert main(["score", str(tmp_path / "run"), "--device", "cpu", *flags]) == 0
        summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert summary["sentences"] == sentences and summary["blank_lines_dropped"] == dropped
        assert summary["blank_lines"] == ("drop" if flags else "keep")
    # resuming with the other protocol would train on other streams
    assert (
        main(
            [
                "train",
                "--data",
                str(data),
                "--out",
                str(tmp_path / "run"),
                "--epochs",
                "2",
                "--quiet",
                "--device",
                "cpu",
                "--resume",
                "--blank-lines",
                "drop",
            ]
        )
        == 2
    )
    assert "--blank-lines keep" in capsys.readouterr().err


def test_ngram_models_use_the_same_protocol(tmp_path, capsys):
    """keep: a blank line is the sentence <s> </s>, counted in training and scored in eval (KenLM's reading)."""
    from hlbl.ngram import read_arpa

    data = corpus_with_blank_lines(tmp_path / "c")
    reps = {}
    for protocol in ("drop", "keep"):
        arpa = tmp_path / f"{protocol}.arpa"
        assert (
            main(["ngram", "train", "--data", str(data), "--order", "2", "--out", str(arpa), "--blank-lines", protocol])
            == 0
        )
        capsys.readouterr()
        assert (
            main(["ngram", "eval", str(arpa), "--data", str(data), "--split", "valid", "--blank-lines", protocol]) == 0
        )
        reps[protocol] = json.loads(capsys.readouterr().out)
        model = read_arpa(arpa)
        empty = model.lookup(["<s>", "</s>"])
        assert (empty is not None) == (protocol == "keep")  # only kept blank lines make the bigram <s> </s>
    assert reps["drop"]["tokens"] == 8 and reps["keep"]["tokens"] == 9
    assert reps["drop"]["blank_lines_dropped"] == 1 and reps["keep"]["blank_lines_dropped"] == 0
    assert {"oov", "unk_in_text", "blank_lines"} <= set(reps["keep"])


def test_commands_after_training_find_the_corpus_with_nothing_set(tmp_path, monkeypatch, capsys):
    """Trained with $HLBL_DATA naming the corpus; later, with the variable unset and from another
    directory, eval and tree build still find it (where the run found it)."""
    tiny_corpus(tmp_path / "shared" / "mini")
    monkeypatch.setenv("HLBL_DATA", str(tmp_path / "shared"))
    monkeypatch.chdir(tmp_path)
    assert (
        main(["train", "--data", "mini", "--out", "run", "--epochs", "1", "--dim", "4", "--quiet", "--device", "cpu"])
        == 0
    )
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["corpus"]["spec"] == "mini"  # the name, portable between machines ...
    assert info["corpus"]["path"] == str((tmp_path / "shared" / "mini").resolve())  # ... and where it was
    monkeypatch.delenv("HLBL_DATA")
    (tmp_path / "elsewhere").mkdir()  # no ./mini there either
    monkeypatch.chdir(tmp_path / "elsewhere")
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "run"), "--device", "cpu"]) == 0
    assert math.isfinite(json.loads(capsys.readouterr().out)["perplexity"])
    assert (
        main(
            [
                "tree",
                "build",
                "--from",
                str(tmp_path / "run"),
                "--out",
                str(tmp_path / "t.json"),
                "--policy",
                "balanced",
            ]
        )
        == 0
    )
    # A name found nowhere: the error lists where it looked and does not blame an unset $HLBL_DATA.
    with pytest.raises(DataError) as e:
        resolve_corpus("nosuch")
    msg = str(e.value)
    assert "looked in" in msg and "$HLBL_DATA is not set" in msg and "not in $HLBL_DATA" not in msg
    assert str(tmp_path / "elsewhere" / "nosuch") in msg
    # Moved away since: the error names the recorded directory too.
    (tmp_path / "shared" / "mini").rename(tmp_path / "shared" / "gone")
    assert main(["eval", str(tmp_path / "run"), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert str((tmp_path / "shared" / "mini").resolve()) in err and "where the run found it" in err


def test_the_hlbl_data_error_names_the_directory_it_looked_in(tmp_path, monkeypatch):
    monkeypatch.setenv("HLBL_DATA", str(tmp_path / "corpora"))
    with pytest.raises(DataError) as e:
        resolve_corpus("nosuch")
    assert str(tmp_path / "corpora" / "nosuch") in str(e.value) and "not set" not in str(e.value)


def test_eval_stream_matches_kept_blank_lines_exactly(tmp_path):
    """A file of blank lines only, kept: one <eos> per line (and dropped: no sentences, an error)."""
    data = write_corpus(tmp_path / "c", {"train": TRAIN, "valid": ["", ""], "test": ["a"]})
    keep = load_corpus(data, blank_lines="keep", splits=("valid",))
    assert np.array_equal(keep["valid"], [keep.vocab.eos] * 2)
    with pytest.raises(DataError, match="no sentences"):
        load_corpus(data, splits=("valid",))
