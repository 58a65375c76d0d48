"""Exchange moves: refine word classes on the trained model's own objective (``hlbl tree refine``).

Learned classes come from clustering word features, a proxy for what the model is trained on: the
negative log-likelihood (NLL) of the training split. An *exchange move* (the exchange algorithm of
class n-gram models, Kneser & Ney 1993, and of Brown clustering) takes one membership of a word w
out of its class a and puts it in another class c, every parameter held fixed: w's member vector
q and bias b move with it. With ``x(h) = exp(h.q + b)`` and ``Z_c(h)`` the sum of the member
scores' exponentials in class c, the move changes the training log-likelihood by three sums:

    own:   over w's occurrences:  log of w's probability with the membership under c, minus now
           (the membership's share becomes P(c | h) x(h) / (Z_c(h) + x(h)))
    join:  over the occurrences of c's members w':  log(1 - rho (1 - 1 / (1 + x / Z_c)))
    leave: over the occurrences of a's other members: log(1 + rho p / (1 - p)),  p = x / Z_a

where rho is the posterior share of the occurrence's membership in that class (1 for a word in one
class). For a word in one class the three sums are exact (tests compare them with the NLL computed
before and after the move).

Cost, so that a sweep scales: each word contributes at most ``per_word`` sampled occurrences
(their sums are scaled to the word's count), and each membership is scored only against its
``candidates`` most likely classes (the classes with the highest mean root log-probability over its
occurrences). A sweep scores the sampled occurrences of each class's members and of its candidate
words against that class's members: O(sampled occurrences x candidates x class size x d), about
sqrt(V) per occurrence and candidate, never V^2.

A frequent word's own term is estimated from its sampled occurrences, and taking the best of
thousands of noisy estimates picks the overestimated ones: with few occurrences a word, the moves
chosen can raise the training NLL instead of lowering it. So each estimate carries its
standard error (sampling without replacement), and moves are ranked by the gain less ``sigmas``
standard errors; words seen at most ``per_word`` times are scored on every occurrence, exactly.

Moves are then taken greedily by that cautious gain: one per word, at most ``max_moves``, no class
left empty, and at most ``into_class`` moves into any one class. The gains are measured against the
classes before the sweep, so moves into one class interact through its softmax: dozens of words
sent into one class (say verbs into a class whose root entry still predicts verb contexts) each
take probability from the others, and together lose what each was estimated to gain.
The exchange algorithm proper moves one word at a time; one move into each class per sweep keeps
that property where it matters, and several sweeps (``sweeps``) make up the count.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from .classes import WordClasses
from .data import contexts
from .errors import TreeError
from .output.classes import carry_output
from .progress import progress


@dataclass(frozen=True)
class RefineConfig:
    """One sweep of exchange moves (module docstring)."""

    per_word: int = 256  # occurrences sampled per word (all of them for rarer words)
    candidates: int = 4  # classes each membership is scored against
    max_moves: float = 0.05  # most moves in a sweep: this share of the class memberships
    min_gain: float = 0.0  # least gain (nats over the training split) for a move
    sigmas: float = 2.0  # a move's gain less this many standard errors must exceed min_gain
    into_class: int = 1  # most moves into one class in a sweep (their gains interact through its softmax)
    seed: int = 0
    batch_size: int = 8192

    def __post_init__(self):
        if self.sigmas < 0:
            raise ValueError(f"sigmas must be >= 0, got {self.sigmas}")
        if self.per_word < 1 or self.candidates < 1 or self.batch_size < 1 or self.into_class < 1:
            raise ValueError("per_word, candidates, into_class and batch_size must be at least 1")
        if not 0.0 < self.max_moves <= 1.0:
            raise ValueError(f"max_moves must be in (0, 1], got {self.max_moves}")


@dataclass(frozen=True)
class Move:
    """Membership ``leaf`` (old leaf id) of ``word`` goes from class ``source`` to ``dest``."""

    word: int
    leaf: int
    source: int
    dest: int
    gain: float  # estimated increase of the training log-likelihood, nats


@dataclass
class Sweep:
    """What a sweep measured and chose; ``classes`` is the structure after the moves, ``leaf_map``
    (L_new,) the old leaf id of each new leaf (the rows to carry the output layer over)."""

    classes: WordClasses
    leaf_map: np.ndarray
    moves: list[Move]
    gain: np.ndarray  # (M,) estimated gain of each class membership's best move (-inf: none scored)
    se: np.ndarray  # (M,) the standard error of its own-occurrences term (0 when all were scored)
    dest: np.ndarray  # (M,) its destination class (-1: none)
    sampled: int  # occurrences scored

    @property
    def positive(self) -> int:
        """Memberships whose best move has a positive estimated gain."""
        return int((self.gain > 0).sum())


def sample_positions(stream: np.ndarray, num_words: int, per_word: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(positions (P,) int64, weights (P,) float64): up to ``per_word`` positions of each word as a
    target, drawn without replacement, each weighted by count / sampled so that a weighted sum
    estimates the sum over all the word's occurrences. Ordered by word."""
    tgt = np.asarray(stream, dtype=np.int64)
    key = np.random.default_rng(seed).random(len(tgt))
    order = np.lexsort((key, tgt))  # by word, then a random key
    counts = np.bincount(tgt, minlength=num_words)
    start = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rank = np.arange(len(tgt)) - start[tgt[order]]  # rank of each position within its word
    keep = order[rank < per_word]
    taken = np.minimum(counts, per_word)
    w = tgt[keep]
    return keep, counts[w] / taken[w]


