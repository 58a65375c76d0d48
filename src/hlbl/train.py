"""Training: minibatch gradient steps on the penalised log-likelihood, with early stopping.

Default recipe, after Mnih & Hinton (2008, appendix; 2007 for what 2008 leaves out):

* SGD on minibatches of 1000 contexts; the gradient is the *sum* over the minibatch, so
  the learning rate is per example (1e-3). We add momentum 0.9, which the paper does not
  mention: PTB is 15 times smaller than the paper's APNews data, and plain SGD at 1e-3 needs
  many more epochs on it (``--optimizer sgd`` gives the plain recipe);
* learning rate 1e-3 until validation perplexity rises, then the best weights so far are
  restored and training goes on at 3e-5 until it rises again; the best weights are kept
  (``lr_schedule="two-rate"``; the default where an epoch is a whole pass). ``lr_schedule="halve"`` is the gentler RNNLM-style
  option: whenever validation perplexity fails to improve by ``lr_min_gain`` (relative), the
  learning rate is multiplied by ``lr_decay`` (the best weights restored first when it rose),
  and training stops when that would happen for the ``lr_decays + 1``-th time;
  ``lr_schedule="auto"`` (the default) takes two-rate where an epoch is a whole pass over the
  training split (PTB and every corpus up to ``epoch_tokens`` = 10M positions) and halve where a
  longer split is cut into several epochs a pass: there the model is far from overfitting, and a
  rate halved on each stall keeps the run gaining, where two rates stop on the first small rise
  at 3e-5 (measured on Gutenberg in docs/scale.md; on PTB two-rate is the better one,
  docs/frontier.md);
* L2 penalty 1e-4 on word vectors, 1e-5 on other weights, none on biases, per example (the
  penalised objective is the mean over examples of NLL + penalty);
* non-bias weights from N(0, 0.1^2) (the context weights C_i around 1), node biases set so
  the untrained model predicts the unigram distribution.

Output layers trained by sampling (``nce``, ``sampled``; :mod:`hlbl.sampled_output`) minimise
their sampled loss with the same recipe; their ``train_loss`` in metrics.jsonl is that loss (its
``train_ppl`` is no perplexity), while the validation perplexity that drives early stopping is
always exact (full softmax).

``--optimizer sgd|adam|adagrad`` are options (the same per-example learning rate).
Data parallelism (``torchrun --nproc_per_node N -m hlbl train ... --engine torch``; see
:mod:`hlbl.distributed`): under a process group of W > 1 ranks every rank walks the same seeded
order in the same global minibatches, computes the summed loss of its contiguous 1/W shard of each,
and the gradients are summed over the ranks before every step, so the W processes take the
single-process steps (up to float rounding in the order of the sums). Training loss and words/s are
global; rank 0 evaluates the validation split and broadcasts the perplexity, so the early-stopping
and learning-rate decisions are the same on every rank; best weights are restored on every rank
(rank 0 reads its own file and broadcasts them); only rank 0 logs and writes files. The numba
engine stays single-process. No module-level state.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from . import atomic
from . import checkpoint as ckpt
from . import distributed as ddp
from .data import (
    Corpus,
    DataError,
    EpochOrder,
    EpochReader,
    contexts,
    corpus_meta,
    epoch_span,
    stream_fingerprint,
)
from .errors import ConfigError
from .evaluate import evaluate
from .model import LBL
from .progress import progress
from .sampled_output import noise_seed

logger = logging.getLogger(__name__)

OPTIMIZERS = ("sgd", "momentum", "adam", "adagrad")
LR_SCHEDULES = ("auto", "two-rate", "halve")
ENGINES = ("torch", "fast", "auto")  # see epoch_runner


@dataclass
class TrainConfig:
    lr: float = 1e-3
    lr_final: float = 3e-5
    # "two-rate" (the paper's), "halve", or "auto": two-rate where an epoch is a whole pass over
    # the split, halve where a long split is cut into several epochs (module docstring).
    lr_schedule: str = "auto"
    lr_decay: float = 0.5  # "halve": the factor applied to the rate at each decay
    lr_decays: int = 6  # "halve": decays before training stops (0.5**6 = 1/64 of lr at the end)
    lr_min_gain: float = 0.003  # "halve": a relative improvement smaller than this decays the rate
    batch_size: int = 1000
    max_epochs: int = 40
    # An epoch is at most this many training positions: a longer split is cut into several epochs
    # a pass (data.epoch_span), each ending in validation, a checkpoint and the schedule's
    # decision. 0: always the whole split (runs from before this setting record none: 0).
    epoch_tokens: int = 10_000_000
    optimizer: str = "momentum"
    momentum: float = 0.9
    weight_decay_words: float = 1e-4
    weight_decay_other: float = 1e-5
    seed: int = 0
    device: str = "cpu"
    max_train_tokens: int | None = None  # train on a prefix only (smoke tests, benchmarks)
    progress: bool = True
    engine: str = "auto"  # "fast" (hlbl.fast, CPU numba), "torch" (autograd), "auto": fast where it applies
    hogwild: int = 1  # fast engine threads; 1 is deterministic, more run lock-free (not reproducible)

    def __post_init__(self):
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {self.optimizer!r}; choose from {', '.join(OPTIMIZERS)}")
        if self.hogwild < 1:
            raise ValueError("hogwild threads must be at least 1")
        if self.engine not in ENGINES:
            raise ValueError(f"unknown engine {self.engine!r}; choose from {', '.join(ENGINES)}")
        if self.batch_size < 1:
            raise ValueError(f"batch size must be at least 1, got {self.batch_size}")
        if self.max_epochs < 1:
            raise ValueError(f"epochs must be at least 1, got {self.max_epochs}")
        if not 0 < self.lr < math.inf:
            raise ValueError(f"learning rate must be positive, got {self.lr}")
        if not 0 <= self.lr_final < math.inf:
            raise ValueError(f"the final learning rate must be >= 0, got {self.lr_final}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"unknown lr_schedule={self.lr_schedule}; choose from {', '.join(LR_SCHEDULES)}")
        if not 0 < self.lr_decay < 1:
            raise ValueError(f"lr_decay={self.lr_decay} is not in (0, 1)")
        if isinstance(self.lr_decays, bool) or not isinstance(self.lr_decays, int) or self.lr_decays < 0:
            raise ValueError(f"lr_decays={self.lr_decays} is not an integer >= 0")
        if not 0 <= self.lr_min_gain < 1:
            raise ValueError(f"lr_min_gain={self.lr_min_gain} is not in [0, 1)")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum}")
        if not (0 <= self.weight_decay_words < math.inf and 0 <= self.weight_decay_other < math.inf):
            raise ValueError("weight decays must be >= 0")
        if isinstance(self.epoch_tokens, bool) or not isinstance(self.epoch_tokens, int) or self.epoch_tokens < 0:
            raise ValueError(f"epoch_tokens={self.epoch_tokens} is not an integer >= 0 (0: the whole split)")
        if self.max_train_tokens is not None and self.max_train_tokens < 1:
            raise ValueError(f"max_train_tokens must be at least 1, got {self.max_train_tokens}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be in 0 .. 2^63-1, got {self.seed}")

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict, **overrides) -> "TrainConfig":
        """The config :meth:`to_json` saved in a run's run.json, with ``overrides`` applied;
        ValueError for keys this version does not know or bad values."""
        if not isinstance(obj, dict):
            raise ValueError(f"training settings must be a JSON object, not {type(obj).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(obj) - known)
        if unknown:
            raise ValueError(f"unknown training setting(s) {', '.join(unknown)}")
        kw = {"epoch_tokens": 0, **obj, **overrides}  # (runs from before the setting: whole-split epochs)
        if not kw.get("max_train_tokens"):
            kw["max_train_tokens"] = None  # runs written before 0 became an error stored 0 for "all"
        try:
            return cls(**kw)
        except TypeError as e:
            raise ValueError(str(e)) from None


def make_optimizer(model: LBL, cfg: TrainConfig, lr: float) -> torch.optim.Optimizer:
    # The penalty is per example, like the loss: a summed minibatch carries batch_size copies.
    groups = model.param_groups(cfg.weight_decay_words * cfg.batch_size, cfg.weight_decay_other * cfg.batch_size)
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=lr)
    if cfg.optimizer == "momentum":
        return torch.optim.SGD(groups, lr=lr, momentum=cfg.momentum)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(groups, lr=lr)
    return torch.optim.Adagrad(groups, lr=lr)


def train_epoch(
    model: LBL, optimizer: torch.optim.Optimizer, stream: np.ndarray, pad: int, cfg: TrainConfig, epoch: int, show: bool
) -> tuple[float, float]:
    """One epoch over ``stream`` in a seeded random order: a whole pass, or for a split longer than
    ``cfg.epoch_tokens`` its share of one (:func:`hlbl.data.epoch_span`); returns (mean NLL, words/s).

    Under a process group of W > 1 ranks (every rank calls this with the same arguments and the
    same parameters), each global minibatch of ``cfg.batch_size`` positions is split into W
    contiguous shards, rank r computes the summed loss of shard r and the gradients are summed
    over the ranks: every rank takes the single-process step. The returned loss and words/s are
    global (all ranks' tokens).
    """
    span = epoch_span(len(stream), epoch, cfg.epoch_tokens, cfg.batch_size)
    order = EpochOrder(cfg.seed, span.pass_, len(stream))  # N positions, the same on every rank
    # the stream, or for a long one its current groups of blocks in a bounded buffer
    reader = EpochReader(stream, order, model.config.context, pad, max_window=cfg.batch_size)
    device = torch.device(cfg.device)
    rank, world = ddp.rank(), ddp.world_size()
    params = [p for p in model.parameters() if p.requires_grad]
    total, seen = 0.0, 0  # this rank's summed NLL and token count
    start = time.perf_counter()
    bar = progress(span.hi - span.lo, f"epoch {epoch}", "w", show)  # a bar on a terminal, else a line every few seconds
    model.train()
    # Layers whose loss samples (nce, sampled) restart their noise generator from (seed, epoch):
    # the same --seed draws the same noise, and a run resumed after an epoch draws what the
    # uninterrupted run drew. Under W ranks every rank draws the same k words per step (one draw
    # per forward), which are the single-process step's shared samples when one draw serves the
    # whole minibatch (noise_share 0; with groups a rank's shard is grouped on its own).
    model.out.reseed(noise_seed(cfg.seed, epoch))
    for first in range(span.lo, span.hi, cfg.batch_size):
        tokens, batch = reader.window(
            first, min(first + cfg.batch_size, span.hi)
        )  # (B,) positions of the global minibatch
        lo, hi = ddp.shard_bounds(len(batch), rank, world)
        pos = batch[lo:hi]  # (b,) this rank's shard; b = B in one process, and can be 0
        optimizer.zero_grad(set_to_none=True)
        if len(pos):  # an empty shard (a short last minibatch) contributes no gradient, but still syncs
            ctx = torch.from_numpy(contexts(tokens, pos, model.config.context, pad)).to(device)  # (b, n)
            tgt = torch.from_numpy(np.asarray(tokens[pos], dtype=np.int64)).to(device)  # (b,)
            loss = model(ctx, tgt).loss * len(pos)  # summed over the shard: the learning rate is per example
            loss.backward()
            total += float(loss.detach())
            seen += len(pos)
        ddp.all_reduce_gradients(params)  # sum over the ranks = the whole minibatch's gradient (no-op in one process)
        optimizer.step()
        bar.update(len(batch))
        bar.set_postfix(
            loss=f"{total / max(seen, 1):.3f}", wps=f"{seen * world / (time.perf_counter() - start):.0f}", refresh=False
        )  # (this rank's loss; words/s estimated as W times its own)
    bar.close()
    elapsed = time.perf_counter() - start
    total, seen = ddp.all_sum([total, float(seen)], device)  # global, in float64
    (elapsed,) = ddp.all_max([elapsed], device)  # the slowest rank's time is the epoch's
    return total / max(seen, 1), seen / elapsed


def epoch_runner(model: LBL, cfg: TrainConfig):
    """The one place that picks the step implementation; both have train_epoch's signature.

    ``hlbl.fast.train_epoch`` (numba kernels, sparse exact updates; tree output, diagonal context,
    SGD with or without momentum, CPU, not distributed) or :func:`train_epoch` (autograd: GPU,
    distributed, any output layer and optimiser). Both take the same steps on the same batches.
    """
    if cfg.engine == "torch":
        return train_epoch
    if ddp.is_distributed():  # checked first: fast.unsupported's reasons would not be the point
        if cfg.engine == "fast":
            raise ConfigError(
                f"engine='fast' runs in a single process; with {ddp.world_size()} processes (torchrun) "
                "use engine='torch' (or engine='auto')"
            )
        return train_epoch
    from . import fast  # lazily: numba compiles its kernels on first use

    why = fast.unsupported(model, cfg=cfg)
    if why is None:
        return fast.train_epoch  # threads: cfg.hogwild
    if cfg.engine == "fast":
        raise ConfigError(f"engine='fast' cannot train this model: {why}")  # a user error: one line
    return train_epoch


def _restore_best(model: LBL, best: Path | None, vocab) -> None:
    """Load a checkpoint's best.safetensors into ``model`` on every rank. Only rank 0 reads the
    file, which it wrote itself (no race with the writer, no filesystem shared between nodes
    needed), and broadcasts."""
    if ddp.rank() == 0:
        ckpt.load_weights(best, model, vocab=vocab)
    ddp.broadcast_parameters(model)


# Settings of how a run is computed, not of what it learns: a resume may change them.
RUNTIME_SETTINGS = ("max_epochs", "device", "progress", "engine", "hogwild")


def warm_start(model: LBL, source: str | Path, corpus: Corpus, log=lambda msg: None, keep_output: bool = False) -> None:
    """Start ``model`` from the word vectors R and context weights C of the run in ``source``.

    The iterated bootstrap of the paper's Section 5: a tree rebuilt from a trained model's features
    is trained on, keeping what the model learned about contexts; only the output layer starts
    afresh, with the zero node vectors and unigram biases of an untrained layer (so the first
    prediction is the unigram distribution, whatever the tree). The source must share the
    vocabulary (word for word), the feature size, the context size and the form of C.

    ``keep_output``: keep the source's output layer too: on the same tree (or layer) as is, to go
    on with another recipe (e.g. a lower learning rate); on word classes refined by exchange moves
    (``hlbl tree refine``) each membership's vector and bias move with it
    (:func:`hlbl.refine.match_leaves`)."""
    from .checkpoint import load_model

    src, vocab, _ = load_model(source)
    if list(vocab.words) != list(corpus.vocab.words):
        raise ConfigError(
            f"--init-from {source}: its vocabulary differs from this run's (the same corpus and vocabulary rule are needed)"
        )
    for key in ("dim", "context", "full_context"):
        mine, theirs = getattr(model.config, key), getattr(src.config, key)
        if mine != theirs:
            raise ConfigError(f"--init-from {source}: its {key}={theirs}, this run's {mine}")
    leaf_map = None
    same = False
    if keep_output:
        from .errors import TreeError
        from .refine import match_leaves

        mine, theirs = model.structure, src.structure
        if model.config.output != src.config.output:
            raise ConfigError(
                f"--keep-output: the --init-from run has {src.config.output} output, this run {model.config.output}"
            )
        same = (mine is None and theirs is None) or (
            mine is not None and theirs is not None and mine.fingerprint() == theirs.fingerprint()
        )
        if not same and model.config.output != "classes":
            raise ConfigError("--keep-output needs the --init-from run's own tree (or its word classes up to moves)")
        if not same:
            try:
                leaf_map = match_leaves(theirs, mine)
            except TreeError as e:
                raise ConfigError(f"--keep-output: {e}") from None
    with torch.no_grad():
        model.R.weight.copy_(src.R.weight)
        model.C.copy_(src.C)
        for name, p in model.out.named_parameters():
            if "bias" not in name:
                p.zero_()
    if same:
        model.out.load_state_dict(src.out.state_dict())
        log(f"started from every weight of {source}")
        return
    if leaf_map is not None:
        from .refine import carry_output

        carry_output(src.out, model.out, leaf_map)
        log(f"started from every weight of {source}; the output layer carried over to the refined classes")
        return
    model.init_unigram(corpus.vocab.counts)
    log(f"started from the word vectors and context weights of {source}; the output layer from the unigram")


def check_memory(model: LBL, cfg: TrainConfig, tokens: int) -> None:
    """Refuse a minibatch whose buffers could not be allocated (``--batch-size 1000000000000``
    would ask numpy for terabytes and end in a traceback): a rough per-example estimate of the
    engines' buffers (context ids, targets, hidden vectors and their gradients) against the
    machine's memory."""
    per_example = 8 * (model.config.context + 2) + 4 * 4 * model.config.dim
    need = cfg.batch_size * per_example
    try:
        have = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not on every system
        return
    if need > have:
        raise ConfigError(
            f"batch_size={cfg.batch_size} needs about {need / 2**30:,.0f} GiB for one minibatch's "
            f"buffers, more than this machine's {have / 2**30:,.0f} GiB; the training split has "
            f"{tokens:,} tokens"
        )


def check_model_memory(config, what: str = "the model") -> None:
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
            f"{what} needs about {need / 2**30:,.0f} GiB ({params:,} parameters with their gradients "
            f"and optimiser state), more than this machine's {have / 2**30:,.0f} GiB; lower the feature size (dim)"
        )


