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
thousands of noisy estimates picks the overestimated ones (on PTB, with 32 occurrences a word, the
500 moves chosen raised the training NLL instead of lowering it). So each estimate carries its
standard error (sampling without replacement), and moves are ranked by the gain less ``sigmas``
standard errors; words seen at most ``per_word`` times are scored on every occurrence, exactly.

Moves are then taken greedily by that cautious gain: one per word, at most ``max_moves``, no class
left empty, and at most ``into_class`` moves into any one class. The gains are measured against the
classes before the sweep, so moves into one class interact through its softmax: on PTB a sweep
whose 500 moves sent dozens of verbs into the class that the previous sweep had emptied of verbs
(its root entry still predicted verb contexts) was estimated to gain 11,309 nats and lost 24,466.
The exchange algorithm proper moves one word at a time; one move into each class per sweep keeps
that property where it matters, and several sweeps (``sweeps``) make up the count.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .classes import WordClasses
from .data import contexts
from .errors import TreeError
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


@torch.no_grad()
def exchange_sweep(model, stream: np.ndarray, pad: int, cfg: RefineConfig = RefineConfig(), log=None) -> Sweep:
    """One sweep of exchange moves over the class memberships of ``model`` (``classes`` output)."""
    out = model.out
    cl = getattr(out, "classes", None)
    if not isinstance(cl, WordClasses):
        raise TreeError("exchange moves need a model with --output classes")
    if len(stream) == 0:
        raise TreeError("exchange moves need a non-empty training stream")
    S, C, V = cl.num_shortlist, cl.num_classes, cl.num_words
    starts = cl.class_start
    W = out.word_weight.detach()  # (M, d)
    b = out.word_bias.detach()  # (M,)
    dt = W.dtype

    pos, wts = sample_positions(stream, V, cfg.per_word, cfg.seed)
    counts = np.bincount(np.asarray(stream), minlength=V)  # (V,) occurrences of each word as a target
    tgt = np.asarray(stream, dtype=np.int64)[pos]
    P = len(pos)
    H = torch.empty(P, model.config.dim, dtype=dt)
    total = torch.empty(P, dtype=torch.float64)  # log P(target | h) now
    root_lp = torch.empty(P, S + C, dtype=dt)
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
    wt = torch.from_numpy(wts)
    # positions of each word: pos is ordered by word
    n_w = np.bincount(tgt, minlength=V)
    w_start = np.concatenate([[0], np.cumsum(n_w)])

    def rows_of(words: np.ndarray) -> np.ndarray:
        if len(words) == 0:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([np.arange(w_start[w], w_start[w + 1]) for w in words])

    # Candidates: for each class membership, the classes with the highest mean root log-probability
    # over its word's occurrences, other than the word's own classes.
    class_lp = torch.zeros(V, C, dtype=torch.float64).index_add_(0, torch.from_numpy(tgt), root_lp[:, S:].double())
    class_lp /= torch.from_numpy(np.maximum(n_w, 1)).double()[:, None]
    M = cl.num_leaves - S
    member_word = cl.leaf_word[S:]  # (M,)
    member_class = cl.leaf_root[S:] - S  # (M,)
    own = np.zeros((V, C), dtype=bool)
    own[member_word, member_class] = True
    scored = class_lp[member_word].masked_fill(torch.from_numpy(own[member_word]), float("-inf"))  # (M, C)
    K = min(cfg.candidates, C - 1)
    cand = torch.topk(scored, K, dim=1).indices.numpy() if K > 0 else np.zeros((M, 0), dtype=np.int64)
    cand_ok = np.isfinite(np.take_along_axis(scored.numpy(), cand, 1))  # a word in every class has none

    # Pass 1, class by class: the log-probability of each sampled occurrence's membership in the
    # class (for rho and for the own term's "rest"), and the leave term of each member.
    leave = torch.zeros(M, dtype=torch.float64)
    mem_lp: dict[int, torch.Tensor] = {}  # member row -> (n_w,) log-prob of that membership at w's rows
    pools: dict[int, tuple] = {}  # class -> its members' sampled rows, their log Z_c and rho (pass 2's join)
    for c in range(C):
        a, e = int(starts[c]), int(starts[c + 1])
        words = member_word[a:e]
        rows = torch.from_numpy(rows_of(words))
        if len(rows) == 0:
            continue
        s = H[rows] @ W[a:e].T + b[a:e]  # (n, |c|)
        logZ = torch.logsumexp(s, dim=1, keepdim=True)
        p = torch.exp(s - logZ)  # (n, |c|) within-class softmax
        col_word = torch.from_numpy(words)
        is_tgt = col_word[None, :] == torch.from_numpy(tgt)[rows][:, None]  # (n, |c|) the target's own column
        lp_c = (torch.log((p * is_tgt).sum(1)) + root_lp[rows, S + c]).double()  # (n,) membership log-prob
        rho = torch.exp(lp_c - total[rows]).clamp(max=1.0)
        pools[c] = (rows, logZ[:, 0], rho)
        pd = p.double().clamp(max=1 - 1e-12)
        gain = torch.log1p(rho[:, None] * pd / (1 - pd)).masked_fill(is_tgt, 0.0)  # (n, |c|)
        leave[a:e] = (wt[rows][:, None] * gain).sum(0)
        off = 0
        for m, w in zip(range(a, e), words):
            n = int(n_w[w])
            mem_lp[m] = lp_c[off : off + n]
            off += n

    # Pass 2, class by class: the own and join terms of every membership that has c as a candidate.
    best_gain = np.full(M, -np.inf)
    best_score = np.full(M, -np.inf)  # gain - sigmas x its standard error: what moves are ranked by
    best_se = np.zeros(M)
    best_dest = np.full(M, -1, dtype=np.int64)
    pairs_by_class: list[list[int]] = [[] for _ in range(C)]
    for m in range(M):
        for k in range(K):
            if cand_ok[m, k]:
                pairs_by_class[int(cand[m, k])].append(m)
    bar = progress(C, "refine: classes", "classes") if log else None
    for c in range(C):
        movers = np.asarray(pairs_by_class[c], dtype=np.int64)
        if bar:
            bar.update(1)
        if len(movers) == 0:
            continue
        a, e = int(starts[c]), int(starts[c + 1])
        mv = torch.from_numpy(movers)
        # join: the class's members' occurrences (none sampled: no term), their normaliser grows by x = exp(s_m)
        join = torch.zeros(len(movers), dtype=torch.float64)
        if c in pools:
            rows, logZ, rho = pools[c]
            x = torch.exp((H[rows] @ W[mv].T + b[mv]) - logZ[:, None]).double()  # (n, movers)
            join = (wt[rows][:, None] * torch.log1p(-rho[:, None] * x / (1 + x))).sum(0)  # (movers,)
        # own: each mover's occurrences with the membership under c, all movers at once
        word_of = member_word[movers]
        seg = torch.repeat_interleave(torch.arange(len(movers)), torch.from_numpy(n_w[word_of]))  # mover of each row
        r = torch.from_numpy(rows_of(word_of))
        hs = H[r]
        z = torch.logsumexp(hs @ W[a:e].T + b[a:e], dim=1).double()  # log Z_c at the movers' occurrences
        sm = ((hs * W[mv][seg]).sum(1) + b[mv][seg]).double()  # the mover's own score
        new_m = root_lp[r, S + c].double() + sm - torch.logaddexp(z, sm)  # its membership's log-prob under c
        tot = total[r]
        ratio = torch.exp(torch.cat([mem_lp[int(m)] for m in movers]) - tot).clamp(max=1.0)
        rest = tot + torch.log1p(-ratio.clamp(max=1 - 1e-12))  # log-prob of the word's other memberships
        rest = torch.where(ratio >= 1 - 1e-9, torch.full_like(rest, float("-inf")), rest)
        x = torch.logaddexp(rest, new_m) - tot  # (rows,) change of each sampled occurrence's log-prob
        own_gain = torch.zeros(len(movers), dtype=torch.float64).index_add_(0, seg, wt[r] * x)
        # The own term's standard error (sampling without replacement from the word's N occurrences):
        # a frequent word's estimate from a few occurrences is noisy, and taking the best of many
        # noisy estimates favours the overestimated ones.
        n = torch.from_numpy(n_w[word_of]).double()  # sampled occurrences
        N = torch.from_numpy(counts[word_of]).double()  # all occurrences
        mean = torch.zeros(len(movers), dtype=torch.float64).index_add_(0, seg, x) / n.clamp(min=1)
        ss = torch.zeros(len(movers), dtype=torch.float64).index_add_(0, seg, (x - mean[seg]) ** 2)
        var = ss / (n - 1).clamp(min=1)
        se = (N * torch.sqrt(var / n.clamp(min=1) * (1 - n / N.clamp(min=1)).clamp(min=0))).numpy()
        gains = (own_gain + join + leave[mv]).numpy()
        score = gains - cfg.sigmas * se
        better = score > best_score[movers]
        best_score[movers[better]] = score[better]
        best_gain[movers[better]] = gains[better]
        best_se[movers[better]] = se[better]
        best_dest[movers[better]] = c
    if bar:
        bar.close()

    # Greedy choice: best (cautious) gains first, one move per word, no class emptied.
    order = np.argsort(-best_score, kind="stable")
    limit = max(1, int(cfg.max_moves * M))
    sizes = cl.class_sizes.copy()
    arrivals = np.zeros(C, dtype=np.int64)
    moved_words: set[int] = set()
    moves: list[Move] = []
    for m in order:
        g = best_gain[m]
        if not best_score[m] > cfg.min_gain or len(moves) >= limit:
            break
        w, src, dst = int(member_word[m]), int(member_class[m]), int(best_dest[m])
        if w in moved_words or sizes[src] <= 1 or arrivals[dst] >= cfg.into_class:
            continue
        arrivals[dst] += 1
        sizes[src] -= 1
        sizes[dst] += 1
        moved_words.add(w)
        moves.append(Move(w, S + int(m), src, dst, float(g)))
    classes, leaf_map = apply_moves(cl, moves)
    return Sweep(classes, leaf_map, moves, best_gain, best_se, best_dest, P)


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


