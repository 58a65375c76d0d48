"""The package's public surface: names, version, cheap import, typed marker, messages and logging."""

import importlib.metadata
import logging
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest

import hlbl
from hlbl.cli import flag_message, main
from hlbl.errors import ConfigError, DataError, HlblError


def test_every_public_name_resolves_and_all_lists_exactly_them():
    for name in hlbl.__all__:
        assert getattr(hlbl, name) is not None, name
    assert set(hlbl.__all__) == set(hlbl._LAZY) | {
        "__version__",
        "HlblError",
        "DataError",
        "ConfigError",
        "TreeError",
        "CheckpointError",
    }
    assert hlbl.LBL.__module__ == "hlbl.model" and hlbl.TreeSoftmax.__module__ == "hlbl.output.tree"
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        hlbl.nothing  # noqa: B018


def test_version_has_one_source():
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in pyproject and 'attr = "hlbl._version.__version__"' in pyproject
    assert re.fullmatch(r"\d+\.\d+\.\d+", hlbl.__version__)
    try:
        dist = importlib.metadata.distribution("hlbl")
    except importlib.metadata.PackageNotFoundError:
        return  # run from a source tree without installing
    if Path(dist.locate_file("hlbl")).resolve() == Path(hlbl.__file__).resolve().parent:  # this checkout's install
        assert dist.version == hlbl.__version__


def test_the_cli_says_its_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out == f"hlbl {hlbl.__version__}\n"


def test_import_is_cheap():
    code = "import sys, hlbl; print(sorted(m for m in ('torch', 'numba', 'matplotlib', 'scipy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_typed_marker_ships():
    assert (Path(hlbl.__file__).parent / "py.typed").is_file()
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert 'hlbl = ["py.typed"]' in pyproject


def test_library_messages_name_parameters_and_the_cli_names_flags():
    e = ConfigError("max_vocab", "max_vocab must be at least 2 (<eos> and <unk>)")
    assert isinstance(e, HlblError) and isinstance(e, ValueError) and not isinstance(e, DataError)
    assert e.field == "max_vocab" and str(e) == "max_vocab must be at least 2 (<eos> and <unk>)"
    assert flag_message(e) == "--max-vocab must be at least 2 (<eos> and <unk>)"
    again = pickle.loads(pickle.dumps(e))  # errors cross process boundaries whole
    assert type(again) is ConfigError and again.field == e.field and str(again) == str(e)
    # The flag that sets the field, whatever its spelling; only the field the message starts with.
    assert flag_message(ConfigError("max_epochs", "max_epochs must be at least 1, got 0")) == (
        "--epochs must be at least 1, got 0"
    )
    e = ConfigError("engine", "engine 'fast' cannot train this model: flat output")
    assert flag_message(e) == "--engine 'fast' cannot train this model: flat output"
    e = ConfigError("vocab_size", "vocab_size must be at least 2, got 1")  # no flag sets it
    assert flag_message(e) == str(e)
    e = FloatingPointError("training diverged in epoch 3 (loss nan); lower the learning rate (lr=0.001)")
    assert flag_message(e) == str(e)
    assert flag_message(DataError("corpus x: no such file")) == "corpus x: no such file"  # nothing to map


def test_the_cli_names_the_flag_of_a_library_error(tmp_path, capsys):
    from conftest import tiny_corpus

    data = tiny_corpus(tmp_path / "c", n_train=20)
    assert main(["train", "--data", str(data), "--out", str(tmp_path / "r"), "--max-vocab", "1", "--quiet"]) == 2
    assert capsys.readouterr().err == "hlbl: error: --max-vocab must be at least 2 (<eos> and <unk>), got 1\n"


def test_the_library_logs_and_prints_nothing(tmp_path, capfd, caplog):
    from conftest import tiny_corpus

    corpus = hlbl.load_corpus(tiny_corpus(tmp_path / "c", n_train=50))
    model = hlbl.LBL(hlbl.LBLConfig(len(corpus.vocab), dim=4, context=2), hlbl.random_tree(len(corpus.vocab), 0))
    with caplog.at_level(logging.INFO, logger="hlbl"):
        hlbl.fit(model, corpus, hlbl.TrainConfig(max_epochs=1, progress=False, engine="torch"), tmp_path / "run")
    out, err = capfd.readouterr()
    assert out == ""
    assert [r.name for r in caplog.records] and all(r.name == "hlbl.train" for r in caplog.records)
    assert caplog.records[0].getMessage().startswith("epoch 1: train loss ")