def fit(
    model: LBL,
    corpus: Corpus,
    cfg: TrainConfig,
    run_dir: Path,
    resume: bool = False,
    corpus_spec: str = "",
    log: Callable[[str], None] | None = None,
    options: dict | None = None,
) -> dict:
    """Train with early stopping; checkpoint each epoch into ``run_dir``. Returns the final state.

    ``resume``: continue the run in ``run_dir`` from its newest complete checkpoint (from the
    start when it has none); ``model`` and ``cfg`` must be the run's own (run.json), apart from
    :data:`RUNTIME_SETTINGS`. A directory that holds something else than a run is refused.
    ``options``: recorded in run.json (the CLI's vocabulary and tree settings).
    ``log`` receives one line per epoch and per learning-rate decision; by default they go to the
    ``hlbl.train`` logger at INFO level.

    Distributed (a process group of W > 1 ranks, see the module docstring): call it on every rank
    with the same model, corpus and config; only rank 0 logs and writes ``run_dir``, and every rank
    returns holding the best weights.
    """
    log = log or logger.info
    run_dir = Path(run_dir)
    model.to(torch.device(cfg.device))  # (the engine's choice depends on where the parameters are)
    epoch_runner(model, cfg)  # before the directory exists: a refused engine leaves no run behind
    check_memory(model, cfg, len(corpus["train"]))
    if resume and ddp.rank() == 0:
        refuse_foreign_directory(run_dir)
    if ddp.rank() != 0:  # only rank 0 writes run_dir
        return _fit(model, corpus, cfg, run_dir, resume, corpus_spec, lambda *a, **k: None, options)
    with ExitStack() as held:
        try:  # two trainings in one directory would interleave their checkpoints
            held.enter_context(atomic.exclusive_directory(run_dir, "another training process"))
        except BlockingIOError as e:
            raise DataError(str(e)) from None
        except OSError as e:
            raise DataError(f"cannot create the run directory {run_dir}: {e.strerror or e}") from None
        return _fit(model, corpus, cfg, run_dir, resume, corpus_spec, log, options)


