"""Fast CPU engine for HLBL: fused numba kernels, sparse row updates, exact objective and optimiser.

What it computes is exactly what the PyTorch path computes (``hlbl.train.train_epoch`` with
``torch.optim.SGD``): for each minibatch the gradient of the *summed* negative log-likelihood at
the current parameters, then one SGD step (optionally with momentum and L2 weight decay, per
parameter group). Only the bookkeeping differs: the engine never materialises dense gradients.

Objective (unchanged from :class:`hlbl.output.TreeSoftmax`): for target ``w`` with leaves
``l_1..l_K`` (multi-code trees have K > 1)::

    log P(w | h) = logsumexp_k  sum_{t < depth(l_k)} logsigmoid(sign_kt * (h . q_{n_kt} + b_{n_kt}))

with exact ``logsigmoid`` (no lookup table, no skipped saturated nodes). The gradient of the
loss w.r.t. the score ``s`` of node ``n_kt`` is ``-pi_k * sign_kt * sigmoid(-sign_kt * s)``,
where ``pi_k = P(path k | w, h)`` is the path's posterior share; a node on two of a word's paths
gets both contributions.

One step (number t) on a batch of B positions (context n words, dimension d, paths padded to
K x D), ``_step`` (the numba kernels are in :mod:`hlbl.kernels`; this module drives them, passing
the parameters, the optimiser state and each thread's scratch arrays as the named tuples
``kernels.Params``, ``kernels.OptState`` and ``kernels.Workspace``):

1. ``_gather``: the context words, straight from the token stream, and the tree nodes on the
   target's paths (with their directions) -- the rows this step reads and writes.
2. ``_csr``: groups the (example, node) and (example, context word) pairs by row (compressed
   sparse rows, pairs in example order); ``_by_block`` finds, for blocks of S = ``BLOCK``
   consecutive examples, which rows each block reads first and which it reads last.
3. Then block by block:

   a. ``catch_up``: brings the rows the block reads first to their step t-1 values (see
      laziness below).
   b. ``_forward_backward``: ``h_b = sum_i C_i * R[ctx_bi]`` (diagonal C), node scores, per-node
      loss gradients ``gs (B, K*D)``, ``dh_b = dLoss/dh_b``, the NLL, and the gradient of C
      (``sum_b R[ctx_bi] * dh_b``). Reads parameters only.
   c. ``_update_nodes`` / ``_update_words``: each row the block reads last sums its gradient in
      example order (over the whole batch) and takes its optimiser step.

   No row changes before the last example that reads it, so this is the minibatch step of
   the whole batch, the same to the bit for any S; blocks only keep a row in cache from its
   catch-up to its step (with a large vocabulary most rows are read by a single example).
4. C takes its (dense) step.

Optimiser semantics and laziness. ``torch.optim.SGD`` with momentum ``mu``, weight decay ``wd``
and learning rate ``lr`` does, for *every* row every step (rows a batch does not touch get a
zero gradient, but decay and momentum still move them)::

    buf <- mu * buf + g + wd * p ;    p <- p - lr * buf           (torch: dampening 0)

With ``g = 0`` this is linear in ``(p, buf)``: ``(p, buf) <- A (p, buf)`` with
``A = [[1 - lr*wd, -lr*mu], [wd, mu]]``. So the engine is *lazy but exact*: each row remembers
the last step it was brought up to date (``last``); when a batch touches it at step t it first
applies ``A^(t-1-last)`` (powers precomputed in float64 per parameter group and epoch; step 3),
then, after the forward pass, the step with its gradient. At the end of each epoch every row is caught up (``catch_up``), so the
parameters and the momentum buffers stored in the torch optimiser (``state[p]["momentum_buffer"]``)
are exactly those of the dense PyTorch path, up to float32 rounding. Cost per step is
proportional to the rows a batch touches, plus O(V d) once per epoch: training cost grows with
log V, not V. Plain SGD (``momentum = 0``) is the special case ``A = [[1 - lr*wd]]`` with no buffer.
Adam/Adagrad are not implemented here (their lazy forms are not exact); ``engine="auto"`` uses the
PyTorch path for them.

Threads and determinism. A step is sequential; ``threads=T > 1`` runs T Python threads (the
kernels release the GIL), thread r taking steps r+1, r+1+T, ... on the shared parameters
without locks: Hogwild (Recht et al. 2011) at the granularity of exact minibatch steps. There is
no barrier between steps, so a thread never waits for another (the reason for this design: on a
loaded machine, per-step barriers between threads cost a scheduler time slice each). Steps of
different threads overlap, so a step may read rows another is writing, and results are not
bit-reproducible. Each step's decay and momentum still reach each row once: the rows' step
stamps are claimed by compare-and-swap (``kernels._claim``), and a step whose row another thread
has already caught up past it adds only its gradient (``kernels._row_step``); only the values
are written without locks (two threads writing one row at once can lose an element's update). With ``threads=1`` the engine is deterministic: a seed fixes the result to the
bit, and it equals the PyTorch path up to float32 rounding. ``fit`` (``engine="fast"``/"auto")
uses ``TrainConfig.hogwild`` threads, 1 by default, so a seed fixes a run; Hogwild is for callers
that ask for it (``hlbl train --hogwild N``, the benchmarks).
Two Hogwild threads learn about as much per epoch as the exact path and are about as efficient
per CPU-second as one thread, so they pay off only when a second core is actually free
(``bash bench/hogwild.sh``; figures in docs/engine.md).

Memory-level design (profiled per phase by ``bench/phases.py``; the step counts its cycles per
phase). With a small vocabulary the parameters and momentum live in the L3 cache and a step is
arithmetic; with a large one most of the rows a batch touches are in no cache, and a step waits
for memory. So:

- Blocks (step 3 above): each row is fetched from memory once, by its catch-up, and is still in
  the core's caches when its block reads it and steps it, instead of once per phase with the
  whole batch's rows (more than a core's caches hold) in between.
- A cold row costs as few cache lines as it can: its step stamp, CSR slots and (for nodes) bias
  and bias momentum share one small record (:func:`_row_records`), and a target's paths are one
  record of :func:`word_paths`; the forward pass reads only what ``_gather`` collected.
- Row loops prefetch rows a few iterations ahead (``kernels.ROWS_AHEAD`` and the other
  distances there; :mod:`hlbl.intrinsics`), ``_gather`` and ``_csr`` their tables and records;
  the big tables sit on 2 MiB pages (:mod:`hlbl.memory`).
- Prefetches are reads into L2 (prefetcht1), not write prefetches into L1 (prefetchw): these
  hold one of the core's few L1 miss buffers each until the line comes; the L2 tracks more
  misses in flight.
- The catch-up's coefficients A^gap (float64) are rounded to float32 once per row, the row being
  float32, rather than doing the row's arithmetic in float64.

docs/engine.md says what the benchmarks measure and where their results are.

Scoring (``token_log_probs``) is one parallel pass over the stream, O(K D d) per token.

Limitations: tree output layer, diagonal context weights, float32 parameters on the CPU.
"""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