@dataclass
class _Sample:
    """The sampled occurrences of the training targets (P of them, ordered by word) and what the
    model computes at each; the sweep's sums run over these rows."""

    tgt: np.ndarray  # (P,) int64 target word
    wt: torch.Tensor  # (P,) float64 weight: the word's count / its sampled occurrences
    H: torch.Tensor  # (P, d) context vector
    total: torch.Tensor  # (P,) float64 log P(target | h) now
    root_lp: torch.Tensor  # (P, S + C) log-softmax of the root (shortlist words, then classes)
    n_w: np.ndarray  # (V,) sampled occurrences of each word
    counts: np.ndarray  # (V,) all occurrences of each word as a target
    w_start: np.ndarray = field(init=False)  # (V + 1,) each word's first row

    def __post_init__(self):
        self.w_start = np.concatenate([[0], np.cumsum(self.n_w)])

    def rows_of(self, words: np.ndarray) -> np.ndarray:
        """The rows of ``words``' occurrences, word after word."""
        if len(words) == 0:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([np.arange(self.w_start[w], self.w_start[w + 1]) for w in words])


@dataclass
class _Within:
    """Pass 1's results: what each class's own members' occurrences say about moves out of it."""

    leave: torch.Tensor  # (M,) float64 the leave term of each membership
    mem_lp: dict[int, torch.Tensor]  # membership -> (n_w,) its log-prob at its word's rows
    pools: dict[int, tuple]  # class -> its members' rows, their log Z_c (n,) and rho (n,) (pass 2's join)


@dataclass
class _Best:
    """Each membership's best move so far (M,), ranked by gain - sigmas x its standard error."""

    gain: np.ndarray
    score: np.ndarray
    se: np.ndarray
    dest: np.ndarray

    @classmethod
    def empty(cls, M: int) -> "_Best":
        return cls(np.full(M, -np.inf), np.full(M, -np.inf), np.zeros(M), np.full(M, -1, dtype=np.int64))

    def offer(self, movers: np.ndarray, gains: np.ndarray, se: np.ndarray, sigmas: float, c: int) -> None:
        """Moves of ``movers`` into class ``c``: kept where their score beats the best so far."""
        score = gains - sigmas * se
        better = score > self.score[movers]
        self.score[movers[better]] = score[better]
        self.gain[movers[better]] = gains[better]
        self.se[movers[better]] = se[better]
        self.dest[movers[better]] = c


def _classes_of(model, stream: np.ndarray) -> WordClasses:
    """The model's word classes, or a one-line TreeError where there are none to refine."""
    cl = getattr(model.out, "classes", None)
    if not isinstance(cl, WordClasses):
        raise TreeError(f"exchange moves need a model with the classes output layer, not {model.config.output}")
    if model.out.member_proj is not None:
        raise TreeError("exchange moves need the members' scores to read h itself (a class layer without member_dim)")
    if len(stream) == 0:
        raise TreeError("exchange moves need a non-empty training stream")
    return cl


