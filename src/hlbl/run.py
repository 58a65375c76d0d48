"""The run directory: the one owner of how a training run is started, committed, found and resumed.

A run directory holds::

    run.json             format, version, model config, training config, corpus spec (the recipe)
    vocab.json           words and training counts
    tree.json            the word tree (tree output), or the word classes (classes output)
    checkpoints/epoch-NNNNNN/   the newest complete checkpoint (what a resume continues from):
        optimizer.safetensors, last.safetensors, best.safetensors, metrics.jsonl, state.json
    best.safetensors     weights with the best validation perplexity so far  } copies of the newest
    last.safetensors     weights after the last finished epoch               } checkpoint's files,
    state.json           epoch, phase, learning rate, best perplexity, ...   } for readers (eval,
    metrics.jsonl        one JSON line per finished epoch                    } predict, ...)
    report.json          the final report of `hlbl train` (valid and test perplexity of the best
                         weights), written when a training call ends; read by serve's /v1/model

``run.json`` is written last of the first three, before training starts, and is the recipe a
resume uses. A checkpoint is one atomic commit: its files are written and flushed (fsync) in a
fresh ``checkpoints/.partial-*`` directory, which is synced and then renamed to
``checkpoints/epoch-NNNNNN``; a crash at any point (kill -9, power loss) leaves either the new
checkpoint whole or none of it, and the previous one is removed only after the new one is durable.
Leftovers of an interrupted write are removed at resume. The top-level copies are replaced one by
one after the commit (hard links for the weights); resume never reads them. The file formats
themselves (safetensors with a checksum, checked JSON) are :mod:`hlbl.checkpoint`'s.

:class:`Run` is the public handle: ``Run(path).load_model()`` for a trained model,
``Run.resume(path)`` to continue a run exactly as ``hlbl train --resume`` does.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

from . import atomic
from .checkpoint import (
    FORMAT_VERSION,
    STATE_FORMAT,
    check_dataclass_fields,
    check_epoch,
    check_field,
    load_arrays,
    load_tensors_and_meta,
    load_weights,
    optimizer_tensors,
    read_json,
    read_metrics,
    read_state,
    restore_optimizer,
    vocab_fingerprint,
    weights_meta,
    write_error,
    write_json,
    write_tensors,
    write_weights,
)
from .classes import WordClasses
from .config import LBLConfig, TrainConfig, check_model_memory, takes_structure, takes_tree
from .data import (
    Corpus,
    DataError,
    TextProtocol,
    Vocab,
    epoch_span,
    load_corpus,
    resolve_corpus,
    stream_fingerprint,
)
from .errors import CheckpointError, ConfigError, TreeError
from .schedule import Schedule, TrainState
from .tree import WordTree

if TYPE_CHECKING:  # torch and the training modules are imported where a model is built or trained:
    import torch  # reading a run's record and its numpy model (hlbl.numpy_model) needs neither

    from .model import LBL
    from .numpy_model import NumpyLBL

RUN_FORMAT = "hlbl-run"
# 2: the corpus, the text protocol and the options as sections, every field written (1: read by
# :func:`_upgrade_v1`).
RUN_VERSION = 2
# Training settings added after version 2 was first written, each with the value every run
# written before it trained with (absent from its run.json, they mean that).
TRAIN_ADDED_IN_V2 = {"word_rate_power": 0.0, "word_rate_cap": 10.0, "sync_overlap": False}
CHECKPOINTS = "checkpoints"
PARTIAL = ".partial-"
PUBLISHED = ("best.safetensors", "last.safetensors", "metrics.jsonl", "state.json")
RUN_FILES = ("run.json", "vocab.json", "tree.json", "metrics.jsonl")
REPORT = "report.json"  # the final report of `hlbl train` (valid and test perplexity of the best weights)
_COMMITTED = re.compile(r"epoch-(\d{6,})")
# Temporary files of atomic writes (hlbl.atomic: NAME.RANDOM.tmp) of the files a run directory holds.
_TEMPORARY = re.compile(r"(run|vocab|tree|state|metrics|best|last|optimizer|report)\.(json|jsonl|safetensors)\..+\.tmp")


@dataclass(frozen=True)
class CorpusRef:
    """Where a run's corpus is, and which text it was: ``spec`` as ``--data`` named it (a name is
    looked up again on each machine, :func:`hlbl.data.corpus_record`), ``path`` the directory
    it was read from (None: not known), ``sha256`` the fingerprints of the train and valid streams
    (:func:`hlbl.data.stream_fingerprint`): paths may move, the text is what must match."""

    spec: str
    path: str | None
    sha256: dict[str, str]

    def directory(self) -> Path:
        """The corpus directory, found as ``train`` found it: by the recorded name or path, else
        in the directory where the run found it."""
        return resolve_corpus(self.spec, recorded=self.path)

    def to_json(self) -> dict:
        return {"spec": self.spec, "path": self.path, "sha256": dict(self.sha256)}


@dataclass(frozen=True)
class RunOptions:
    """Settings that shaped the output layer's structure and the start, recorded so that a resume
    can refuse flags that contradict them: ``tree`` (tree or classes output: ``--tree`` as given,
    or its default; None for other outputs), ``init_from`` (the run a warm start took its weights
    from, or None) and ``keep_output`` (whether that warm start kept the output layer)."""

    tree: str | None = None
    init_from: str | None = None
    keep_output: bool = False

    def to_json(self) -> dict:
        return {"tree": self.tree, "init_from": self.init_from, "keep_output": self.keep_output}


@dataclass(frozen=True)
class RunRecord:
    """run.json as one checked, typed value: the model, the training recipe, the corpus, the text
    protocol and the options. Every field is required (:func:`parse_record`)."""

    model: LBLConfig
    train: TrainConfig
    corpus: CorpusRef
    text: TextProtocol
    options: RunOptions

    def to_json(self) -> dict:
        return {
            "format": RUN_FORMAT,
            "version": RUN_VERSION,
            "model": self.model.to_json(),
            "train": self.train.to_json(),
            "corpus": self.corpus.to_json(),
            "text": self.text.to_json(),
            "options": self.options.to_json(),
        }


class Run:
    """A run directory (module docstring): the one way to its recipe, corpus, text protocol and
    files. ``Run(path)`` needs nothing but the path (a run being started); :meth:`open` reads and
    checks run.json at once. Training goes through :func:`fit`, which holds the directory and
    calls :meth:`start`, :meth:`restore` and :meth:`commit`; :meth:`resume` continues a run."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._record: RunRecord | None = None
        self._recipe: tuple[Vocab, WordTree | WordClasses | None] | None = None

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r})"

    @classmethod
    def open(cls, path: str | os.PathLike) -> "Run":
        """The run in ``path``, its run.json read and checked (one-line CheckpointError otherwise)."""
        run = cls(path)
        run.record  # noqa: B018 (read now: a bad run.json is an error here, not at first use)
        return run

    # ---- reading ------------------------------------------------------------------------------

    @property
    def record(self) -> RunRecord:
        """run.json, checked field by field (read once)."""
        if self._record is None:
            self._record = read_run(self.path)
        return self._record

    def has_record(self) -> bool:
        """Whether the directory holds a run description (run.json), whole or not."""
        return (self.path / "run.json").exists()

    @property
    def text(self) -> TextProtocol:
        """How the run's text was read (:class:`~hlbl.data.TextProtocol`)."""
        return self.record.text

    def recipe(self) -> tuple[LBLConfig, Vocab, WordTree | WordClasses | None]:
        """What the run is, without weights: model config, vocabulary and tree (or classes)."""
        if self._recipe is None:
            self._recipe = _load_recipe(self.path, self.record)
        return (self.record.model, *self._recipe)

    @property
    def vocab(self) -> Vocab:
        return self.recipe()[1]

    def train_config(self, **overrides) -> TrainConfig:
        """The run's training recipe, with ``overrides`` (of :attr:`TrainConfig.RUNTIME` only)."""
        bad = sorted(set(overrides) - set(TrainConfig.RUNTIME))
        if bad:
            raise ConfigError(
                bad[0],
                f"{bad[0]} is part of the run's recipe; a resume may change only {', '.join(TrainConfig.RUNTIME)}",
            )
        return replace(self.record.train, **overrides)  # (validated again)

    def model(self, which: str = "best", device: str | torch.device = "cpu") -> LBL:
        """The run's model with its ``best`` or ``last`` weights."""
        from .model import LBL

        config, vocab, tree = self.recipe()
        try:
            model = LBL(config, tree, init=False)  # every weight comes from the file
        except (ConfigError, TreeError, ValueError) as e:  # e.g. a tree over another vocabulary
            raise CheckpointError(f"{self.path}: {e}") from None
        load_weights(self.path / f"{which}.safetensors", model, vocab=vocab)
        return model.to(device)

    def numpy_model(self, which: str = "best") -> NumpyLBL | None:
        """The run's ``best`` or ``last`` weights as a :class:`~hlbl.numpy_model.NumpyLBL` (read
        without torch, with the checks of :meth:`model`), or None for a run of a kind it does not
        hold (:func:`hlbl.numpy_model.unsupported`): use :meth:`model` then."""
        from .numpy_model import NumpyLBL, unsupported

        config, vocab, tree = self.recipe()
        if unsupported(config) is not None:
            return None
        path = self.path / f"{which}.safetensors"
        arrays = load_arrays(path, NumpyLBL.layout(config, tree), weights_meta(config.vocab_size, tree, vocab))
        try:
            return NumpyLBL.from_state(config, tree, arrays)
        except ValueError as e:  # another tree's weights
            raise CheckpointError(f"{path}: {e}") from None

    def load_model(self, which: str = "best", device: str | torch.device = "cpu") -> tuple[LBL, Vocab, RunRecord]:
        """The model of the run (``best`` or ``last`` weights), its vocabulary and record."""
        return self.model(which, device), self.vocab, self.record

    def corpus(
        self,
        splits: Sequence[str] | None = None,
        data: str | os.PathLike | None = None,
        blank_lines: str | None = None,
    ) -> Corpus:
        """The run's corpus (``data``: another directory or name instead) encoded with the run's
        vocabulary and read by its text protocol (``blank_lines``: another blank-line rule);
        ``splits``: default train, valid and test where the corpus has one."""
        data = data if data is not None else self.record.corpus.directory()
        if splits is None:
            splits = ("train", "valid") + (("test",) if (resolve_corpus(data) / "test.txt").exists() else ())
        return load_corpus(data, vocab=self.vocab, splits=splits, text=self.text.reading(blank_lines))

    def metrics(self, lenient: bool = False) -> list[dict]:
        """metrics.jsonl's epochs, checked (``lenient``: a log for display; an unreadable line is
        skipped and a missing log is empty, not an error)."""
        path = self.path / "metrics.jsonl"
        if not lenient:
            return read_metrics(path)
        if not path.is_file():
            return []
        out = []
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                out.append(obj)
        return out

    def write_report(self, report: dict) -> None:
        """Keep the final report of a finished training call (the JSON line ``hlbl train`` prints:
        valid and test perplexity of the best weights, the test split's counts) beside the run,
        replaced whole by the next report (a resumed run reports again)."""
        atomic.write_text(self.path / REPORT, json.dumps(report, indent=1) + "\n")

    def report(self) -> dict | None:
        """The last final report (:meth:`write_report`), or None where training has not reported
        (still training, or a run started from Python); a damaged report is a one-line error."""
        path = self.path / REPORT
        if not path.exists():
            return None
        obj = read_json(path, "final report")
        if not isinstance(obj, dict):
            raise CheckpointError(f"{path}: not a final report (a JSON object)")
        return obj

    def latest(self) -> Path | None:
        """The newest complete checkpoint's directory, or None."""
        found = committed_checkpoints(self.path)
        return found[-1][1] if found else None

    def state(self) -> TrainState | None:
        """The newest complete checkpoint's training state, or None before the first epoch ends."""
        found = self.latest()
        return None if found is None else state_from_json(read_state(found / "state.json"))

    def resume_point(self) -> Path | None:
        """The checkpoint a resume continues from (None: the run starts again from its own seed);
        refuses a run that has trained but has no complete checkpoint left, whose weights and
        metrics a new start would replace."""
        found = self.latest()
        if found is None and self.is_trained():
            raise CheckpointError(
                f"{self.path} has trained (its weights, state or metrics are there) but has no complete "
                f"checkpoint in {CHECKPOINTS}/ to resume from; training it again from the start would replace "
                "them: choose a new run directory"
            )
        return found

    def is_trained(self) -> bool:
        """Whether the run has trained: a complete checkpoint, any trained weights (``best`` or
        ``last``), a state.json, or a metrics log with an epoch in it. Such a directory is never
        started again from scratch, whatever else of it is gone."""
        if self.latest() is not None:
            return True
        if any((self.path / name).exists() for name in ("best.safetensors", "last.safetensors", "state.json")):
            return True
        try:
            return bool((self.path / "metrics.jsonl").read_bytes().strip())
        except OSError:
            return False

    def is_unstarted(self) -> bool:
        """True for a directory that is missing, empty, or holds only what a start stopped before
        writing run.json leaves (its own files and their temporary copies)."""
        try:
            names = [p.name for p in self.path.iterdir()]
        except FileNotFoundError:
            return True
        except NotADirectoryError:
            return False
        return all(n in RUN_FILES and n != "run.json" or _TEMPORARY.fullmatch(n) for n in names)

    # ---- training -----------------------------------------------------------------------------

    @contextmanager
    def hold(self) -> Iterator[None]:
        """Hold the directory (created if missing) for the block: a second training into it, in
        this or another process, is refused at once rather than interleaving checkpoints."""
        try:
            with atomic.exclusive_directory(self.path, "another training process"):
                yield
        except BlockingIOError as e:
            raise DataError(str(e)) from None
        except OSError as e:
            if e.filename is None and not isinstance(e, FileNotFoundError):
                raise
            raise DataError(f"cannot create the run directory {self.path}: {e.strerror or e}") from None

    def check_writable(self, resume: bool) -> None:
        """Refuse what a training must never write into, checked while the directory is held: a
        file; a directory holding something other than a run (for a resume) or anything at all
        (for a new run), so that two trainings started into one new directory cannot both write it."""
        if self.path.exists() and not self.path.is_dir():
            raise DataError(f"{self.path} is a file, not a run directory")
        if resume:
            if not (self.path / "run.json").exists() and not self.is_unstarted():
                raise DataError(
                    f"{self.path} is not an hlbl run (it has no run.json) and is not empty: a resume writes "
                    "only into the run it continues; choose another run directory"
                )
        elif self.path.exists() and any(self.path.iterdir()):
            raise DataError(f"{self.path} is not empty; choose a new run directory, resume it, or delete it")

    def check_recipe(self, model: LBL, vocab: Vocab, cfg: TrainConfig) -> None:
        """A resume continues a run with the run's own recipe: refuse a model, vocabulary, tree or
        training setting that differs from run.json (apart from :attr:`TrainConfig.RUNTIME`)."""
        config, own_vocab, tree = self.recipe()
        own = self.record.train
        diffs = [
            f"model {k} {v!r} (the run's is {config.to_json()[k]!r})"
            for k, v in model.config.to_json().items()
            if config.to_json().get(k) != v
        ]
        diffs += own.differences(cfg)
        if vocab_fingerprint(own_vocab) != vocab_fingerprint(vocab):
            diffs.append("another vocabulary than vocab.json")
        mine = model.structure  # a word tree, word classes, or None
        if (tree is None) != (mine is None) or (tree is not None and tree.fingerprint() != mine.fingerprint()):
            diffs.append("another word tree than tree.json")
        if diffs:
            raise CheckpointError(
                f"{self.path} is a run of another recipe: {'; '.join(diffs)}. A resume continues a run with its own recipe"
            )

    def start(self, model: LBL, corpus: Corpus, cfg: TrainConfig, corpus_spec: str, options: RunOptions) -> None:
        """Write a new run's files: vocab.json, tree.json, then run.json (a directory with run.json
        holds a whole run description), and an empty metrics log."""
        ref = CorpusRef(
            corpus_spec,
            str(corpus.root.resolve()) if corpus.root is not None else None,
            {s: stream_fingerprint(corpus[s]) for s in ("train", "valid")},
        )
        record = RunRecord(model.config, cfg, ref, corpus.text, options)
        save_run_files(self.path, model, corpus.vocab, record)
        self._record = record
        atomic.write_text(self.path / "metrics.jsonl", "")
        (self.path / REPORT).unlink(missing_ok=True)  # a report of an earlier start describes other weights

    def restore(
        self, found: Path, model: LBL, cfg: TrainConfig, vocab: Vocab, log: Callable[[str], None]
    ) -> tuple[TrainState, torch.optim.Optimizer, list[str]]:
        """The state, weights, optimiser and metrics lines of the complete checkpoint ``found``
        (every rank reads them); rank 0 then republishes its files, which a crash may have
        stopped half-way, and drops older checkpoints."""
        from . import distributed as ddp
        from .optim import make_optimizer

        state = state_from_json(read_state(found / "state.json"))
        load_weights(found / "last.safetensors", model, epoch=state.epoch, vocab=vocab)
        tensors, meta = load_tensors_and_meta(found / "optimizer.safetensors", kind="hlbl-optimizer")
        check_epoch(found / "optimizer.safetensors", meta, state.epoch)
        optimizer = make_optimizer(model, cfg, state.lr)
        restore_optimizer(optimizer, tensors, read_state(found / "state.json")["optimizer"])
        lines = read_metrics(found / "metrics.jsonl")
        if len(lines) != state.epoch:
            raise CheckpointError(
                f"{found / 'metrics.jsonl'}: {len(lines)} lines, its state.json ends epoch {state.epoch}"
            )
        metrics = (found / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
        if ddp.rank() == 0:
            _report_metrics_dropped(self.path / "metrics.jsonl", metrics, log)
            publish(self.path, found)
            prune_checkpoints(self.path, found)
        return state, optimizer, metrics

    def restart(self, log: Callable[[str], None]) -> None:
        """A run with no complete checkpoint trains from the start with its own recipe: its
        metrics log is emptied (saying what it drops)."""
        _report_metrics_dropped(self.path / "metrics.jsonl", [], log)
        atomic.write_text(self.path / "metrics.jsonl", "")

    def commit(
        self,
        model: LBL,
        optimizer: torch.optim.Optimizer,
        state: TrainState,
        vocab: Vocab,
        metrics: list[str],
        best: Path | None,
    ) -> Path:
        """The end-of-epoch checkpoint, one atomic commit (:func:`commit_checkpoint`): optimiser,
        last weights, best weights (``best``: the previous checkpoint's file when this epoch did
        not improve, linked), the metrics log and the state; then the run directory's top-level
        copies, and the previous checkpoint removed. Ctrl-C or SIGTERM waits for all of it; kill
        -9 or a power cut at any point leaves the previous checkpoint or this one, whole."""
        tensors, opt_meta = optimizer_tensors(optimizer)
        epoch = state.epoch
        record = {"format": STATE_FORMAT, "version": FORMAT_VERSION, **state.to_json(), "optimizer": opt_meta}

        def text(content: str):
            return lambda path: path.write_text(content, encoding="utf-8")

        files = {
            "optimizer.safetensors": lambda path: write_tensors(
                path, tensors, kind="hlbl-optimizer", meta={"epoch": str(epoch)}
            ),
            "last.safetensors": lambda path: write_weights(path, model, epoch=epoch, vocab=vocab),
            "best.safetensors": best if best is not None else (lambda path: write_weights(path, model, vocab=vocab)),
            "metrics.jsonl": text("".join(x + "\n" for x in metrics)),
            "state.json": text(json.dumps(record, indent=1)),
        }
        with atomic.interrupts_deferred():
            found = commit_checkpoint(self.path, epoch, files)
            publish(self.path, found)
            prune_checkpoints(self.path, found)
        return found

    # ---- resuming -----------------------------------------------------------------------------

    def prepare_resume(
        self, data: str | os.PathLike | Corpus | None = None, splits: tuple[str, ...] | None = None, **runtime
    ) -> tuple[LBL, Corpus, TrainConfig]:
        """The run's own model (its seed's weights: :func:`fit` loads the checkpoint's), corpus
        and recipe, for :func:`fit` with ``resume=True``. ``data``: the corpus (default: the one
        run.json records; a directory, a name or a loaded :class:`Corpus`), which must be the same
        text; ``runtime``: settings of :attr:`TrainConfig.RUNTIME`; ``splits``: default train,
        valid and test where present. Refuses a run that has trained but has no checkpoint left."""
        import torch

        from .model import LBL
        from .warmstart import warm_start

        config, vocab, tree = self.recipe()
        found = self.resume_point()
        corpus = data if isinstance(data, Corpus) else self.corpus(splits, data)
        differs = data_fingerprints_differ(corpus, self.record.corpus)
        if differs:
            where = corpus.root if isinstance(data, Corpus) else data or self.record.corpus.directory()
            raise DataError(
                f"the {differs} split of {where} is not the one {self.path} was trained on "
                f"({self.record.corpus.spec}); resume with the same corpus"
            )
        cfg = self.train_config(**runtime)
        try:  # a checkpoint holds every weight; without one the run starts again from its own seed
            model = LBL(config, tree, torch.Generator().manual_seed(cfg.seed), init=found is None)
        except (ConfigError, TreeError, ValueError) as e:
            raise CheckpointError(f"{self.path}: {e}") from None
        if found is None:
            model.init_unigram(vocab.counts)
            options = self.record.options
            if options.init_from:  # a run stopped before its first checkpoint starts as it first did
                source = Run.open(options.init_from)
                warm_start(model, source.model(), source.vocab, corpus.vocab, keep_output=options.keep_output)
        return model, corpus, cfg

    @classmethod
    def resume(
        cls,
        path: str | os.PathLike,
        data: str | os.PathLike | Corpus | None = None,
        log: Callable[[str], None] | None = None,
        started: Callable[[LBL, Corpus, TrainConfig], None] | None = None,
        **runtime,
    ) -> TrainState:
        """Continue the run in ``path`` from its newest complete checkpoint (from its own seed when
        it has none) with its own model, vocabulary, tree and recipe, on its own corpus (``data``:
        the same text found elsewhere, or loaded); ``runtime``: settings of
        :attr:`TrainConfig.RUNTIME` (e.g. ``max_epochs=60`` to train longer). The one resume:
        ``hlbl train --resume`` (after its flag checks) and :mod:`hlbl.reproduce` call it; returns
        the final :class:`~hlbl.schedule.TrainState` (the model is not kept: load it with
        :meth:`model`). A run that has trained but lost its checkpoints is refused. ``started``, if
        given, sees the model, corpus and recipe before training (the CLI describes them; after
        the call the model holds the best weights)."""
        run = cls.open(path)
        model, corpus, cfg = run.prepare_resume(data, **runtime)
        if started is not None:
            started(model, corpus, cfg)
        return fit(model, corpus, cfg, run.path, resume=True, corpus_spec=run.record.corpus.spec, log=log)


def state_from_json(obj: dict) -> TrainState:
    """A checked state.json (:func:`hlbl.checkpoint.read_state`) as a :class:`TrainState`."""
    return TrainState(**{k: obj[k] for k in ("lr", "epoch", "phase", "best_valid_ppl", "done", "elapsed")})


def _report_metrics_dropped(path: Path, keep: list[str], log) -> None:
    """Say what of ``path`` the checkpoint's log replaces (nothing said when they agree)."""
    try:
        data = path.read_bytes()
    except OSError:
        return
    want = "".join(x + "\n" for x in keep).encode("utf-8")
    if data == want:
        return
    if data.startswith(want):
        extra = data[len(want) :].split(b"\n")
        torn = extra[-1] != b""
        whole = len([x for x in extra[:-1] if x.strip()])
        what = ([f"{whole} line(s) of epochs after the checkpoint"] if whole else []) + (
            ["a torn last line (cut off by a crash)"] if torn else []
        )
        log(f"note: {path}: dropped {' and '.join(what)}; those epochs are trained again")
    else:
        log(f"note: {path} differs from the checkpoint's log (edited, or damaged); replaced by the checkpoint's")


# ---- run files --------------------------------------------------------------------------------


def save_run_files(run_dir: Path, model: LBL, vocab: Vocab, record: RunRecord) -> None:
    """The files that do not change during training: vocab.json, tree.json, then run.json, last."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        write_json(run_dir / "vocab.json", vocab.to_json())
        if model.structure is not None:  # a word tree, or word classes (classes output)
            model.structure.save(run_dir / "tree.json")
        write_json(run_dir / "run.json", record.to_json())
    except OSError as e:
        raise CheckpointError(f"cannot write the run files in {run_dir}: {write_error(e)}") from None


def _upgrade_v1(info: dict) -> dict:
    """A version-1 run.json in the version-2 layout. Version 1 kept the corpus in ``corpus``,
    ``corpus_path`` (optional) and ``data_sha256``, the blank-line rule in ``blank_lines`` (optional:
    ``drop`` before it was recorded), and the vocabulary cut beside the tree in ``options`` (absent
    for a run started from Python: its vocabulary was the caller's, no cut recorded)."""
    options = info.get("options") or {}
    model = info.get("model")
    if isinstance(model, dict) and "head" not in model:
        # the hybrid output's head size came after version 1; no version-1 run is a hybrid
        model = {**model, "head": 2000}
    return {
        **{k: info[k] for k in ("format", "train") if k in info},
        **({"model": model} if model is not None else {}),
        "version": RUN_VERSION,
        "corpus": {"spec": info.get("corpus"), "path": info.get("corpus_path"), "sha256": info.get("data_sha256")},
        "text": {
            "blank_lines": info.get("blank_lines", "drop"),
            "max_vocab": options.get("max_vocab"),
            "min_count": options.get("min_count", "auto"),
        },
        "options": {
            "tree": options.get("tree"),
            "init_from": options.get("init_from"),
            "keep_output": bool(options.get("keep_output", False)),
        },
    }


def read_run(run_dir: str | os.PathLike) -> RunRecord:
    """run.json of ``run_dir``, checked field by field: every field required."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CheckpointError(f"{run_dir}: not a run directory")
    path = run_dir / "run.json"
    info = read_json(path, "run description")
    if not isinstance(info, dict) or info.get("format") != RUN_FORMAT:
        raise CheckpointError(f"{path}: not an hlbl run description")
    if info.get("version") == 1:
        info = _upgrade_v1(info)
    if info.get("version") != RUN_VERSION:
        raise CheckpointError(f"{run_dir}: run format version {info.get('version')} is not supported")
    if isinstance(info.get("train"), dict):  # settings added within version 2, as runs before them trained
        info = {**info, "train": {**TRAIN_ADDED_IN_V2, **info["train"]}}
    return parse_record(info, path)


def parse_record(info: dict, path: Path) -> RunRecord:
    """A version-2 run description as a :class:`RunRecord`; one-line CheckpointError naming the
    field at fault, a missing one included."""
    sections = {"model": "dict", "train": "dict", "corpus": "dict", "text": "dict", "options": "dict"}
    for key, kind in sections.items():
        if key not in info:
            raise CheckpointError(f"{path}: damaged run description (no {key!r})")
        check_field(path, key, info[key], kind)
    check_dataclass_fields(path, "model", info["model"], LBLConfig)
    check_dataclass_fields(path, "train", info["train"], TrainConfig)
    corpus, options = info["corpus"], info["options"]
    for section, obj, kinds in (
        ("corpus", corpus, {"spec": "str", "path": "str | None", "sha256": "dict"}),
        ("options", options, {"tree": "str | None", "init_from": "str | None", "keep_output": "bool"}),
    ):
        for key, kind in kinds.items():
            if key not in obj:
                raise CheckpointError(f"{path}: damaged run description (no {section}.{key})")
            check_field(path, f"{section}.{key}", obj[key], kind)
    for split, digest in corpus["sha256"].items():
        check_field(path, f"corpus.sha256.{split}", digest, "str")
    try:
        model = LBLConfig.from_json(info["model"])
        check_model_memory(model)  # a damaged or foreign run.json must not reach torch's allocator
    except ConfigError as e:
        raise CheckpointError(f"{path}: bad model config ({e})") from None
    try:
        train = TrainConfig.from_json(info["train"])
    except ConfigError as e:
        raise CheckpointError(f"{path}: bad training config ({e})") from None
    try:
        text = TextProtocol.from_json(info["text"], f"{path}: text")
    except DataError as e:
        raise CheckpointError(str(e)) from None
    return RunRecord(
        model,
        train,
        CorpusRef(corpus["spec"], corpus["path"], dict(corpus["sha256"])),
        text,
        RunOptions(options["tree"], options["init_from"], options["keep_output"]),
    )


def read_vocab(run_dir: str | os.PathLike) -> Vocab:
    """A run's vocabulary (``vocab.json``), with errors that name the file."""
    path = Path(run_dir) / "vocab.json"
    try:
        return Vocab.from_json(read_json(path, "vocabulary"))
    except DataError as e:
        raise CheckpointError(f"{path}: {e}") from None


def _load_recipe(run_dir: Path, record: RunRecord) -> tuple[Vocab, WordTree | WordClasses | None]:
    """A run's vocabulary and tree (or word classes), checked against its record."""
    config = record.model
    vocab = read_vocab(run_dir)
    if len(vocab) != config.vocab_size:
        raise CheckpointError(f"{run_dir / 'vocab.json'}: {len(vocab)} words, the model {config.vocab_size}")
    tree = None
    if takes_structure(config.output):
        try:
            if takes_tree(config.output):
                tree = WordTree.load(run_dir / "tree.json")
            else:
                tree = WordClasses.load(run_dir / "tree.json")
        except TreeError as e:
            raise CheckpointError(str(e)) from None
    return vocab, tree


def load_model(
    run_dir: str | os.PathLike, which: str = "best", device: str | torch.device = "cpu"
) -> tuple[LBL, Vocab, RunRecord]:
    """The model of a run (``best`` or ``last`` weights), its vocabulary and record (:meth:`Run.load_model`)."""
    return Run.open(run_dir).load_model(which, device)


def data_fingerprints_differ(corpus: Corpus, ref: CorpusRef) -> str | None:
    """Which split of ``corpus`` is not the text the run was trained on (None: both match):
    paths may move, the text is what must match."""
    return next((s for s in ("train", "valid") if stream_fingerprint(corpus[s]) != ref.sha256.get(s)), None)


# ---- checkpoints: one directory per epoch, committed by a rename --------------------------------


def committed_checkpoints(run_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """The complete checkpoints of a run, oldest first, as (epoch, directory)."""
    root = Path(run_dir) / CHECKPOINTS
    try:
        entries = list(root.iterdir())
    except FileNotFoundError:
        return []
    except OSError as e:
        raise CheckpointError(f"{root}: cannot read ({e.strerror or e})") from None
    # A committed name is only ever made by renaming a whole checkpoint, so one without its state
    # was emptied by hand (to free space): the older complete one is the run's newest.
    found = [
        (int(m.group(1)), p)
        for p in entries
        if (m := _COMMITTED.fullmatch(p.name)) and p.is_dir() and (p / "state.json").is_file()
    ]
    return sorted(found)


def remove_leftovers(run_dir: str | os.PathLike) -> list[str]:
    """Remove what interrupted writes left behind (partial checkpoint directories, temporary files
    of atomic writes); the names removed. Only a process that holds the run directory may call it."""
    run_dir = Path(run_dir)
    removed = []
    try:
        root = run_dir / CHECKPOINTS
        if root.is_dir():
            for p in sorted(root.iterdir()):
                if p.name.startswith(PARTIAL):
                    shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
                    removed.append(f"{CHECKPOINTS}/{p.name}")
            if removed:
                atomic.sync_dir(root)
        temporary = [p for p in sorted(run_dir.iterdir()) if _TEMPORARY.fullmatch(p.name) and p.is_file()]
        for p in temporary:
            p.unlink()
            removed.append(p.name)
        if temporary:
            atomic.sync_dir(run_dir)
    except OSError as e:
        raise CheckpointError(
            f"{run_dir}: cannot remove the leftovers of an interrupted write ({e.strerror or e})"
        ) from None
    return removed


def prune_checkpoints(run_dir: str | os.PathLike, keep: Path) -> None:
    """Remove every complete checkpoint but ``keep`` (once ``keep`` is durable)."""
    root = Path(run_dir) / CHECKPOINTS  # every epoch-N but ``keep``, complete or emptied by hand
    old = [p for p in sorted(root.iterdir()) if _COMMITTED.fullmatch(p.name) and p.is_dir() and p != keep]
    for p in old:
        # Renamed away first, so that a crash half-way through the removal leaves a partial
        # directory (removed at resume), never a committed name with files missing.
        gone = p.with_name(f"{PARTIAL}old-{p.name}")
        os.rename(p, gone)
        atomic.fault_point(f"retire {p}")
        shutil.rmtree(gone)
        atomic.fault_point(f"remove {gone}")
    if old:
        atomic.sync_dir(Path(run_dir) / CHECKPOINTS)


def _link_or_copy(src: Path, dest: Path) -> None:
    """``dest`` a new name of ``src``'s bytes: a hard link (no copy of the weights), or a flushed copy
    where the filesystem has none. Files of a committed checkpoint are never modified in place."""
    try:
        os.link(src, dest)
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.EXDEV, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
        shutil.copyfile(src, dest)
        atomic.fsync_path(dest)


def commit_checkpoint(run_dir: str | os.PathLike, epoch: int, files: dict[str, Callable[[Path], None] | Path]) -> Path:
    """Write the checkpoint of ``epoch`` as one atomic commit; returns its directory.

    ``files``: name -> a function that writes that file at the path it is given, or an existing
    file (of the previous checkpoint) to link. Each file is flushed, the new directory synced, then
    renamed to ``checkpoints/epoch-NNNNNN`` and the rename synced. A failed write (disk full, a
    file-size limit) removes the partial directory and raises CheckpointError; the previous
    checkpoint is untouched either way."""
    root = Path(run_dir) / CHECKPOINTS
    final = root / f"epoch-{int(epoch):06d}"
    partial = root / f"{PARTIAL}{final.name}-{os.getpid()}"
    try:
        if not root.is_dir():
            root.mkdir()
            atomic.fault_point(f"mkdir {root}")
            atomic.sync_dir(root.parent)
        if partial.exists():
            shutil.rmtree(partial)
        partial.mkdir()
        atomic.fault_point(f"mkdir {partial}")
        for name, source in files.items():
            _write_member(partial / name, source)
        atomic.sync_dir(partial)
        atomic.fault_point(f"fsync {partial}")
        if final.exists():  # an epoch written before by a run that was then resumed from an older checkpoint
            shutil.rmtree(final)
        os.rename(partial, final)
        atomic.fault_point(f"commit {final}")
        atomic.sync_dir(root)
        atomic.fault_point(f"fsync {root}")
    except BaseException as e:
        if partial.exists():
            shutil.rmtree(partial, ignore_errors=True)
        if isinstance(e, OSError) or type(e).__name__ == "SafetensorError":
            raise CheckpointError(
                f"cannot write the checkpoint of epoch {epoch} in {root}: "
                f"{write_error(e)}{_named(e)}; the previous checkpoint is kept"
            ) from None
        raise
    return final


def _write_member(path: Path, source: Callable[[Path], None] | Path) -> None:
    """One file of a checkpoint being written: linked from the previous checkpoint, or written and flushed."""
    if isinstance(source, Path):
        _link_or_copy(source, path)
    else:
        source(path)
        os.chmod(path, atomic.plain_mode())  # (safetensors creates its files 0600)
        atomic.fsync_path(path)
    atomic.fault_point(f"write {path}")


def _named(e: BaseException) -> str:
    return f" ({e.filename})" if isinstance(e, OSError) and e.filename else ""


def publish(run_dir: str | os.PathLike, checkpoint: Path, names: tuple[str, ...] = PUBLISHED) -> None:
    """Replace the run directory's top-level copies of ``names`` with ``checkpoint``'s, each
    atomically (the weights as hard links). Readers (eval, predict) see whole files; resume never
    reads these."""
    run_dir = Path(run_dir)
    try:
        for name in names:
            src, dest = checkpoint / name, run_dir / name
            if dest.exists() and os.path.samefile(src, dest):
                continue  # already linked (and rename() between two links of one file does nothing)
            tmp = run_dir / f"{name}.{os.getpid()}-publish.tmp"
            if tmp.exists():
                tmp.unlink()
            if name.endswith(".safetensors"):
                _link_or_copy(src, tmp)
            else:  # small, and a copy: editing the top-level file in place cannot touch the checkpoint
                shutil.copyfile(src, tmp)
                atomic.fsync_path(tmp)
            atomic.fault_point(f"write {tmp}")
            os.replace(tmp, dest)
            atomic.fault_point(f"rename {dest}")
        atomic.sync_dir(run_dir)
        atomic.fault_point(f"fsync {run_dir}")
    except OSError as e:
        raise CheckpointError(
            f"cannot update the files of {run_dir}: {write_error(e)}{_named(e)} (the checkpoint "
            f"{checkpoint} is complete: a resume continues from it)"
        ) from None


# ---- fit: set a run up once, then the loop ------------------------------------------------------


def fit(
    model: LBL,
    corpus: Corpus,
    cfg: TrainConfig,
    run_dir: str | os.PathLike,
    resume: bool = False,
    corpus_spec: str = "",
    log: Callable[[str], None] | None = None,
    options: RunOptions | None = None,
) -> TrainState:
    """Train with early stopping; checkpoint each epoch into ``run_dir``. Returns the final state.

    ``resume``: continue the run in ``run_dir`` from its newest complete checkpoint (from the
    start when it has none); ``model`` and ``cfg`` must be the run's own (run.json), apart from
    :attr:`TrainConfig.RUNTIME` (:meth:`Run.prepare_resume` builds them). Without ``resume`` the
    directory must be new or empty. ``options``: recorded in run.json (the vocabulary and tree
    settings). ``log`` receives one line per epoch and per learning-rate decision; by default they
    go to the ``hlbl.train`` logger at INFO level.

    Distributed (a process group of W > 1 ranks, :mod:`hlbl.distributed`): call it on every rank
    with the same model, corpus and config; only rank 0 logs and writes ``run_dir``, and every rank
    returns holding the best weights.
    """
    import torch

    from . import distributed as ddp
    from .engine import check_memory, choose_engine

    log = log or logging.getLogger("hlbl.train").info
    run = Run(run_dir)
    model.to(torch.device(cfg.device))  # (the engine's choice depends on where the parameters are)
    engine = choose_engine(model, cfg)  # before the directory exists: a refused engine leaves no run behind
    check_memory(model, cfg, len(corpus["train"]))
    if ddp.rank() != 0:  # only rank 0 writes the run directory
        return _fit(run, engine, model, corpus, cfg, resume, corpus_spec, lambda msg: None, options)
    with run.hold():  # the checks below hold for as long as this training writes the directory
        run.check_writable(resume)
        return _fit(run, engine, model, corpus, cfg, resume, corpus_spec, log, options)


def _fit(run: Run, engine, model, corpus, cfg, resume, corpus_spec, log, options) -> TrainState:
    from . import distributed as ddp
    from .train import Loop, train_loop

    train = corpus["train"][: cfg.max_train_tokens] if cfg.max_train_tokens else corpus["train"]
    valid = corpus["valid"]
    ddp.check_same_run(model, corpus.vocab, train, valid, cfg)
    state, optimizer, metrics, best = _start_or_resume(run, model, corpus, cfg, resume, corpus_spec, log, options)
    parts = epoch_span(len(train), 1, cfg.epoch_tokens, cfg.batch_size).parts
    loop = Loop(
        engine=engine,
        schedule=Schedule(cfg, parts),
        train=train,
        valid=valid,
        pad=corpus.vocab.eos,
        vocab=corpus.vocab,
        commit=partial(_commit, run, corpus.vocab) if ddp.rank() == 0 else None,
        log=log,
    )
    before = model.word_rate
    if cfg.word_rate_power > 0:
        from .optim import word_rates

        model.set_word_rates(word_rates(corpus.vocab.counts, cfg.word_rate_power, cfg.word_rate_cap))
    try:
        return train_loop(loop, model, cfg, state, optimizer, metrics, best)
    finally:
        model.word_rate = before


def _commit(run: Run, vocab: Vocab, model, optimizer, state, metrics, best) -> Path:
    return run.commit(model, optimizer, state, vocab, metrics, best)


def _start_or_resume(
    run: Run, model: LBL, corpus: Corpus, cfg: TrainConfig, resume: bool, corpus_spec: str, log, options
) -> tuple[TrainState, torch.optim.Optimizer, list[str], Path | None]:
    """A new run's files (rank 0 writes them), or a run's state, weights, optimiser and metrics
    from its newest complete checkpoint (every rank reads them); every rank then holds rank 0's
    parameters. Also returns the metrics lines so far and the checkpoint's best weights file."""
    from . import distributed as ddp
    from .optim import make_optimizer

    is_run = resume and run.has_record()
    found = None
    if is_run:
        run.check_recipe(model, corpus.vocab, cfg)
        found = run.resume_point()
    if ddp.rank() == 0 and (resume or not (run.path / CHECKPOINTS).exists()):
        removed = remove_leftovers(run.path)  # (also those of a start stopped before its run.json)
        if removed:
            log(f"removed the leftovers of an interrupted write: {', '.join(removed)}")
    ddp.agree(found is not None, cfg.device, f"{run.path}: only some processes see its checkpoint; resuming a "
              "distributed run needs the run directory on a filesystem that every process sees")  # fmt: skip
    state, optimizer, metrics = TrainState(lr=cfg.lr), make_optimizer(model, cfg, cfg.lr), []
    if found is not None:
        state, optimizer, metrics = run.restore(found, model, cfg, corpus.vocab, log)
        where = found.relative_to(run.path)
        log(
            f"resuming after epoch {state.epoch} from {where}, the newest complete checkpoint "
            f"(best valid perplexity {state.best_valid_ppl:.2f})"
        )
    elif is_run:
        log(f"{run.path} has no complete checkpoint: training from the start, with the run's own recipe")
        if ddp.rank() == 0:
            run.restart(log)
    elif ddp.rank() == 0:
        run.start(model, corpus, cfg, corpus_spec, options or RunOptions())
    ddp.broadcast_parameters(model)
    return state, optimizer, metrics, (found / "best.safetensors" if found is not None else None)