import numba
import numpy as np
import torch

from .data import EpochOrder, EpochReader, EpochSpan, epoch_span
from .jit import compile_logged
from .kernels import PHASES, OptState, Params, Rates, WordPaths, Workspace, catch_up, train_steps
from .memory import prefer_huge_pages
from .numpy_model import SCORE_CHUNK, score_stream, word_paths
from .numpy_model import check_stream as _check_stream
from .output import TreeSoftmax
from .progress import progress
from .sync import DelayedSync, Mixer, Pair, Sync
from .tree import WordTree


BLOCK = 32  # examples per block of a step (kernels._step): a speed setting, the step is the same


def _np(t: torch.Tensor) -> np.ndarray:
    """A writable numpy view of a CPU float32 contiguous tensor (shares memory)."""
    return t.detach().numpy()


def unsupported(model, optimizer: torch.optim.Optimizer | None = None, cfg=None) -> str | None:
    """Why the fast engine cannot train/score ``model`` (None if it can)."""
    out = getattr(model, "out", None)
    if not isinstance(out, TreeSoftmax):
        return "it handles the tree output layer only"
    if model.config.full_context:
        return "it handles diagonal context weights only, not full context matrices"
    for p in model.parameters():
        if p.device.type != "cpu" or p.dtype != torch.float32 or not p.is_contiguous():
            return "it needs contiguous float32 parameters on the CPU"
    if cfg is not None:
        if cfg.optimizer not in ("sgd", "momentum"):
            return f"it implements SGD with or without momentum, not {cfg.optimizer!r}"
        if torch.device(cfg.device).type != "cpu":
            return f"it runs on the CPU, not {cfg.device!r}"
    if optimizer is not None:
        if type(optimizer) is not torch.optim.SGD:
            return f"it implements torch.optim.SGD only, not {type(optimizer).__name__}"
        for g in optimizer.param_groups:
            if g.get("nesterov") or g.get("dampening", 0) != 0 or g.get("maximize"):
                return "it implements SGD without Nesterov, dampening or maximize"
        owned = {id(p) for g in optimizer.param_groups for p in g["params"]}
        if any(id(p) not in owned for p in model.parameters()):
            return "the optimiser does not hold every model parameter"
    return None