def _sample(model, stream: np.ndarray, pad: int, cl: WordClasses, cfg: RefineConfig, log) -> _Sample:
    """Samples the occurrences (:func:`sample_positions`) and runs the model at each, in batches."""
    out, V = model.out, cl.num_words
    pos, wts = sample_positions(stream, V, cfg.per_word, cfg.seed)
    tgt = np.asarray(stream, dtype=np.int64)[pos]
    P, dt = len(pos), out.word_weight.dtype
    H = torch.empty(P, model.config.dim, dtype=dt)
    total = torch.empty(P, dtype=torch.float64)
    root_lp = torch.empty(P, cl.num_shortlist + cl.num_classes, dtype=dt)
    bar = progress(P, "refine: contexts", "w") if log else None
    for i in range(0, P, cfg.batch_size):
        j = min(i + cfg.batch_size, P)
        ctx = torch.from_numpy(contexts(stream, pos[i:j], model.config.context, pad))
        h = model.context_vector(ctx)
        H[i:j] = h
        t = torch.from_numpy(tgt[i:j])
        total[i:j] = out.target_log_prob(h, t).double()
        root_lp[i:j] = torch.log_softmax(h @ out.root_weight.T + out.root_bias, dim=1)
        if bar:
            bar.update(j - i)
    if bar:
        bar.close()
    counts = np.bincount(np.asarray(stream), minlength=V)
    return _Sample(tgt, torch.from_numpy(wts), H, total, root_lp, np.bincount(tgt, minlength=V), counts)


def _candidates(sample: _Sample, cl: WordClasses, candidates: int) -> tuple[np.ndarray, np.ndarray]:
    """(cand (M, K), ok (M, K)): for each class membership, the classes with the highest mean root
    log-probability over its word's occurrences, other than the word's own classes; ``ok`` is False
    where there are fewer such classes (a word in every class has none)."""
    S, C, V = cl.num_shortlist, cl.num_classes, cl.num_words
    class_lp = torch.zeros(V, C, dtype=torch.float64).index_add_(
        0, torch.from_numpy(sample.tgt), sample.root_lp[:, S:].double()
    )
    class_lp /= torch.from_numpy(np.maximum(sample.n_w, 1)).double()[:, None]
    M = cl.num_leaves - S
    member_word = cl.leaf_word[S:]  # (M,)
    own = np.zeros((V, C), dtype=bool)
    own[member_word, cl.leaf_root[S:] - S] = True
    scored = class_lp[member_word].masked_fill(torch.from_numpy(own[member_word]), float("-inf"))  # (M, C)
    K = min(candidates, C - 1)
    cand = torch.topk(scored, K, dim=1).indices.numpy() if K > 0 else np.zeros((M, 0), dtype=np.int64)
    return cand, np.isfinite(np.take_along_axis(scored.numpy(), cand, 1))


def _within_classes(sample: _Sample, cl: WordClasses, W: torch.Tensor, b: torch.Tensor) -> _Within:
    """Pass 1, class by class: the log-probability of each sampled occurrence's membership in the
    class (for rho and for the own term's "rest"), and the leave term of each member."""
    S, starts = cl.num_shortlist, cl.class_start
    member_word = cl.leaf_word[S:]
    H, tgt, wt, n_w = sample.H, sample.tgt, sample.wt, sample.n_w
    found = _Within(torch.zeros(cl.num_leaves - S, dtype=torch.float64), {}, {})
    for c in range(cl.num_classes):
        a, e = int(starts[c]), int(starts[c + 1])
        words = member_word[a:e]
        rows = torch.from_numpy(sample.rows_of(words))
        if len(rows) == 0:
            continue
        s = H[rows] @ W[a:e].T + b[a:e]  # (n, |c|)
        logZ = torch.logsumexp(s, dim=1, keepdim=True)
        p = torch.exp(s - logZ)  # (n, |c|) within-class softmax
        col_word = torch.from_numpy(words)
        is_tgt = col_word[None, :] == torch.from_numpy(tgt)[rows][:, None]  # (n, |c|) the target's own column
        lp_c = (torch.log((p * is_tgt).sum(1)) + sample.root_lp[rows, S + c]).double()  # (n,) membership log-prob
        rho = torch.exp(lp_c - sample.total[rows]).clamp(max=1.0)
        found.pools[c] = (rows, logZ[:, 0], rho)
        pd = p.double().clamp(max=1 - 1e-12)
        gain = torch.log1p(rho[:, None] * pd / (1 - pd)).masked_fill(is_tgt, 0.0)  # (n, |c|)
        found.leave[a:e] = (wt[rows][:, None] * gain).sum(0)
        off = 0
        for m, w in zip(range(a, e), words):
            n = int(n_w[w])
            found.mem_lp[m] = lp_c[off : off + n]
            off += n
    return found