def is_unstarted(run_dir: Path) -> bool:
    """True for a directory that is missing, empty, or holds only what a run start that was
    stopped before writing run.json leaves (its own files and their temporary copies)."""
    try:
        names = [p.name for p in Path(run_dir).iterdir()]
    except FileNotFoundError:
        return True
    except NotADirectoryError:
        return False
    return all(n in ckpt.RUN_FILES and n != "run.json" or ckpt._TEMPORARY.fullmatch(n) for n in names)


def refuse_foreign_directory(run_dir: Path) -> None:
    """--resume writes only into a run it continues, or into a directory that holds none yet."""
    if run_dir.exists() and not run_dir.is_dir():
        raise DataError(f"{run_dir} is a file, not a run directory")
    if not (run_dir / "run.json").exists() and not is_unstarted(run_dir):
        raise DataError(
            f"{run_dir} is not an hlbl run (it has no run.json) and is not empty: a resume writes only "
            "into the run it continues; choose another run directory"
        )


def _fit(
    model: LBL,
    corpus: Corpus,
    cfg: TrainConfig,
    run_dir: Path,
    resume: bool,
    corpus_spec: str,
    log,
    options: dict | None = None,
) -> dict:
    rank = ddp.rank()
    device = torch.device(cfg.device)
    model.to(device)
    pad = corpus.vocab.eos
    train = corpus["train"]
    if cfg.max_train_tokens:
        train = train[: cfg.max_train_tokens]
    valid = corpus["valid"]
    # Ranks that built different runs would deadlock or silently train W models; parameters are
    # broadcast below, but the tree is structure (a builder that is not deterministic across
    # processes would differ), the split lengths and recipe set the number of steps, and each
    # rank reads its shards from its own copy of the text.
    if ddp.is_distributed():
        ddp.check_same(
            json.dumps(
                [
                    model.config.to_json(),
                    model.tree.fingerprint() if model.tree is not None else None,
                    [(k, list(p.shape)) for k, p in model.named_parameters()],
                    len(train),
                    len(valid),
                    stream_fingerprint(train),
                    stream_fingerprint(valid),  # the text, not its size only
                    hashlib.sha256("\n".join(corpus.vocab.words).encode()).hexdigest(),
                    {k: v for k, v in asdict(cfg).items() if k not in ("device", "progress", "hogwild")},
                ],
                sort_keys=True,
            ),
            device,
            "the model, its word tree, the corpus or the training recipe",
        )
    run_epoch = epoch_runner(model, cfg)
    state, optimizer, metrics, best = _start_or_resume(model, corpus, cfg, run_dir, resume, corpus_spec, log, options)
    while not state["done"] and state["epoch"] < cfg.max_epochs:
        epoch = state["epoch"] + 1
        t0 = time.perf_counter()
        loss, wps = run_epoch(model, optimizer, train, pad, cfg, epoch, cfg.progress and rank == 0)  # global
        train_time = time.perf_counter() - t0
        # Rank 0 scores the validation split and broadcasts the perplexity, so that the decisions
        # below (improved, learning-rate drop, stop) are the same on every rank.
        ppl = evaluate(model, valid, pad, device=device, engine=cfg.engine)["perplexity"] if rank == 0 else 0.0
        (ppl,) = ddp.broadcast_floats([ppl], device)
        state["elapsed"] += time.perf_counter() - t0
        if not math.isfinite(loss) or not math.isfinite(ppl):
            n = model.config.context
            hint = f" or the context size (context={n}: the context vector sums {n} word vectors)" if n > 10 else ""
            raise FloatingPointError(
                f"training diverged in epoch {epoch}: train loss {loss:.4g} per token, "
                f"validation perplexity {ppl:.4g}; lower the learning rate "
                f"(lr={state['lr']:g}){hint}"
            )
        improved = ppl < state["best_valid_ppl"]
        span = epoch_span(len(train), epoch, cfg.epoch_tokens, cfg.batch_size)
        line = {
            "epoch": epoch,
            "pass": span.pass_,  # epochs of a long split are parts of a pass (cfg.epoch_tokens)
            "part": span.part,
            "parts": span.parts,
            "train_loss": loss,
            "train_ppl": math.exp(loss),
            "valid_ppl": ppl,
            "words_per_sec": wps,
            "epoch_minutes": train_time / 60,
            "lr": state["lr"],
            "elapsed_s": state["elapsed"],
            "improved": improved,
        }
        metrics.append(json.dumps(line))  # written with the epoch's checkpoint, never before
        where = f" (pass {span.pass_}, part {span.part}/{span.parts})" if span.parts > 1 else ""
        log(f"epoch {epoch}{where}: train loss {loss:.4f}  valid ppl {ppl:.2f}  {wps:,.0f} words/s  lr {state['lr']:g}")
        state["epoch"] = epoch
        enough = ppl < state["best_valid_ppl"] * (1.0 - cfg.lr_min_gain)
        if improved:
            state["best_valid_ppl"] = ppl
        new_lr, drop = _next_lr(cfg, state, improved, enough, span.parts)
        if new_lr is None:
            state["done"] = True
        elif drop:
            # phase = how many times the rate has dropped (0 or 1 for the two-rate schedule)
            state["phase"], state["lr"] = state["phase"] + 1, new_lr
            if not improved:
                _restore_best(model, best, corpus.vocab)  # go back to the best weights
            optimizer = make_optimizer(model, cfg, state["lr"])  # (momentum starts afresh)
            restored = "best weights restored, " if not improved else ""
            log(
                f"valid perplexity {'rose' if not improved else 'barely improved'}: {restored}learning rate now {new_lr:g}"
            )
        if rank == 0:
            best = (
                _checkpoint(model, optimizer, state, run_dir, corpus.vocab, metrics, None if improved else best)
                / "best.safetensors"
            )
    _restore_best(model, best, corpus.vocab)
    return state