def _powers(lr: float, mu: float, wd: float, steps: int) -> np.ndarray:
    """(steps+1, 2, 2) float64: A^k for the gradient-free SGD step A (module docstring)."""
    A = np.array([[1.0 - lr * wd, -lr * mu], [wd, mu]])
    out = np.empty((steps + 1, 2, 2))
    out[0] = np.eye(2)
    for k in range(1, steps + 1):
        out[k] = A @ out[k - 1]
    return out


class _Optim:
    """The torch SGD optimiser's hyperparameters and momentum buffers, as numpy views."""

    def __init__(self, model, optimizer: torch.optim.Optimizer):
        params = {"R": model.R.weight, "C": model.C, "Q": model.out.weight, "qb": model.out.bias}
        group_of = {id(p): g for g in optimizer.param_groups for p in g["params"]}
        self.rates: dict[str, Rates] = {}  # R, C, Q, qb
        self.buf = {}
        for name, p in params.items():
            g = group_of[id(p)]
            mu = float(g.get("momentum", 0.0))
            self.rates[name] = Rates(float(g["lr"]), mu, float(g.get("weight_decay", 0.0)))
            if mu != 0.0:
                st = optimizer.state[p]
                if st.get("momentum_buffer") is None:
                    # torch's first step sets buf = grad, the same as mu * 0 + grad.
                    st["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
                self.buf[name] = _np(st["momentum_buffer"])
            else:
                self.buf[name] = _np(p)  # never touched when mu == 0
        if self.rates["C"] != self.rates["Q"]:
            # C and Q share P_other in the kernels.
            raise ValueError("the fast engine needs C and the tree weights in one optimiser group")

    def powers(self, steps: int) -> dict[str, np.ndarray]:
        return {k: _powers(*self.rates[k], steps) for k in ("R", "Q", "qb")}


def set_numba_threads(threads: int | None) -> int:
    """numba's threads for the parallel kernels (scoring, top-k): ``threads``, or PyTorch's count
    if None, clamped to [1, NUMBA_NUM_THREADS] (fixed when numba starts); returns the count set."""
    n = threads or torch.get_num_threads()
    n = max(1, min(int(n), numba.config.NUMBA_NUM_THREADS))
    numba.set_num_threads(n)
    return n


def set_cpu_threads(threads: int) -> None:
    """PyTorch's and numba's CPU threads (autograd, the fast kernels, top-k and scoring)."""
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    torch.set_num_threads(threads)
    set_numba_threads(threads)


def _row_records(rows: int, threads: int, floats: int) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
    """A table's per-row bookkeeping, one small record a row: the row's step stamp (0), each
    thread's CSR slot (-1 between steps, see kernels._csr) and ``floats`` float32 values (the
    node biases and their momentum, copied in and out by train_epoch).

    Why one record: at V = 1M the first touch of a cold row in a step is its slot lookup; with
    the stamp (read by the catch-up) and the bias in the same record, that one cache line serves
    all three, where separate arrays cost a memory access each. Records are a power of two of
    4-byte fields, so that none straddles two cache lines.
    Returns (stamps (rows,) int32, [slots (rows,) int32] * threads, [values (rows,) float32] * floats),
    all strided views of the records.
    """
    width = 1 << (threads + floats).bit_length()  # >= 1 + threads + floats
    rec = np.zeros((rows, width), np.int32)
    rec[:, 1 : 1 + threads] = -1
    as_float = rec.view(np.float32)
    return rec[:, 0], [rec[:, 1 + r] for r in range(threads)], [as_float[:, 1 + threads + i] for i in range(floats)]


def _workspace(B: int, n: int, d: int, K: int, D: int, slot_n: np.ndarray, slot_w: np.ndarray) -> Workspace:
    """One thread's scratch arrays (the kernels allocate nothing per step), with its CSR slots
    of the nodes and of the words (see _row_records); shapes in kernels.Workspace."""
    KD, E = K * D, max(B * K * D, B * n)

    def entries() -> np.ndarray:
        return np.empty(E + 1, np.int64)

    def blocks() -> np.ndarray:
        return np.empty(B + 2, np.int64)

    return Workspace(
        ctx=np.empty((B, n), np.int32),
        keys=np.full((B, KD), -1, np.int32),
        plen=np.empty((B, K), np.int32),
        h=np.empty((B, d), np.float32),
        dh=np.empty((B, d), np.float32),
        gs=np.zeros((B, KD), np.float32),
        plp=np.empty((B, K)),
        nll=np.empty(B),
        gC=np.empty((n, d), np.float32),
        slot_n=slot_n,
        slot_w=slot_w,
        uniq_n=entries(),
        start_n=entries(),
        ent_n=entries(),
        uniq_w=entries(),
        start_w=entries(),
        ent_w=entries(),
        cursor=entries(),
        order_n=entries(),
        order_w=entries(),
        first_n=blocks(),
        off_n=blocks(),
        first_w=blocks(),
        off_w=blocks(),
        g=np.empty(d, np.float32),
        empty=np.empty(0, np.float32),
    )


CHUNK_STEPS = 16  # steps per kernel call: progress updates without per-step Python overhead


@dataclass
class _Schedule:
    """The steps of one epoch: positions ``span.lo .. span.hi-1`` of ``order``, in global minibatches
    of ``B``; this process takes minibatches ``rank``, ``rank + world``, ... as its local steps 1 ..
    ``steps`` (all of them in one process), thread r of ``T`` taking local steps r+1, r+1+T, ...

    ``clock``: the step count every process's row stamps run to (the longest share's ``steps``),
    so that all processes' rows are caught up to the same step when they synchronise."""

    span: EpochSpan
    order: EpochOrder
    size: int  # this epoch's positions: span.hi - span.lo
    B: int  # examples per step
    S: int  # examples per block of a step (kernels._step)
    steps: int
    T: int  # threads
    rank: int = 0
    world: int = 1
    clock: int = 0

    @property
    def seen(self) -> int:
        """The positions this process's steps train on (fewer than its share when stopped early)."""
        if self.steps == 0:
            return 0
        last = (self.steps - 1) * self.world + self.rank  # the global minibatch of the last local step
        return (self.steps - 1) * self.B + min(self.B, self.size - last * self.B)

    def window(self, reader: EpochReader, t0: int, t1: int) -> tuple[np.ndarray, np.ndarray, int]:
        """(tokens, positions, lo) of local steps t0..t1 (inclusive) for ``train_steps``: position
        j of the window is the one local step ``lo // B + j // B + 1`` reads at ``j % B``."""
        B, W, lo = self.B, self.world, (t0 - 1) * self.B
        if W == 1:
            tokens, win = reader.window(self.span.lo + lo, self.span.lo + min(t1 * B, self.size))
            return tokens, win, lo
        g0, g1 = (t0 - 1) * W + self.rank, (t1 - 1) * W + self.rank  # global minibatches, 0-based
        tokens, win = reader.window(self.span.lo + g0 * B, self.span.lo + min((g1 + 1) * B, self.size))
        mine = (np.arange(t1 - t0 + 1)[:, None] * (W * B) + np.arange(B)).ravel()  # this rank's slices
        return tokens, win[mine[mine < len(win)]], lo


def _schedule(
    n: int, cfg, epoch: int, threads: int | None, max_batches: int | None, block: int, mixer: Mixer | None = None
) -> _Schedule:
    """The steps of epoch ``epoch`` over a stream of ``n`` positions (train_epoch's arguments)."""
    T = max(1, int(threads or getattr(cfg, "hogwild", 1)))
    B = int(cfg.batch_size)
    span = epoch_span(n, epoch, getattr(cfg, "epoch_tokens", 0), B)
    order = EpochOrder(cfg.seed, span.pass_, n)  # whole, or a window at a time for long streams
    size = span.hi - span.lo
    if block < 1:
        raise ValueError(f"block must be at least 1, got {block}")
    rank, world = (mixer.rank, mixer.world) if mixer is not None else (0, 1)
    if world > 1 and T > 1:
        raise ValueError("Hogwild threads and several processes do not mix: one thread a process")
    minibatches = (size + B - 1) // B
    steps, clock = max(0, minibatches - rank + world - 1) // world, (minibatches + world - 1) // world
    if max_batches is not None:
        steps, clock = min(steps, max_batches), min(clock, max_batches)
    return _Schedule(span, order, size, B, min(int(block), B), steps, min(T, steps) or 1, rank, world, clock)


def _rounds(sched: _Schedule, mixer: Mixer | None) -> list[tuple[int, int]]:
    """The epoch's rounds of local steps (first, last]: the processes synchronise after each (the
    same count on every process); one round in a single process."""
    every = mixer.every if mixer is not None and mixer.world > 1 else max(sched.clock, 1)
    return [(a, min(a + every, sched.clock)) for a in range(0, sched.clock, every)] or [(0, 0)]


@dataclass
class _Shared:
    """What the threads' kernels work on during an epoch: the parameters and optimiser state
    (shared, written without locks), and each thread's own scratch arrays and phase clocks."""

    opt: _Optim
    params: Params
    state: OptState
    paths: WordPaths  # word_paths
    works: list[Workspace]  # (T,) one per thread
    clocks: np.ndarray  # (T, len(PHASES)) int64: each thread's cycles per phase

    def kernel_args(self, r: int) -> tuple:
        """Thread r's arguments of ``train_steps`` between ``pad`` and ``S``."""
        return self.params, self.paths, self.state, self.works[r]


def _shared(engine: "FastEngine", model, optimizer: torch.optim.Optimizer, sched: _Schedule) -> _Shared:
    """Numpy views of the model's parameters and the optimiser's buffers, the A^k powers for the
    epoch's steps, and the per-row records and per-thread workspaces the kernels need."""
    T = sched.T
    opt = _Optim(model, optimizer)
    P = opt.powers(sched.clock)
    R, C, Q, qb = _np(model.R.weight), _np(model.C), _np(model.out.weight), _np(model.out.bias)
    engine.advise(R, Q, *(opt.buf[k] for k in ("R", "Q") if opt.rates[k].mu != 0.0))
    paths = engine.word_paths(model.out.tree)
    V, d = R.shape
    N, n = Q.shape[0], C.shape[0]
    # last_*: the step each row is up to date with (0 = start of epoch); the node biases and their
    # momentum live beside the nodes' stamps during the epoch (_row_records) and are copied back
    # at its end (_keep_biases).
    last_w, slots_w, _ = _row_records(V, T, 0)
    last_n, slots_n, (bias, bias_buf) = _row_records(N, T, 2)
    bias[:] = qb
    if opt.rates["qb"].mu != 0.0:
        bias_buf[:] = opt.buf["qb"]
    params = Params(R=R, Rbuf=opt.buf["R"], C=C, Cbuf=opt.buf["C"], Q=Q, Qbuf=opt.buf["Q"], qb=bias, qbbuf=bias_buf)
    rates = opt.rates
    state = OptState(
        words=rates["R"],
        other=rates["Q"],
        bias=rates["qb"],
        P_words=P["R"],
        P_other=P["Q"],
        P_bias=P["qb"],
        last_w=last_w,
        last_n=last_n,
        word_rate=_np(model.word_rate) if model.word_rate is not None else np.empty(0, np.float32),
    )
    K, D = model.out.tree.word_leaves.shape[1], int(model.out.tree.leaf_depth.max())
    works = [_workspace(sched.B, n, d, K, D, slots_n[r], slots_w[r]) for r in range(T)]
    return _Shared(opt, params, state, paths, works, np.zeros((T, len(PHASES)), np.int64))


def _keep_biases(model, shared: _Shared) -> None:
    """Copies the node biases (and their momentum) from the node records back to the model and
    the optimiser."""
    _np(model.out.bias)[:] = shared.params.qb
    if shared.opt.rates["qb"].mu != 0.0:
        shared.opt.buf["qb"][:] = shared.params.qbbuf


def _thread_steps(
    r: int, sched: _Schedule, shared: _Shared, reader: EpochReader, pad: int, bar, first: int, last: int
) -> float:
    """Thread r's local steps of the round (first, last], CHUNK_STEPS per kernel call; returns
    their summed NLL."""
    mine = np.arange(first + r + 1, min(last, sched.steps) + 1, sched.T, dtype=np.int64)
    total = 0.0
    for c0 in range(0, len(mine), CHUNK_STEPS):
        part = mine[c0 : c0 + CHUNK_STEPS]
        tokens, win, lo = sched.window(reader, int(part[0]), int(part[-1]))
        total += train_steps(part, win, lo, sched.B, tokens, pad, *shared.kernel_args(r), sched.S, shared.clocks[r])
        bar.update(len(win) if sched.T == 1 else int(sum(min(sched.B, sched.size - (t - 1) * sched.B) for t in part)))
    return total


def _catch_up_share(r: int, sched: _Schedule, shared: _Shared, step: int) -> None:
    """Thread r's share of the catch-up of every row to ``step`` (rows are independent), after
    which parameters and momentum buffers are exact: at the end of an epoch or of a round."""
    p, st, rates, T = shared.params, shared.state, shared.opt.rates, sched.T
    V, N = p.R.shape[0], p.Q.shape[0]
    empty = shared.works[0].empty
    rows_w = np.arange(r * V // T, (r + 1) * V // T)
    catch_up(rows_w, p.R, p.Rbuf, empty, empty, st.last_w, step, st.P_words, rates["R"].mu, st.P_bias, 0.0)
    rows_n = np.arange(r * N // T, (r + 1) * N // T)
    catch_up(rows_n, p.Q, p.Qbuf, p.qb, p.qbbuf, st.last_n, step, st.P_other, rates["Q"].mu, st.P_bias, rates["qb"].mu)


def _sync(shared: _Shared, mixer: Mixer, buffers: dict) -> Sync:
    """The epoch's :class:`~hlbl.sync.Sync` (or ``DelayedSync`` where the mixer overlaps rounds,
    its flat buffers kept in ``buffers`` from epoch to epoch) over the shared arrays: the words,
    the context weights and the nodes with their biases."""
    p, st, opt = shared.params, shared.state, shared.opt

    def pair(name: str, value: np.ndarray, buf: np.ndarray, powers: np.ndarray) -> Pair:
        return Pair(value, buf if opt.rates[name].mu != 0.0 else None, powers)

    words = [pair("R", p.R, p.Rbuf, st.P_words)]
    context = [pair("C", p.C, p.Cbuf, st.P_other)]  # (C and Q share a group: P_other)
    nodes = [pair("Q", p.Q, p.Qbuf, st.P_other), pair("qb", p.qb, p.qbbuf, st.P_bias)]
    if mixer.overlap:
        return DelayedSync(words, context, nodes, st.last_w, st.last_n, mixer, buffers)
    return Sync(words, context, nodes, st.last_w, st.last_n, mixer)


def _record_stats(stats: dict, shared: _Shared, sched: _Schedule, steps_s: float, catch_up_s: float) -> None:
    """train_epoch's ``stats``: seconds in steps and catch-up, the steps' seconds by phase (in
    proportion to each phase's cycles over all threads) and the mean rows a step touches."""
    cycles = shared.clocks.sum(axis=0)
    spent = max(int(cycles[:-1].sum()), 1)
    stats.update(
        steps_s=steps_s,
        catch_up_s=catch_up_s,
        threads=sched.T,
        phases_s={p: steps_s * int(c) / spent for p, c in zip(PHASES, cycles[:-1])},
        rows_per_step=int(cycles[-1]) / max(sched.steps, 1),
    )


@dataclass
class Probe:
    """What a benchmark asks of an epoch beyond training it (``bench/``): stop after
    ``max_batches`` steps, take blocks of ``block`` examples per step (a speed setting only: the
    step is the same), and fill ``stats`` with the seconds spent in steps and in the end-of-epoch
    catch-up of every row (O(V d), split over the threads; with a mixer, also the
    synchronisations), the steps' seconds split by phase (``kernels.PHASES``) and the mean number
    of distinct rows a step touches."""

    max_batches: int | None = None
    block: int = BLOCK
    stats: dict = field(default_factory=dict)


class FastEngine:
    """The fast engine: an engine of :mod:`hlbl.engine` (``engine(model, optimizer, stream, pad,
    cfg, epoch, show)`` trains one epoch) and a scorer (:meth:`token_log_probs`).

    It owns what it builds once and reuses from epoch to epoch: the tree's paths in the kernels'
    form (:func:`word_paths`; built again when a layer's tree is another) and which buffers were
    advised onto huge pages. ``threads``: Hogwild threads (default ``cfg.hogwild``, 1 unless asked);
    ``mixer``: this process is one of W that train one model (see :meth:`__call__`).
    """

    def __init__(self, threads: int | None = None, mixer: Mixer | None = None):
        self.threads = threads
        self.mixer = mixer
        self._paths: tuple[WordTree, WordPaths] | None = None  # the last tree's paths (the tree kept: `is` holds)
        self._advised: set[tuple[int, int]] = set()  # (address, bytes) of the buffers advised
        # DelayedSync's two model-sized buffers: the first touch of their pages costs more than a
        # round's work at a large vocabulary, so they are kept from epoch to epoch.
        self._sync_buffers: dict[str, np.ndarray] = {}
        # With a mixer, the last epoch's rounds: their count, this process's seconds at their ends
        # (catch-up of every row, the exchange, the waits), the bytes it sent a round, overlap.
        self.sync_stats: dict | None = None

    def word_paths(self, tree: WordTree) -> WordPaths:
        """:func:`word_paths` of ``tree``, built once."""
        if self._paths is None or self._paths[0] is not tree:
            self._paths = (tree, word_paths(tree))
        return self._paths[1]

    def use_paths(self, tree: WordTree, paths: WordPaths) -> None:
        """Train ``tree``'s layers on ``paths`` instead of its own (a benchmark's altered table)."""
        self._paths = (tree, paths)

    def advise(self, *arrays: np.ndarray) -> None:
        """:func:`hlbl.memory.prefer_huge_pages` for the arrays not advised yet.

        Collapsing is cheap on memory already collapsed, but where the kernel cannot find huge pages
        each try may compact memory; so each buffer is tried once."""
        todo = [a for a in arrays if (a.ctypes.data, a.nbytes) not in self._advised]
        prefer_huge_pages(*todo)
        self._advised.update((a.ctypes.data, a.nbytes) for a in todo)

    def __call__(
        self, model, optimizer: torch.optim.Optimizer, stream: np.ndarray, pad: int, cfg, epoch: int, show: bool
    ) -> tuple[float, float]:
        """Drop-in for :func:`hlbl.engine.train_epoch`: one epoch (a pass, or its share of one:
        :func:`hlbl.data.epoch_span`) in the same seeded order; returns (mean NLL, words/s).

        With one thread the steps are exactly the PyTorch path's, bit-reproducible under a seed.
        With ``threads=T > 1``, thread r takes steps r+1, r+1+T, ... on the shared parameters
        without locks (Hogwild): each step is still an exact minibatch step, but it may read rows
        another thread is writing, so results vary slightly from run to run. With a ``mixer``,
        process r of W (each calls this with the same arguments and state, one thread each) takes
        global minibatches r, r + W, ... and the processes average the rows they touched every
        ``mixer.every`` steps and at the end (:class:`hlbl.sync.Sync`), so that they return with the same
        state; the loss and words/s returned are global. Parameters and optimiser state are
        caught up (exact) at return."""
        return self.train(model, optimizer, stream, pad, cfg, epoch, show, Probe())

    def train(self, model, optimizer, stream: np.ndarray, pad: int, cfg, epoch: int, show: bool, probe: Probe):
        """:meth:`__call__` with a benchmark's :class:`Probe` (its ``stats`` filled in)."""
        why = unsupported(model, optimizer, cfg)
        if why:
            raise ValueError(f"the fast engine cannot train this model: {why}")
        stream = _check_stream(stream, pad, model.config.vocab_size)
        mixer = self.mixer
        sched = _schedule(len(stream), cfg, epoch, self.threads, probe.max_batches, probe.block, mixer)
        shared = _shared(self, model, optimizer, sched)
        T, B, n = sched.T, sched.B, shared.params.C.shape[0]
        # Each thread reads its windows (CHUNK_STEPS steps, T apart; W global minibatches apart between
        # processes) through its own reader: the stream itself, or for a long one its current groups of
        # blocks in a bounded buffer (data.EpochReader).
        readers = [
            EpochReader(stream, sched.order, n, pad, max_window=T * CHUNK_STEPS * B * sched.world) for _ in range(T)
        ]
        # No steps: compiles the kernel (first use after install, ~20 s) or loads it from numba's
        # cache before the progress bar and the clock start, so neither counts compilation.
        tokens, none = readers[0].window(0, 0)
        sync = _sync(shared, mixer, self._sync_buffers) if sched.world > 1 else None
        with compile_logged("the training kernels"):
            train_steps(
                np.empty(0, np.int64), none, 0, B, tokens, pad, *shared.kernel_args(0), sched.S, shared.clocks[0]
            )
            if sync is not None:
                sync.prepare()
        bar = progress(sched.seen * sched.world, f"epoch {epoch}", "w", show)  # a bar, or a line every few seconds
        rounds = _rounds(sched, mixer)
        sent = mixer.bytes_sent if mixer is not None else 0
        begin = time.perf_counter()
        try:
            with torch.no_grad():
                total, steps_s, rest_s = _train_rounds(sched, shared, readers, pad, bar, rounds, sync)
        finally:  # (after an interruption too: the biases' progress is not lost)
            _keep_biases(model, shared)
        elapsed = time.perf_counter() - begin
        _record_stats(probe.stats, shared, sched, steps_s, rest_s)
        bar.close()
        seen = sched.seen
        if sched.world > 1:
            total, seen, elapsed = mixer.totals(total, seen, elapsed)
            self.sync_stats = {
                "rounds": len(rounds),
                "seconds": rest_s,  # this process's, at the rounds' ends: catch-up, exchange, waits
                "bytes_a_round": (mixer.bytes_sent - sent) / len(rounds),
                "overlap": mixer.overlap,
            }
        if not math.isfinite(total):
            total = math.inf
        return total / max(seen, 1), seen / elapsed

    def token_log_probs(self, model, stream: np.ndarray, pad: int, threads: int | None = None) -> np.ndarray:
        """(N,) float64 log P of every token of ``stream`` given its context (the fast scorer;
        ``threads``: numba's, default PyTorch's count)."""
        why = unsupported(model)
        if why:
            raise ValueError(f"the fast engine cannot score this model: {why}")
        set_numba_threads(threads)
        stream = np.asarray(_check_stream(stream, pad, model.config.vocab_size))
        self.advise(_np(model.R.weight), _np(model.out.weight))
        weights = (_np(model.R.weight), _np(model.C), _np(model.out.weight), _np(model.out.bias))
        paths = self.word_paths(model.out.tree)
        with torch.no_grad():  # (the scorer of the numpy model: hlbl.numpy_model owns it)
            return score_stream((*weights, paths), stream, pad, SCORE_CHUNK)


def train_epoch(
    model, optimizer: torch.optim.Optimizer, stream: np.ndarray, pad: int, cfg, epoch: int, show: bool
) -> tuple[float, float]:
    """One epoch of a :class:`FastEngine` of its own (``cfg.hogwild`` threads): the engine
    signature of :mod:`hlbl.engine`, for a single epoch (a training loop keeps one engine)."""
    return FastEngine()(model, optimizer, stream, pad, cfg, epoch, show)


def _train_rounds(
    sched: _Schedule, shared: _Shared, readers, pad: int, bar, rounds: list[tuple[int, int]], sync: Sync | None
) -> tuple[float, float, float]:
    """The epoch's steps round by round, each round ending with every row caught up (and, with
    several processes, the averaged rows); returns the summed NLL, the seconds in steps and the
    seconds in catch-up and synchronisation."""
    T = sched.T
    total, steps_s, rest_s = 0.0, 0.0, 0.0
    with ThreadPoolExecutor(T) as pool:
        for i, (first, last) in enumerate(rounds):

            def run(r: int) -> float:
                return _thread_steps(r, sched, shared, readers[r], pad, bar, first, last)

            t0 = time.perf_counter()
            total += run(0) if T == 1 else sum(pool.map(run, range(T)))
            t1 = time.perf_counter()
            if sync is not None:
                touched = sync.touched(first, stepped=sched.steps > first)
            list(pool.map(lambda r: _catch_up_share(r, sched, shared, last), range(T)))
            if sync is not None:
                sync.advance_dense(last - max(first, min(last, sched.steps)))  # a share that ended early
                sync.finish(touched, last, final=i == len(rounds) - 1)
            steps_s, rest_s = steps_s + (t1 - t0), rest_s + (time.perf_counter() - t1)
    return total, steps_s, rest_s


def token_log_probs(model, stream: np.ndarray, pad: int, threads: int | None = None) -> np.ndarray:
    """(N,) float64 log P of every token of ``stream`` given its context (:meth:`FastEngine.token_log_probs`)."""
    return FastEngine().token_log_probs(model, stream, pad, threads)


def scorer(model, device="cpu") -> Callable[[np.ndarray, int], np.ndarray] | None:
    """The fast scoring function for ``model`` on ``device``, or None where it does not apply."""
    if torch.device(device).type != "cpu" or unsupported(model) is not None:
        return None
    engine = FastEngine()
    return lambda stream, pad: engine.token_log_probs(model, stream, pad)
