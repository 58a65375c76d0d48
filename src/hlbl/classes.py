"""Word classes as data: the structure of a two-level tree (the class-based factorisation).

Layout::

                                root softmax over S + C entries
          /          |           \\            \\
     "the"  ...  "of"          class 0  ...   class C-1       S shortlist words: leaves of the root
                               /  |  \\          /  \\
                           "cat" "dog" ...   "sat" "ran"      C classes: a softmax over members

    P(w | h) = sum over the memberships m of w of P(root entry of m | h) * P(m | its class, h)

A word may be a member of several classes, and of the shortlist too (several codes): its
probability is the exact sum over its memberships. Memberships ("leaves") are numbered shortlist
first (``0..S-1``), then class 0's members in the order listed, then class 1's, and so on; the
output layer (:class:`hlbl.output.ClassSoftmax`) keeps one vector and bias per root entry
and one per class member, in that order, so the order of a file is part of the model (its
:meth:`WordClasses.fingerprint` covers it).

Invariants (checked on construction): word ids are integers in ``0..V-1``; the shortlist has no
repeated word; every class is non-empty and has no repeated word; every word has at least one
membership; the root has at least two entries.

Builders: :func:`frequency_classes` (Mikolov's frequency binning: each class holds about 1/C of the
training tokens; needs no trained model) and :func:`kmeans_classes` (k-means on word features, e.g.
the mean context vectors of a trained run, :func:`hlbl.treebuild.features_from_run`).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Sequence

import numpy as np

from .atomic import atomic_path
from .errors import TreeError
from .files import refuse_special
from .progress import progress

CLASSES_FORMAT = "hlbl-word-classes"
CLASSES_VERSION = 1


def _ids(value, what: str, num_words: int) -> np.ndarray:
    """A list of word ids as int64, or a one-line TreeError naming ``what``."""
    if not isinstance(value, (list, tuple, np.ndarray)):
        raise TreeError(f"{what} must be a list of word ids, not {type(value).__name__}")
    if isinstance(value, np.ndarray):
        if value.ndim != 1 or (value.size and value.dtype.kind not in "iu"):
            raise TreeError(f"{what} must be a flat list of integer word ids")
        arr = value.astype(np.int64)
    else:
        for x in value:
            if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
                raise TreeError(f"{what} must hold integer word ids, found {x!r}")
        arr = np.asarray(value, dtype=np.int64).reshape(-1)
    bad = arr[(arr < 0) | (arr >= num_words)]
    if len(bad):
        raise TreeError(f"{what} has word id {int(bad[0])}, outside 0..{num_words - 1}")
    if len(np.unique(arr)) != len(arr):
        u, c = np.unique(arr, return_counts=True)
        raise TreeError(f"{what} lists word {int(u[c > 1][0])} twice")
    return arr


@dataclass(frozen=True, eq=False)
class WordClasses:
    """An immutable, validated two-level word tree: a shortlist and C classes (module docstring)."""

    num_words: int
    shortlist: np.ndarray  # (S,) int64 word ids under the root
    classes: tuple  # C arrays (n_c,) int64: each class's members, in parameter order
    _checked: bool = field(default=False, repr=False)

    def __post_init__(self):
        if isinstance(self.num_words, bool) or not isinstance(self.num_words, (int, np.integer)):
            raise TreeError(f"num_words must be an integer, not {self.num_words!r}")
        V = int(self.num_words)
        object.__setattr__(self, "num_words", V)
        if V < 2:
            raise TreeError(f"word classes need at least 2 words, got {V}")
        if not isinstance(self.classes, (list, tuple)):
            raise TreeError(f"classes must be a list of lists of word ids, not {type(self.classes).__name__}")
        short = _ids(self.shortlist, "the shortlist", V)
        classes = tuple(_ids(c, f"class {i}", V) for i, c in enumerate(self.classes))
        for i, c in enumerate(classes):
            if len(c) == 0:
                raise TreeError(f"class {i} is empty")
        if len(short) + len(classes) < 2:
            raise TreeError(
                f"the root needs at least two entries, got {len(short)} shortlist words and {len(classes)} classes"
            )
        have = np.bincount(np.concatenate([short, *classes]), minlength=V)
        missing = np.flatnonzero(have == 0)
        if len(missing):
            raise TreeError(f"word {int(missing[0])} is in no class nor the shortlist ({len(missing)} words are not)")
        for a in (short, *classes):
            a.setflags(write=False)
        object.__setattr__(self, "shortlist", short)
        object.__setattr__(self, "classes", classes)
        object.__setattr__(self, "_checked", True)

    # ---- derived arrays ---------------------------------------------------------------------

    @property
    def num_shortlist(self) -> int:
        return len(self.shortlist)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def num_root(self) -> int:
        """Entries of the root softmax: S shortlist words, then C classes."""
        return self.num_shortlist + self.num_classes

    @cached_property
    def class_sizes(self) -> np.ndarray:
        """(C,) members per class."""
        return np.array([len(c) for c in self.classes], dtype=np.int64)

    @cached_property
    def class_start(self) -> np.ndarray:
        """(C + 1,) offsets of each class's members among the class leaves (leaf id - S)."""
        return np.concatenate([[0], np.cumsum(self.class_sizes)]).astype(np.int64)

    @cached_property
    def leaf_word(self) -> np.ndarray:
        """(L,) word of each leaf: the S shortlist leaves, then every class's members in order."""
        return np.concatenate([self.shortlist, *self.classes]).astype(np.int64)

    @cached_property
    def leaf_root(self) -> np.ndarray:
        """(L,) root entry above each leaf: i for shortlist leaf i, S + c for a member of class c."""
        S = self.num_shortlist
        return np.concatenate([np.arange(S), S + np.repeat(np.arange(self.num_classes), self.class_sizes)]).astype(
            np.int64
        )

    @property
    def num_leaves(self) -> int:
        return len(self.leaf_word)

    @cached_property
    def word_leaves(self) -> np.ndarray:
        """(V, K) leaf ids of each word, -1-padded; K = the most memberships of a word."""
        order = np.argsort(self.leaf_word, kind="stable")
        w = self.leaf_word[order]
        counts = np.bincount(w, minlength=self.num_words)
        start = np.concatenate([[0], np.cumsum(counts)[:-1]])
        out = np.full((self.num_words, int(counts.max())), -1, dtype=np.int64)
        out[w, np.arange(len(w)) - start[w]] = order
        return out

    @property
    def codes_per_word(self) -> np.ndarray:
        return np.bincount(self.leaf_word, minlength=self.num_words)

    def stats(self, counts: Sequence[float] | None = None) -> dict:
        """Sizes, and under ``counts`` (else uniform over words) the mean number of scores one
        training example computes (root entries + the members of its class, summed over codes:
        the cost of a step relative to the flat softmax's V)."""
        p = np.ones(self.num_words) if counts is None else np.asarray(counts, dtype=np.float64)
        if len(p) != self.num_words:
            raise TreeError(f"{len(p)} counts for word classes of {self.num_words} words")
        S = self.num_shortlist
        leaf_cost = np.where(self.leaf_root < S, 0, self.class_sizes[np.maximum(self.leaf_root - S, 0)])
        word_cost = np.bincount(self.leaf_word, weights=leaf_cost, minlength=self.num_words)
        return {
            "words": self.num_words,
            "shortlist": S,
            "classes": self.num_classes,
            "leaves": self.num_leaves,
            "largest_class": int(self.class_sizes.max()) if self.num_classes else 0,
            "codes_per_word": float(p @ self.codes_per_word / p.sum()),
            "mean_scores_per_word": float(self.num_root + p @ word_cost / p.sum()),
            "weighting": "uniform" if counts is None else "unigram",
        }

    # ---- files ------------------------------------------------------------------------------

    def fingerprint(self) -> str:
        """SHA-256 of the structure in order (the order of members is the order of parameters)."""
        h = hashlib.sha256(CLASSES_FORMAT.encode())
        h.update(np.int64(self.num_words).tobytes())
        h.update(np.ascontiguousarray(self.shortlist, dtype="<i8").tobytes())
        h.update(np.ascontiguousarray(self.class_sizes, dtype="<i8").tobytes())
        h.update(np.ascontiguousarray(self.leaf_word, dtype="<i8").tobytes())
        return h.hexdigest()

    def to_json(self) -> dict:
        return {
            "format": CLASSES_FORMAT,
            "version": CLASSES_VERSION,
            "num_words": self.num_words,
            "shortlist": self.shortlist.tolist(),
            "classes": [c.tolist() for c in self.classes],
        }

    @classmethod
    def from_json(cls, obj) -> "WordClasses":
        if not isinstance(obj, dict) or obj.get("format") != CLASSES_FORMAT:
            raise TreeError(f"not hlbl word classes (expected format {CLASSES_FORMAT!r})")
        if obj.get("version") != CLASSES_VERSION:
            raise TreeError(
                f"word classes version {obj.get('version')} is not supported (this hlbl reads {CLASSES_VERSION})"
            )
        for key in ("num_words", "shortlist", "classes"):
            if key not in obj:
                raise TreeError(f"malformed word classes: no {key!r}")
        return cls(obj["num_words"], obj["shortlist"], obj["classes"])

    def save(self, path: str | os.PathLike) -> None:
        """Write JSON, atomically."""
        path = Path(path)
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            f.write(json.dumps(self.to_json()).encode())

    @classmethod
    def load(cls, path: str | os.PathLike) -> "WordClasses":
        path = Path(path)
        refuse_special(path, TreeError, "a word classes file")
        if not path.is_file():
            raise TreeError(f"{path}: no such word classes file")
        try:
            obj = json.loads(path.read_text(encoding="utf-8"))
        except Exception as e:  # a damaged or foreign file
            raise TreeError(f"{path}: not a readable word classes file ({type(e).__name__}: {e})") from None
        try:
            return cls.from_json(obj)
        except TreeError as e:
            raise TreeError(f"{path}: {e}") from None