def schedule(cfg: TrainConfig, parts: int) -> str:
    """The schedule a run follows: ``cfg.lr_schedule``, with "auto" resolved for a split whose
    pass is ``parts`` epochs (:func:`hlbl.data.epoch_span`)."""
    if cfg.lr_schedule != "auto":
        return cfg.lr_schedule
    return "halve" if parts > 1 else "two-rate"


def _next_lr(cfg: TrainConfig, state: dict, improved: bool, enough: bool, parts: int) -> tuple[float | None, bool]:
    """(the learning rate for the epoch after one that ended in ``state``, whether it drops);
    a rate of None: stop. ``parts``: epochs a pass (for the "auto" schedule).

    two-rate: keep the rate while validation improves; on the first rise switch to lr_final (0:
    stop), on the second stop. halve: keep the rate while validation improves by lr_min_gain
    (relative); otherwise multiply it by lr_decay, lr_decays times, then stop."""
    if schedule(cfg, parts) == "two-rate":
        if improved:
            return state["lr"], False
        return (cfg.lr_final, True) if state["phase"] == 0 and cfg.lr_final > 0 else (None, False)
    if enough:
        return state["lr"], False
    return (state["lr"] * cfg.lr_decay, True) if state["phase"] < cfg.lr_decays else (None, False)