def _gains_into(
    c: int, movers: np.ndarray, sample: _Sample, within: _Within, cl: WordClasses, W: torch.Tensor, b: torch.Tensor
) -> tuple[np.ndarray, np.ndarray]:
    """(gains (movers,), se (movers,)): the estimated gain of moving each of ``movers`` (membership
    rows) into class ``c`` (own + join + leave terms, module docstring), and the standard error of
    its own term."""
    S = cl.num_shortlist
    a, e = int(cl.class_start[c]), int(cl.class_start[c + 1])
    H, wt, n_w = sample.H, sample.wt, sample.n_w
    mv = torch.from_numpy(movers)
    # join: the class's members' occurrences (none sampled: no term), their normaliser grows by x = exp(s_m)
    join = torch.zeros(len(movers), dtype=torch.float64)
    if c in within.pools:
        rows, logZ, rho = within.pools[c]
        x = torch.exp((H[rows] @ W[mv].T + b[mv]) - logZ[:, None]).double()  # (n, movers)
        join = (wt[rows][:, None] * torch.log1p(-rho[:, None] * x / (1 + x))).sum(0)  # (movers,)
    # own: each mover's occurrences with the membership under c, all movers at once
    word_of = cl.leaf_word[S:][movers]
    seg = torch.repeat_interleave(torch.arange(len(movers)), torch.from_numpy(n_w[word_of]))  # mover of each row
    r = torch.from_numpy(sample.rows_of(word_of))
    hs = H[r]
    z = torch.logsumexp(hs @ W[a:e].T + b[a:e], dim=1).double()  # log Z_c at the movers' occurrences
    sm = ((hs * W[mv][seg]).sum(1) + b[mv][seg]).double()  # the mover's own score
    new_m = sample.root_lp[r, S + c].double() + sm - torch.logaddexp(z, sm)  # its membership's log-prob under c
    tot = sample.total[r]
    ratio = torch.exp(torch.cat([within.mem_lp[int(m)] for m in movers]) - tot).clamp(max=1.0)
    rest = tot + torch.log1p(-ratio.clamp(max=1 - 1e-12))  # log-prob of the word's other memberships
    rest = torch.where(ratio >= 1 - 1e-9, torch.full_like(rest, float("-inf")), rest)
    x = torch.logaddexp(rest, new_m) - tot  # (rows,) change of each sampled occurrence's log-prob
    own_gain = torch.zeros(len(movers), dtype=torch.float64).index_add_(0, seg, wt[r] * x)
    # The own term's standard error (sampling without replacement from the word's N occurrences):
    # a frequent word's estimate from a few occurrences is noisy, and taking the best of many
    # noisy estimates favours the overestimated ones.
    n = torch.from_numpy(n_w[word_of]).double()  # sampled occurrences
    N = torch.from_numpy(sample.counts[word_of]).double()  # all occurrences
    mean = torch.zeros(len(movers), dtype=torch.float64).index_add_(0, seg, x) / n.clamp(min=1)
    ss = torch.zeros(len(movers), dtype=torch.float64).index_add_(0, seg, (x - mean[seg]) ** 2)
    var = ss / (n - 1).clamp(min=1)
    se = (N * torch.sqrt(var / n.clamp(min=1) * (1 - n / N.clamp(min=1)).clamp(min=0))).numpy()
    return (own_gain + join + within.leave[mv]).numpy(), se


def _choose(cl: WordClasses, best: _Best, cfg: RefineConfig) -> list[Move]:
    """Greedy choice: best (cautious) gains first, one move per word, no class emptied, at most
    ``cfg.into_class`` moves into a class and ``cfg.max_moves`` of the memberships in all."""
    S = cl.num_shortlist
    M = cl.num_leaves - S
    member_word, member_class = cl.leaf_word[S:], cl.leaf_root[S:] - S
    order = np.argsort(-best.score, kind="stable")
    limit = max(1, int(cfg.max_moves * M))
    sizes = cl.class_sizes.copy()
    arrivals = np.zeros(cl.num_classes, dtype=np.int64)
    moved_words: set[int] = set()
    moves: list[Move] = []
    for m in order:
        g = best.gain[m]
        if not best.score[m] > cfg.min_gain or len(moves) >= limit:
            break
        w, src, dst = int(member_word[m]), int(member_class[m]), int(best.dest[m])
        if w in moved_words or sizes[src] <= 1 or arrivals[dst] >= cfg.into_class:
            continue
        arrivals[dst] += 1
        sizes[src] -= 1
        sizes[dst] += 1
        moved_words.add(w)
        moves.append(Move(w, S + int(m), src, dst, float(g)))
    return moves


