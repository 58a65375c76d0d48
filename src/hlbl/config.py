"""What a run is made of: the model's settings (:class:`LBLConfig`) and the training recipe
(:class:`TrainConfig`), with the names of the choices they take; and the settings of the paper's
pipeline (:class:`ReproConfig`, run by :mod:`hlbl.reproduce`).

This module imports neither torch nor numpy, so that the command line can build its parsers (and
answer ``--help``) without loading them. Every bad value raises :class:`~hlbl.errors.ConfigError`
whose ``field`` is the setting at fault and whose message names it (first, for a bad value).
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, fields
from numbers import Integral
from typing import Any

from .errors import ConfigError

OUTPUT_KINDS = ("tree", "flat", "adaptive", "nce", "sampled", "classes", "hybrid")  # hlbl.output.make_output_layer
SAMPLED_KINDS = ("nce", "sampled")  # output layers trained by sampling (hlbl.output.sampled)
OPTIMIZERS = ("sgd", "momentum", "adam", "adagrad")
LR_SCHEDULES = ("auto", "two-rate", "halve")
ENGINES = ("torch", "fast", "auto")  # hlbl.engine.choose_engine
BLANK_LINES = ("drop", "keep")  # what a blank line of a corpus file is (hlbl.data.vocab); drop is the default
# One file split into a corpus by line (hlbl.data.split): the default fractions of valid and test lines, and seed.
SPLIT_VALID, SPLIT_TEST, SPLIT_SEED = 0.1, 0.1, 0
DEFAULT_EM_ITERS = 10  # hlbl.treebuild: EM iterations per split of a learned tree
DEFAULT_MAX_LEAVES_PER_WORD = 4  # hlbl.treebuild: a learned tree's leaf budget, in units of V


def takes_tree(kind: str) -> bool:
    """Whether output layers of this kind are built on a :class:`~hlbl.tree.WordTree` (saved as
    tree.json): ``tree``, and ``hybrid`` (the tree restricted to its tail words)."""
    return kind in ("tree", "hybrid")


def takes_structure(kind: str) -> bool:
    """Whether output layers of this kind are built on a structure saved as the run's tree.json: a
    :class:`~hlbl.tree.WordTree` (``tree``, ``hybrid``) or :class:`~hlbl.classes.WordClasses` (``classes``)."""
    return kind in ("tree", "hybrid", "classes")


def _is_int(v: Any) -> bool:
    return isinstance(v, Integral) and not isinstance(v, bool)


def _need(ok: bool, field: str, message: str) -> None:
    if not ok:
        raise ConfigError(field, f"{field} {message}")


def _from_json(cls, obj: Any, what: str):
    """``cls(**obj)`` for a JSON object of settings as :meth:`to_json` wrote them: every field is
    required (a missing one is never filled with today's default, which may not be the run's);
    ConfigError for unknown, missing or bad values."""
    if not isinstance(obj, dict):
        raise ConfigError(None, f"{what} settings must be a JSON object, not {type(obj).__name__}")
    unknown = sorted(set(obj) - {f.name for f in fields(cls)})
    if unknown:
        raise ConfigError(unknown[0], f"unknown {what} setting(s) {', '.join(unknown)}")
    missing = [f.name for f in fields(cls) if f.name not in obj]
    if missing:
        raise ConfigError(missing[0], f"{what} setting(s) {', '.join(missing)} missing")
    return cls(**obj)


@dataclass
class LBLConfig:
    vocab_size: int
    dim: int = 100
    context: int = 5  # n - 1 previous words
    full_context: bool = False  # full (d, d) C_i instead of diagonal
    output: str = "tree"  # one of OUTPUT_KINDS
    init_std: float = 0.1  # std of the Gaussian initialisation of non-bias weights
    samples: int = 25  # k noise words per training step (output "nce" / "sampled" only)
    noise_power: float = 1.0  # noise = unigram ** noise_power, renormalised ("nce" / "sampled" only)
    noise_share: int = 25  # examples per noise draw, 0 = the whole minibatch ("nce" / "sampled" only)
    head: int = 2000  # words 0..head-1 (the most frequent) in the exact softmax ("hybrid" only)

    def __post_init__(self):
        for name in (
            "vocab_size",
            "dim",
            "context",
            "samples",
            "head",
        ):  # 8.0 from a hand-edited run.json is not a size
            _need(_is_int(getattr(self, name)), name, f"must be an integer, not {getattr(self, name)!r}")
        _need(isinstance(self.full_context, bool), "full_context", f"must be true or false, not {self.full_context!r}")
        _need(self.vocab_size >= 2, "vocab_size", f"must be at least 2, got {self.vocab_size}")
        for name in ("dim", "context", "samples", "head"):
            _need(getattr(self, name) >= 1, name, f"must be at least 1, got {getattr(self, name)}")
        _need(
            self.output in OUTPUT_KINDS, "output", f"{self.output!r} is unknown; choose from {', '.join(OUTPUT_KINDS)}"
        )
        _need(
            isinstance(self.init_std, (int, float)) and 0 <= self.init_std < math.inf,
            "init_std",
            f"(the initial weights' standard deviation) must be >= 0, got {self.init_std}",
        )
        _need(
            _is_int(self.noise_share) and self.noise_share >= 0,
            "noise_share",
            f"must be an integer >= 0, got {self.noise_share!r}",
        )
        _need(
            isinstance(self.noise_power, (int, float)) and 0 <= self.noise_power < math.inf,
            "noise_power",
            f"must be >= 0, got {self.noise_power}",
        )

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict) -> "LBLConfig":
        return _from_json(cls, obj, "model")


@dataclass
class TrainConfig:
    """The training recipe (hlbl.train's module docstring); one run keeps it for life, apart from
    :attr:`RUNTIME`, the settings of how it is computed, which a resume may change."""

    lr: float = 1e-3
    lr_final: float = 3e-5
    # "two-rate" (the paper's), "halve", or "auto": two-rate where an epoch is a whole pass over
    # the split, halve where a long split is cut into several epochs (hlbl.schedule).
    lr_schedule: str = "auto"
    lr_decay: float = 0.5  # "halve": the factor applied to the rate at each decay
    lr_decays: int = 6  # "halve": decays before training stops (0.5**6 = 1/64 of lr at the end)
    lr_min_gain: float = 0.003  # "halve": a relative improvement smaller than this decays the rate
    batch_size: int = 1000
    max_epochs: int = 40
    # An epoch is at most this many training positions: a longer split is cut into several epochs
    # a pass (data.epoch_span), each ending in validation, a checkpoint and the schedule's
    # decision. 0: always the whole split.
    epoch_tokens: int = 10_000_000
    optimizer: str = "momentum"
    momentum: float = 0.9
    weight_decay_words: float = 1e-4
    weight_decay_other: float = 1e-5
    # Frequency-scaled rates of the context word vectors (R): row w's gradient is multiplied by
    # min(cap, (c_ref / c_w) ** power) for a word rarer than c_ref, the training count of the word
    # at the middle of the tokens (half the tokens are of words at least that frequent), and by 1
    # otherwise. 0: every row at the group's rate (the paper's recipe); hlbl.optim.word_rates.
    word_rate_power: float = 0.0
    word_rate_cap: float = 10.0
    seed: int = 0
    device: str = "cpu"
    max_train_tokens: int | None = None  # train on a prefix only (smoke tests, benchmarks)
    progress: bool = True
    engine: str = "auto"  # "fast" (hlbl.fast, CPU numba), "torch" (autograd), "auto": fast where it applies
    hogwild: int = 1  # fast engine threads; 1 is deterministic, more run lock-free (not reproducible)
    # Fast engine under torchrun: local steps of each process between two averagings of the rows
    # the processes touched (hlbl.sync.Sync; docs/distributed.md), or "auto": by the vocabulary
    # (sync_steps).
    sync_every: int | str = "auto"
    # Apply each round's averages one round late, so the exchange runs during the next round's
    # steps (hlbl.sync.DelayedSync): for slow links; two more copies of the model in memory.
    sync_overlap: bool = False
    # Seconds of training this call may spend: it stops at the first checkpoint after them (not
    # an early stop: a resume goes on). None: no budget.
    time_budget: float | None = None

    # How a run is computed, not what it learns: the only settings a resume may change.
    RUNTIME = ("max_epochs", "device", "progress", "engine", "hogwild", "sync_every", "sync_overlap", "time_budget")

    def sync_steps(self, vocab_size: int) -> int:
        """``sync_every`` as steps for a model of ``vocab_size`` words. ``auto``: 256 up to about
        14,000 words, then the power of two nearest 256 V / 10,000, at most 1,024. Why: a round's
        compute grows with its steps and its exchange with the rows touched, which grow with the
        vocabulary; so the round grows with it. Measured with 2 processes (docs/distributed.md):
        PTB (10,000 words) 1.70x one process at 256 steps, within 1% of its perplexity (1,024 bought
        nothing there); Gutenberg at 50,000 words 1.45x at 256 but 1.73x at 1,024, perplexity after
        a pass 0.2% from 256's. Longer rounds than 1,024 were not measured, hence the cap."""
        if self.sync_every != "auto":
            return int(self.sync_every)
        return int(min(1024, max(256, 256 * 2 ** round(math.log2(max(vocab_size, 1) / 10_000)))))

    def __post_init__(self):
        _need(
            self.optimizer in OPTIMIZERS,
            "optimizer",
            f"{self.optimizer!r} is unknown; choose from {', '.join(OPTIMIZERS)}",
        )
        _need(self.engine in ENGINES, "engine", f"{self.engine!r} is unknown; choose from {', '.join(ENGINES)}")
        _need(
            self.lr_schedule in LR_SCHEDULES,
            "lr_schedule",
            f"{self.lr_schedule!r} is unknown; choose from {', '.join(LR_SCHEDULES)}",
        )
        for name in ("hogwild", "batch_size", "max_epochs"):
            value = getattr(self, name)
            _need(_is_int(value) and value >= 1, name, f"must be at least 1, got {value!r}")
        every = self.sync_every
        _need(
            every == "auto" or (_is_int(every) and every >= 1),
            "sync_every",
            f"must be auto or at least 1, got {every!r}",
        )
        _need(isinstance(self.sync_overlap, bool), "sync_overlap", f"must be true or false, got {self.sync_overlap!r}")
        _need(_number(self.lr) and 0 < self.lr < math.inf, "lr", f"must be positive, got {self.lr}")
        _need(
            _number(self.lr_final) and 0 <= self.lr_final < math.inf, "lr_final", f"must be >= 0, got {self.lr_final}"
        )
        _need(_number(self.lr_decay) and 0 < self.lr_decay < 1, "lr_decay", f"{self.lr_decay} is not in (0, 1)")
        _need(
            _is_int(self.lr_decays) and self.lr_decays >= 0, "lr_decays", f"{self.lr_decays!r} is not an integer >= 0"
        )
        _need(
            _number(self.lr_min_gain) and 0 <= self.lr_min_gain < 1,
            "lr_min_gain",
            f"{self.lr_min_gain} is not in [0, 1)",
        )
        _need(_number(self.momentum) and 0 <= self.momentum < 1, "momentum", f"must be in [0, 1), got {self.momentum}")
        for name in ("weight_decay_words", "weight_decay_other"):
            value = getattr(self, name)
            _need(_number(value) and 0 <= value < math.inf, name, f"must be >= 0, got {value}")
        _need(
            _number(self.word_rate_power) and 0 <= self.word_rate_power <= 4,
            "word_rate_power",
            f"must be in [0, 4], got {self.word_rate_power}",
        )
        _need(
            _number(self.word_rate_cap) and 1 <= self.word_rate_cap <= 1e4,
            "word_rate_cap",
            f"must be in [1, 10000] (the largest multiple of a row's rate), got {self.word_rate_cap}",
        )
        _need(
            _is_int(self.epoch_tokens) and self.epoch_tokens >= 0,
            "epoch_tokens",
            f"{self.epoch_tokens!r} is not an integer >= 0 (0: the whole split)",
        )
        _need(
            self.max_train_tokens is None or (_is_int(self.max_train_tokens) and self.max_train_tokens >= 1),
            "max_train_tokens",
            f"must be at least 1, got {self.max_train_tokens!r}",
        )
        _need(
            self.time_budget is None or (_number(self.time_budget) and 0 < self.time_budget < math.inf),
            "time_budget",
            f"must be a positive number of seconds, got {self.time_budget!r}",
        )
        _need(_is_int(self.seed) and 0 <= self.seed < 2**63, "seed", f"must be in 0 .. 2^63-1, got {self.seed!r}")

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict, **overrides) -> "TrainConfig":
        """The config :meth:`to_json` saved in a run's run.json, with ``overrides`` applied."""
        if isinstance(obj, dict):
            obj = {**obj, **overrides}
        return _from_json(cls, obj, "training")

    def differences(self, other: "TrainConfig") -> list[str]:
        """The settings, other than :attr:`RUNTIME`, in which ``other`` differs from this recipe, in words."""
        mine, theirs = self.to_json(), other.to_json()
        return [
            f"training {k} {theirs[k]!r} (the run's is {mine[k]!r})"
            for k in mine
            if k not in self.RUNTIME and mine[k] != theirs[k]
        ]