def _start_or_resume(
    model: LBL,
    corpus: Corpus,
    cfg: TrainConfig,
    run_dir: Path,
    resume: bool,
    corpus_spec: str,
    log,
    options: dict | None = None,
) -> tuple[dict, torch.optim.Optimizer, list[str], Path | None]:
    """A new run's files (rank 0 writes them), or a run's state, weights, optimiser and metrics
    from its newest complete checkpoint (every rank reads them); every rank then holds rank 0's
    parameters. Also returns the metrics lines so far and the checkpoint's best weights file."""
    state = {"epoch": 0, "phase": 0, "lr": cfg.lr, "best_valid_ppl": math.inf, "done": False, "elapsed": 0.0}
    optimizer = make_optimizer(model, cfg, cfg.lr)
    is_run = resume and (run_dir / "run.json").exists()
    found = None
    if is_run:
        check_recipe(run_dir, model, corpus.vocab, cfg)
        found = ckpt.latest_checkpoint(run_dir)
    if ddp.rank() == 0 and (resume or ckpt.CHECKPOINTS not in {p.name for p in run_dir.iterdir()}):
        removed = ckpt.remove_leftovers(run_dir)  # (also those of a start stopped before its run.json)
        if removed:
            log(f"removed the leftovers of an interrupted write: {', '.join(removed)}")
    resuming = found is not None
    # Every rank must make the same choice (resuming needs run_dir on a filesystem all ranks see);
    # this collective is also the barrier that keeps rank 0 from writing into run_dir before every
    # rank has looked at it (here, and in the caller's checks of the directory).
    low, high = ddp.all_max([-float(resuming), float(resuming)], cfg.device)
    if -low != high:
        raise DataError(
            f"{run_dir}: only some processes see its checkpoint; resuming a distributed run needs "
            "the run directory on a filesystem that every process sees"
        )
    metrics: list[str] = []
    if resuming:
        state = ckpt.read_state(found / "state.json")
        ckpt.load_weights(found / "last.safetensors", model, epoch=state["epoch"], vocab=corpus.vocab)
        tensors, meta = ckpt.load_tensors_and_meta(found / "optimizer.safetensors", kind="hlbl-optimizer")
        ckpt.check_epoch(found / "optimizer.safetensors", meta, state["epoch"])
        optimizer = make_optimizer(model, cfg, state["lr"])
        ckpt.restore_optimizer(optimizer, tensors, state["optimizer"])
        metrics = _checkpoint_metrics(run_dir, found, state["epoch"], log)
        if ddp.rank() == 0 and found != run_dir:
            ckpt.publish(run_dir, found)  # (a crash may have stopped the last publication half-way)
            ckpt.prune_checkpoints(run_dir, found)
        where = found.relative_to(run_dir) if found != run_dir else "its files"
        log(
            f"resuming after epoch {state['epoch']} from {where}, the newest complete checkpoint "
            f"(best valid perplexity {state['best_valid_ppl']:.2f})"
        )
    elif is_run:
        log(f"{run_dir} has no complete checkpoint: training from the start, with the run's own recipe")
        if ddp.rank() == 0:
            _report_metrics_dropped(run_dir / "metrics.jsonl", [], log)
            atomic.write_text(run_dir / "metrics.jsonl", "")
    elif ddp.rank() == 0:
        ckpt.save_run_files(
            run_dir,
            model,
            corpus.vocab,
            cfg.to_json(),
            corpus_spec,
            {s: stream_fingerprint(corpus[s]) for s in ("train", "valid")},
            options,
            corpus_meta=corpus_meta(corpus),
        )
        atomic.write_text(run_dir / "metrics.jsonl", "")
    ddp.broadcast_parameters(model)
    best = found / "best.safetensors" if resuming else None
    return state, optimizer, metrics, best