def carry_output(src_out, dst_out, leaf_map: np.ndarray) -> None:
    """Copy a class layer's parameters into one over the moved classes: root entries unchanged,
    each member row from the old leaf it came from (``leaf_map``)."""
    S = src_out.classes.num_shortlist
    rows = torch.from_numpy(leaf_map[S:] - S)
    with torch.no_grad():
        dst_out.root_weight.copy_(src_out.root_weight)
        dst_out.root_bias.copy_(src_out.root_bias)
        dst_out.word_weight.copy_(src_out.word_weight[rows])
        dst_out.word_bias.copy_(src_out.word_bias[rows])


def match_leaves(old: WordClasses, new: WordClasses) -> np.ndarray:
    """(L_new,) the old leaf of each new leaf, for classes that differ from ``old`` only by moved
    memberships (the same shortlist, number of classes and memberships per word): a membership in a
    class the word was already in keeps its row; the others take the word's remaining old rows in
    order. A one-line TreeError otherwise."""
    why = None
    if old.num_words != new.num_words:
        why = f"{new.num_words} words, the source {old.num_words}"
    elif not np.array_equal(old.shortlist, new.shortlist):
        why = "a different shortlist"
    elif old.num_classes != new.num_classes:
        why = f"{new.num_classes} classes, the source {old.num_classes}"
    elif not np.array_equal(old.codes_per_word, new.codes_per_word):
        why = "a different number of memberships for some words"
    if why:
        raise TreeError(f"the classes are not the source's up to moved memberships: {why}")
    S = old.num_shortlist
    by_pair = {(int(w), int(r)): leaf for leaf, (w, r) in enumerate(zip(old.leaf_word, old.leaf_root))}
    leaf_map = np.full(new.num_leaves, -1, dtype=np.int64)
    used = np.zeros(old.num_leaves, dtype=bool)
    for leaf, (w, r) in enumerate(zip(new.leaf_word, new.leaf_root)):
        o = by_pair.get((int(w), int(r)))
        if o is not None:
            leaf_map[leaf], used[o] = o, True
    spare: dict[int, list[int]] = {}
    for o in np.flatnonzero(~used):
        spare.setdefault(int(old.leaf_word[o]), []).append(int(o))
    for leaf in np.flatnonzero(leaf_map < 0):
        leaf_map[leaf] = spare[int(new.leaf_word[leaf])].pop(0)
    assert np.all(leaf_map[:S] == np.arange(S))
    return leaf_map