# (name, policy or "random", copies): the paper's Table 1 trees, which hlbl.reproduce builds.
TREES = (
    ("T1", "random", 1),
    ("T2", "balanced", 1),
    ("T3", "adaptive", 1),
    ("T4", "adaptive:0.25", 1),
    ("T5", "adaptive:0.4", 1),
    ("T6", "adaptive:0.4", 2),
    ("T7", "adaptive:0.4", 4),
)


@dataclass
class ReproConfig:
    """The settings of :func:`hlbl.reproduce.reproduce`, the paper's Tables 1 and 3 on a corpus."""

    data: str = "ptb"
    out: str | None = None  # tables; default results/<corpus name> (runs/reproduce-<name>-quick/tables when quick)
    work: str | None = None  # checkpoints, features, trees; default runs/reproduce-<corpus name>[-quick]
    epochs: int = 40  # cap for every HLBL run, as TrainConfig.max_epochs (early stopping ends sooner)
    flat_epochs: int = 3  # cap for the flat LBL (an epoch costs O(V) per token, against O(log V) for HLBL)
    dim: int = 100
    context: int = 5
    seed: int = 0
    threads: int | None = None
    max_train_tokens: int | None = None
    max_eval_tokens: int | None = None  # evaluate on a prefix of valid/test (smoke tests only)
    max_vocab: int | None = None
    em_iters: int = DEFAULT_EM_ITERS
    kn_order: int = 5
    skip: tuple[str, ...] = ()  # step names to leave out: T2..T7, flat, KN5 (T1 feeds the trees)
    quick: bool = False
    command: str = ""  # the command line, for the table headers

    def __post_init__(self):
        if self.quick:
            self.max_train_tokens = self.max_train_tokens or 3000
            self.max_eval_tokens = self.max_eval_tokens or 5000
            self.max_vocab = self.max_vocab or 2000
            self.dim = min(self.dim, 16)
            self.epochs = min(self.epochs, 2)
            self.flat_epochs = min(self.flat_epochs, 1)
        _need(self.threads is None or self.threads >= 1, "threads", f"must be at least 1, got {self.threads}")
        _need(self.epochs >= 1, "epochs", f"must be at least 1, got {self.epochs}")
        _need(self.flat_epochs >= 0, "flat_epochs", f"must be at least 0, got {self.flat_epochs}")
        known = {t[0] for t in TREES[1:]} | {"flat", "KN5"}
        bad = sorted(set(self.skip) - known)
        _need(not bad, "skip", f"names unknown step(s) {', '.join(bad)} (known: {', '.join(sorted(known))})")


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_model_memory(config: LBLConfig, what: str = "the model") -> None:
    """Refuse a model whose parameters (with their gradients and optimiser buffers, about three
    copies) could not fit in this machine's memory, before torch is asked for them."""
    V, d, n = int(config.vocab_size), int(config.dim), int(config.context)
    params = 2 * V * d + V + n * d * (d if config.full_context else 1)
    need = 3 * 4 * params
    try:
        have = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return
    if need > have:
        raise ConfigError(
            "dim",
            f"{what} needs about {need / 2**30:,.0f} GiB ({params:,} parameters with their gradients "
            f"and optimiser state), more than this machine's {have / 2**30:,.0f} GiB; lower the feature size (dim)",
        )