def check_recipe(run_dir: Path, model: LBL, vocab, cfg: TrainConfig) -> None:
    """A resume continues a run with the run's own recipe: refuse a model, vocabulary, tree or
    training setting that differs from run.json (apart from :data:`RUNTIME_SETTINGS`), naming it."""
    config, own_vocab, tree, info = ckpt.load_recipe(run_dir)
    path = run_dir / "run.json"
    try:
        own = TrainConfig.from_json(info["train"]).to_json()
    except ValueError as e:
        raise ckpt.CheckpointError(f"{path}: bad training config ({e})") from None
    diffs = [
        f"model {k} {v!r} (the run's is {config.to_json()[k]!r})"
        for k, v in model.config.to_json().items()
        if config.to_json().get(k) != v
    ]
    diffs += [
        f"training {k} {v!r} (the run's is {own[k]!r})"
        for k, v in cfg.to_json().items()
        if k not in RUNTIME_SETTINGS and own.get(k) != v
    ]
    if ckpt.vocab_fingerprint(own_vocab) != ckpt.vocab_fingerprint(vocab):
        diffs.append("another vocabulary than vocab.json")
    mine = model.structure  # a word tree, word classes, or None
    if (tree is None) != (mine is None) or (tree is not None and tree.fingerprint() != mine.fingerprint()):
        diffs.append("another word tree than tree.json")
    if diffs:
        raise ckpt.CheckpointError(
            f"{run_dir} is a run of another recipe: {'; '.join(diffs)}. A resume continues a run with its own recipe"
        )