@torch.no_grad()
def exchange_sweep(model, stream: np.ndarray, pad: int, cfg: RefineConfig = RefineConfig(), log=None) -> Sweep:
    """One sweep of exchange moves over the class memberships of ``model`` (``classes`` output)."""
    cl = _classes_of(model, stream)
    W = model.out.word_weight.detach()  # (M, d)
    b = model.out.word_bias.detach()  # (M,)
    sample = _sample(model, stream, pad, cl, cfg, log)
    cand, cand_ok = _candidates(sample, cl, cfg.candidates)
    within = _within_classes(sample, cl, W, b)
    # Pass 2, class by class: the own and join terms of every membership that has c as a candidate.
    M = cl.num_leaves - cl.num_shortlist
    best = _Best.empty(M)
    pairs_by_class: list[list[int]] = [[] for _ in range(cl.num_classes)]
    for m in range(M):
        for k in range(cand.shape[1]):
            if cand_ok[m, k]:
                pairs_by_class[int(cand[m, k])].append(m)
    bar = progress(cl.num_classes, "refine: classes", "classes") if log else None
    for c in range(cl.num_classes):
        movers = np.asarray(pairs_by_class[c], dtype=np.int64)
        if bar:
            bar.update(1)
        if len(movers):
            best.offer(movers, *_gains_into(c, movers, sample, within, cl, W, b), cfg.sigmas, c)
    if bar:
        bar.close()
    moves = _choose(cl, best, cfg)
    classes, leaf_map = apply_moves(cl, moves)
    return Sweep(classes, leaf_map, moves, best.gain, best.se, best.dest, len(sample.tgt))


def refine_classes(model, stream: np.ndarray, pad: int, cfg: RefineConfig = RefineConfig(), sweeps: int = 1, log=None):
    """``sweeps`` sweeps of exchange moves, each on the model after the previous sweep's moves
    (parameters carried, none retrained); returns the last :class:`Sweep` with ``moves`` and
    ``leaf_map`` covering all sweeps (relative to ``model``'s classes) and the per-sweep move counts
    and estimated gains."""
    from .model import LBL

    if sweeps < 1:
        raise ValueError(f"sweeps must be at least 1, got {sweeps}")
    history = []
    moves: list[Move] = []  # in the order made; each move's leaf id is in its own sweep's classes
    leaf_map = np.arange(model.out.classes.num_leaves)  # final leaf -> leaf of model's classes
    current = model
    for k in range(sweeps):
        sweep = exchange_sweep(current, stream, pad, RefineConfig(**{**cfg.__dict__, "seed": cfg.seed + k}), log)
        moves += sweep.moves
        leaf_map = leaf_map[sweep.leaf_map]  # composed
        history.append({"moves": len(sweep.moves), "estimated_gain_nats": float(sum(m.gain for m in sweep.moves))})
        if log:
            log(
                f"sweep {k + 1}: {len(sweep.moves)} moves, estimated gain {history[-1]['estimated_gain_nats']:.1f} nats"
            )
        if not sweep.moves:
            break
        nxt = LBL(current.config, sweep.classes, init=False).to(current.R.weight.dtype)
        with torch.no_grad():
            nxt.R.weight.copy_(current.R.weight)
            nxt.C.copy_(current.C)
        carry_output(current.out, nxt.out, sweep.leaf_map)
        current = nxt
    sweep.moves = moves
    sweep.leaf_map = leaf_map
    return sweep, history


def apply_moves(cl: WordClasses, moves: list[Move]) -> tuple[WordClasses, np.ndarray]:
    """The classes after ``moves``: a moved membership leaves its class and is appended to its
    destination; returns them with the old leaf id of every new leaf."""
    S = cl.num_shortlist
    gone = {mv.leaf for mv in moves}
    lists: list[list[int]] = []  # old leaf ids per class
    for c in range(cl.num_classes):
        a, e = int(cl.class_start[c]), int(cl.class_start[c + 1])
        lists.append([S + i for i in range(a, e) if S + i not in gone])
    for mv in moves:
        if cl.leaf_root[mv.leaf] != S + mv.source or int(cl.leaf_word[mv.leaf]) != mv.word:
            raise TreeError(f"move of word {mv.word}: leaf {mv.leaf} is not its membership in class {mv.source}")
        lists[mv.dest].append(mv.leaf)
    new = WordClasses(
        cl.num_words, cl.shortlist.copy(), tuple(cl.leaf_word[np.asarray(x, dtype=np.int64)] for x in lists)
    )
    leaf_map = np.concatenate([np.arange(S, dtype=np.int64), *[np.asarray(x, dtype=np.int64) for x in lists]])
    return new, leaf_map
