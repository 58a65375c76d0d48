"""The command line builds the library's settings from one table (hlbl.cli.common.FLAGS): a flag
not given leaves the setting's own default, every flag a command offers reaches its setting, and no
command reaches into argparse's private state to tell a given flag from a default."""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path

import pytest

import hlbl.refine
from hlbl.cli import build_parser, main
from hlbl.cli.common import FLAGS, settings
from hlbl.config import LBLConfig, ReproConfig, TrainConfig
from hlbl.data import TextProtocol
from hlbl.refine import RefineConfig

SRC = Path(__file__).resolve().parents[1] / "src" / "hlbl"


def test_a_command_line_without_setting_flags_gives_the_configs_defaults():
    args = build_parser().parse_args(["train", "--out", "r"])
    assert settings(LBLConfig, args, vocab_size=10) == LBLConfig(10)
    assert settings(TrainConfig, args, device="auto") == TrainConfig(device="auto")
    assert settings(TextProtocol, args) == TextProtocol()
    args = build_parser().parse_args(["reproduce"])
    assert settings(ReproConfig, args) == ReproConfig()


def test_every_setting_of_a_run_has_its_flag_in_train():
    args = build_parser().parse_args(["train", "--out", "r"])
    offered = set(vars(args))
    for cls, own in ((LBLConfig, {"vocab_size"}), (TrainConfig, {"device", "progress"}), (TextProtocol, set())):
        for f in fields(cls):
            if f.name not in own:
                assert FLAGS[f.name].lstrip("-").replace("-", "_") in offered, f.name


@pytest.mark.parametrize(
    "flags, expected",
    [
        (
            ["--epochs", "7", "--weight-decay", "0.5", "--lr", "0.01"],
            dict(max_epochs=7, weight_decay_other=0.5, lr=0.01),
        ),
        (["--hogwild", "3", "--time-budget", "2m"], dict(hogwild=3, time_budget=120.0)),
        (["--sync-every", "64"], dict(sync_every=64)),
    ],
)
def test_given_flags_reach_their_settings(flags, expected):
    cfg = settings(TrainConfig, build_parser().parse_args(["train", "--out", "r", *flags]), device="cpu")
    assert {k: getattr(cfg, k) for k in expected} == expected
    assert replace(cfg, **{k: getattr(TrainConfig, k) for k in expected}) == TrainConfig()


def test_tree_refine_passes_every_flag_to_its_config(tmp_path, monkeypatch, capsys):
    made = []

    class Recorded(RefineConfig):
        def __post_init__(self):
            made.append(self)
            super().__post_init__()

    monkeypatch.setattr(hlbl.refine, "RefineConfig", Recorded)
    flags = ["--sigmas", "0.5", "--into-class", "3", "--candidates", "2", "--per-word", "9", "--max-moves", "0.2"]
    # no run there: the command stops at its one-line error, after building its settings
    assert main(["tree", "refine", "--from", str(tmp_path / "none"), "--out", str(tmp_path / "c.json"), *flags]) == 2
    assert "hlbl: error:" in capsys.readouterr().err
    (cfg,) = made
    assert (cfg.sigmas, cfg.into_class, cfg.candidates, cfg.per_word, cfg.max_moves) == (0.5, 3, 2, 9, 0.2)


def test_no_command_reaches_into_argparse_internals():
    used = [
        f"{p.relative_to(SRC)}:{i}"
        for p in sorted((SRC / "cli").glob("*.py"))
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if "._actions" in line or "._option_string_actions" in line or "__class__ =" in line
    ]
    assert not used


def test_sync_every_auto_grows_with_the_vocabulary_and_a_number_is_kept():
    """auto: 256 steps at PTB's 10,000 words (where it was measured), 1,024 at 50,000 and above
    (measured faster at the same perplexity), a power of two in between; a number as given."""
    auto = TrainConfig()
    assert auto.sync_every == "auto"
    assert [auto.sync_steps(v) for v in (2, 10_000, 20_000, 50_000, 190_000)] == [256, 256, 512, 1024, 1024]
    assert TrainConfig(sync_every=64).sync_steps(190_000) == 64
    for bad in (0, "often", 2.5):
        with pytest.raises(ValueError, match="sync_every must be auto or at least 1"):
            TrainConfig(sync_every=bad)
    for bad in ("0", "often"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["train", "--out", "r", "--sync-every", bad])