def _checkpoint_metrics(run_dir: Path, found: Path, epoch: int, log) -> list[str]:
    """The metrics lines of a checkpoint (the epochs up to its own); differences from the
    run directory's metrics.jsonl (lines of an epoch whose checkpoint was never written, a torn
    last line) are reported, not dropped silently."""
    if found == run_dir:  # a run from before checkpoints had their own directories
        path = run_dir / "metrics.jsonl"
        text = path.read_bytes().decode("utf-8", "replace") if path.is_file() else ""
        keep = []
        for line in text.splitlines():
            try:
                if json.loads(line)["epoch"] <= epoch:
                    keep.append(line)
            except (json.JSONDecodeError, KeyError, TypeError):
                continue
        if ddp.rank() == 0:
            _report_metrics_dropped(path, keep, log)
            atomic.write_text(path, "".join(x + "\n" for x in keep))
        return keep
    lines = ckpt.read_metrics(found / "metrics.jsonl")
    if len(lines) != epoch:
        raise ckpt.CheckpointError(f"{found / 'metrics.jsonl'}: {len(lines)} lines, its state.json ends epoch {epoch}")
    keep = (found / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    if ddp.rank() == 0:
        _report_metrics_dropped(run_dir / "metrics.jsonl", keep, log)
    return keep


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


def _checkpoint(
    model: LBL,
    optimizer: torch.optim.Optimizer,
    state: dict,
    run_dir: Path,
    vocab,
    metrics: list[str],
    best: Path | None,
) -> Path:
    """The end-of-epoch checkpoint, one atomic commit (:func:`hlbl.checkpoint.commit_checkpoint`):
    optimiser, last weights, best weights (``best``: the previous checkpoint's file when this
    epoch did not improve, linked), the metrics log and the state; then the run directory's
    top-level copies, and the previous checkpoint removed. Ctrl-C or SIGTERM waits for all of it;
    kill -9 or a power cut at any point leaves the previous checkpoint or this one, whole."""
    tensors, meta = ckpt.optimizer_tensors(optimizer)
    state["optimizer"] = meta
    epoch = state["epoch"]

    def text(content: str):
        return lambda path: path.write_text(content, encoding="utf-8")

    files = {
        "optimizer.safetensors": lambda path: ckpt.write_tensors(
            path, tensors, kind="hlbl-optimizer", meta={"epoch": str(epoch)}
        ),
        "last.safetensors": lambda path: ckpt.write_weights(path, model, epoch=epoch, vocab=vocab),
        "best.safetensors": best if best is not None else (lambda path: ckpt.write_weights(path, model, vocab=vocab)),
        "metrics.jsonl": text("".join(x + "\n" for x in metrics)),
        "state.json": text(
            json.dumps({"format": ckpt.STATE_FORMAT, "version": ckpt.FORMAT_VERSION, **state}, indent=1)
        ),
    }
    with atomic.interrupts_deferred():
        found = ckpt.commit_checkpoint(run_dir, epoch, files)
        ckpt.publish(run_dir, found)
        ckpt.prune_checkpoints(run_dir, found)
    return found