def is_classes_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a JSON file that says it holds word classes (cheap check, for messages)."""
    refuse_special(path, TreeError, "a tree or word classes file")
    try:
        obj = json.loads(Path(path).read_text(encoding="utf-8"))
    except Exception:
        return False
    return isinstance(obj, dict) and obj.get("format") == CLASSES_FORMAT


# ---- builders -------------------------------------------------------------------------------


def _check_sizes(num_words: int, num_classes: int, shortlist: int) -> None:
    for name, v in (("num_classes", num_classes), ("shortlist", shortlist)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TreeError(f"{name} must be an integer, got {v!r}")
    if num_classes < 1:
        raise TreeError(f"num_classes must be at least 1, got {num_classes}")
    if not 0 <= shortlist <= num_words - 1:
        raise TreeError(f"shortlist must be in 0..{num_words - 1} (at least one word in a class), got {shortlist}")
    if num_classes > num_words - shortlist:
        raise TreeError(f"num_classes {num_classes} is more than the {num_words - shortlist} words left to classes")
    if shortlist + num_classes < 2:
        raise TreeError("the root needs at least two entries: num_classes + shortlist >= 2")


def _by_frequency(counts: np.ndarray) -> np.ndarray:
    """Word ids by decreasing count, ties by lower id."""
    return np.lexsort((np.arange(len(counts)), -counts))


def frequency_classes(counts: Sequence[float], num_classes: int, shortlist: int = 0) -> WordClasses:
    """Mikolov's frequency binning: the ``shortlist`` most frequent words under the root, the
    rest, by decreasing count, cut into consecutive classes of about equal token mass.

    Frequent words get small classes and rare words large ones, so a training step computes about
    ``S + C + V / C`` scores on average. A word heavier than 1/C of the mass would leave a class
    empty: the cut points are then moved so that every class keeps at least one word (exactly
    ``num_classes`` classes)."""
    c = np.asarray(counts, dtype=np.float64)
    V = len(c)
    if not np.isfinite(c).all() or (c < 0).any():
        raise TreeError("frequency classes need finite, non-negative counts")
    _check_sizes(V, num_classes, shortlist)
    order = _by_frequency(c)
    short, rest = order[:shortlist], order[shortlist:]
    mass = np.maximum(c[rest], 0.5)  # unseen words weigh half a count, as in init_unigram
    before = (np.cumsum(mass) - mass) / mass.sum()  # mass before each word, in [0, 1)
    cls = np.minimum((before * num_classes).astype(np.int64), num_classes - 1)
    # Cuts as the first word of each class, made strictly increasing and leaving a word for each
    # later class: the i-th cut lies in [i, len(rest) - (C - i)].
    n = len(rest)
    cuts = np.searchsorted(cls, np.arange(num_classes), side="left")
    cuts[0] = 0
    for i in range(1, num_classes):
        cuts[i] = min(max(cuts[i], cuts[i - 1] + 1), n - (num_classes - i))
    bounds = np.append(cuts, n)
    return WordClasses(V, short, [rest[bounds[i] : bounds[i + 1]] for i in range(num_classes)])


def _sq_dist(X: np.ndarray, M: np.ndarray) -> np.ndarray:
    """(n, k) squared distances, clipped at 0 (cancellation)."""
    return np.maximum((X * X).sum(1)[:, None] - 2 * X @ M.T + (M * M).sum(1)[None, :], 0.0)


def kmeans(X: np.ndarray, k: int, seed: int = 0, iters: int = 30, weights: np.ndarray | None = None) -> np.ndarray:
    """(k, d) centres by Lloyd's k-means (k-means++ start, seeded); empty clusters are restarted
    at the point farthest from its centre. ``weights`` (n,) weight the points."""
    rng = np.random.default_rng(seed)
    n = len(X)
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64)
    centres = np.empty((k, X.shape[1]))
    # Progress in distance columns (every point to one centre), the cost of each step: seeding
    # takes k, a Lloyd round k; so the time left is right from the start (k-means of 10^4 words
    # into 10^3 classes runs for a minute or more).
    bar = progress(k * (1 + iters), "k-means", "columns", heartbeat=True)
    centres[0] = X[rng.choice(n, p=w / w.sum())]
    d2 = _sq_dist(X, centres[:1])[:, 0]
    for i in range(1, k):
        p = w * d2
        centres[i] = X[rng.choice(n, p=p / p.sum()) if p.sum() > 0 else rng.integers(n)]
        d2 = np.minimum(d2, _sq_dist(X, centres[i : i + 1])[:, 0])
        bar.update(1)
    try:
        return _lloyd(X, w, centres, iters, bar)
    finally:
        bar.close()


def _lloyd(X: np.ndarray, w: np.ndarray, centres: np.ndarray, iters: int, bar) -> np.ndarray:
    """Lloyd's rounds from ``centres`` until they stop moving or ``iters`` have run."""
    n, k = len(X), len(centres)
    for _ in range(iters):
        bar.update(k)
        D = _sq_dist(X, centres)
        a = D.argmin(1)
        sums = np.zeros_like(centres)
        np.add.at(sums, a, X * w[:, None])
        mass = np.bincount(a, weights=w, minlength=k)
        new = centres.copy()
        full = mass > 0
        new[full] = sums[full] / mass[full, None]
        far = np.argsort(-D[np.arange(n), a])
        for j, empty in enumerate(np.flatnonzero(~full)):
            new[empty] = X[far[j]]
        if np.allclose(new, centres):
            centres = new
            break
        centres = new
    return centres


def kmeans_classes(
    X: np.ndarray,
    num_classes: int,
    seed: int = 0,
    counts: Sequence[float] | None = None,
    shortlist: int = 0,
    eps: float = 0.0,
    max_codes: int = 1,
    iters: int = 30,
    weighted: bool = False,
) -> WordClasses:
    """Classes from k-means on word features ``X`` (V, d), e.g. mean context vectors.

    ``shortlist`` > 0 puts the most frequent words (by ``counts``) under the root and clusters
    the rest. Several memberships: with ``max_codes`` > 1 a word also joins each next-nearest
    class whose responsibility under a spherical Gaussian mixture on the k-means centres (one
    shared variance) is at least ``eps`` (the analogue of the paper's ADAPTIVE(eps)), up to
    ``max_codes`` classes. ``weighted`` weights words by ``counts`` in k-means. Classes are
    listed by decreasing token mass, members by decreasing count (ties: lower id)."""
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or not np.isfinite(X).all():
        raise TreeError("word features must be a finite (V, d) array")
    V = len(X)
    c = np.ones(V) if counts is None else np.asarray(counts, dtype=np.float64)
    if c.shape != (V,):
        raise TreeError(f"{len(c)} counts for {V} words")
    if shortlist and counts is None:
        raise TreeError("a shortlist needs word counts (its words are the most frequent)")
    _check_sizes(V, num_classes, shortlist)
    if not 0.0 <= eps <= 1.0:
        raise TreeError(f"eps must be in [0, 1], got {eps}")
    if isinstance(max_codes, bool) or not isinstance(max_codes, (int, np.integer)) or max_codes < 1:
        raise TreeError(f"max_codes must be an integer >= 1, got {max_codes!r}")
    order = _by_frequency(c)
    short, rest = order[:shortlist], np.sort(order[shortlist:])
    Xr = X[rest]
    centres = kmeans(Xr, num_classes, seed, iters, np.maximum(c[rest], 0.5) if weighted else None)
    D = _sq_dist(Xr, centres)  # (n, C)
    nearest = D.argmin(1)
    member = np.zeros(D.shape, dtype=bool)
    member[np.arange(len(rest)), nearest] = True
    if max_codes > 1 and eps > 0:
        var = max(D[np.arange(len(rest)), nearest].mean() / X.shape[1], 1e-12)  # shared variance per dimension
        logr = -D / (2 * var)
        resp = np.exp(logr - logr.max(1, keepdims=True))
        resp /= resp.sum(1, keepdims=True)
        rank = np.argsort(-resp, axis=1, kind="stable")[:, :max_codes]
        take = np.take_along_axis(resp, rank, 1) >= eps
        rows = np.repeat(np.arange(len(rest)), rank.shape[1])
        member[rows[take.reshape(-1)], rank.reshape(-1)[take.reshape(-1)]] = True
    classes = []
    for j in range(num_classes):
        words = rest[member[:, j]]
        if len(words):
            classes.append(words[_by_frequency(c[words])])
    classes.sort(key=lambda ws: (-np.maximum(c[ws], 0.5).sum(), int(ws[0])))
    return WordClasses(V, short, classes)


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
