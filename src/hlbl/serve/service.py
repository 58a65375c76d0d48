"""What ``hlbl serve`` answers, without the web layer: a trained run loaded once, and the queries
of the JSON API on it (next words, sentence scores, samples, and the word tree).

Every method takes plain Python values that :mod:`hlbl.serve.app` has already checked against
:class:`Limits`, and returns JSON-ready dicts. Nothing here reads a file after :meth:`Service.load`.
The model is only read, so one :class:`Service` may answer from several threads at once.

On the CPU a run of the fast engine's kind is served as a :class:`~hlbl.numpy_model.NumpyLBL`
(numpy arrays and the numba kernels: the server starts without importing torch); any other run,
a mixture, or another device, as the torch model. The answers are the same numbers either way
(``tests/test_serve.py`` compares them).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..data import text_lines
from ..errors import CheckpointError, DataError, HlblError
from ..numpy_model import NumpyLBL, sample_words
from ..run import Run, RunRecord
from ..scoring import encode_context, is_sentence, score_report, score_sentences
from ..search import TreeSearch, layer_tree_arrays


@dataclass(frozen=True)
class Limits:
    """Bounds on what one request may ask (each checked before any work is done)."""

    max_body: int = 1 << 20  # bytes of a request body
    max_text: int = 10_000  # characters of a context or prompt
    max_k: int = 1000  # words per prediction
    max_tokens: int = 1000  # words per generated sample
    max_sentences: int = 1000  # sentences per score request
    max_page: int = 1000  # words per page of a node's word list
    max_temperature: float = 100.0


class NotFound(HlblError, LookupError):
    """A node or word the model does not have, or a tree query on a model without a tree."""


def _finite(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


class TreeIndex:
    """Lookups on a :class:`~hlbl.tree.WordTree` that the explorer needs, built once in O(N).

    Leaves are also laid out depth-first (left subtree first), where every subtree's leaves form
    one contiguous range ``dfs_words[lo[j] : lo[j] + size[j]]``: the words below a node are then a
    slice, not a walk."""

    def __init__(self, tree, counts: np.ndarray):
        ch = tree.children
        N = tree.num_nodes
        self.tree = tree
        self.counts = counts
        self.parent = np.full(N, -1, dtype=np.int64)
        self.side = np.full(N, -1, dtype=np.int8)  # 1: its parent's left child, 0: right (bits' convention)
        for s, bit in ((0, 1), (1, 0)):
            m = ch[:, s] >= 0
            self.parent[ch[m, s]] = np.flatnonzero(m)
            self.side[ch[m, s]] = bit
        self.depth = np.zeros(N, dtype=np.int64)
        for lv in tree.levels[1:]:
            self.depth[lv] = self.depth[self.parent[lv]] + 1
        size = np.zeros(N, dtype=np.int64)  # leaves below each node, bottom-up
        for nodes in reversed(tree.levels):
            c = ch[nodes]
            size[nodes] = np.where(c >= 0, size[np.clip(c, 0, None)], 1).sum(1)
        self.size = size
        lo = np.zeros(N, dtype=np.int64)
        dfs = np.empty(int(size[0]), dtype=np.int64)
        for nodes in tree.levels:  # top-down: a node's range is known before its children's
            left, right = ch[nodes, 0], ch[nodes, 1]
            left_size = np.where(left >= 0, size[np.clip(left, 0, None)], 1)
            starts = (lo[nodes], lo[nodes] + left_size)
            for kid, start in ((left, starts[0]), (right, starts[1])):
                inner = kid >= 0
                lo[kid[inner]] = start[inner]
                dfs[start[~inner]] = -1 - kid[~inner]
        self.lo = lo
        self.dfs_words = dfs

    def words_below(self, node: int) -> np.ndarray:
        """Distinct words with a leaf below ``node``, most frequent first (ids are frequency ranks)."""
        return np.unique(self.dfs_words[self.lo[node] : self.lo[node] + self.size[node]])


class Service:
    """A trained run, loaded once, answering the API's queries.

    With a ``mixture`` (:class:`hlbl.mixture.Mixture`, whose first run is ``model``), scores and
    next words are the mixture's: a prediction reads the mixture's longer history
    (:attr:`n_read` words) and ranks its full distribution, V n-gram lookups a context; samples
    and the tree explorer stay the first run's.

    ``blank_lines``: the rule :meth:`score` reads blank sentences by (None: the run's own, the one
    it was trained with; ``hlbl serve --blank-lines``)."""

    def __init__(
        self,
        model,
        vocab,
        record: RunRecord,
        run: Path,
        which: str = "best",
        limits: Limits = Limits(),
        mixture=None,
        blank_lines: str | None = None,
    ):
        self.numpy = isinstance(model, NumpyLBL)  # torch is not imported for it
        self.model = model if self.numpy else model.eval()
        self.mixture = mixture
        self.vocab = vocab
        self.record = record  # the run's (hlbl.run.RunRecord)
        self.text = record.text.reading(blank_lines)  # the protocol scores are read by
        self.blank_lines = self.text.blank_lines
        self.run = Path(run)
        self.which = which
        self.limits = limits
        self.n = model.config.context
        self.n_read = mixture.context_size if mixture is not None else self.n  # words a prediction reads
        self.device = "cpu" if self.numpy else next(model.parameters()).device
        self.counts = np.asarray(vocab.counts, dtype=np.int64)
        tree = model.tree
        self.index = TreeIndex(tree, self.counts) if tree is not None else None
        self.search = self._tree_search()
        self.model_info = self._model_info()
        self._word_json: dict[int, bytes] = {}  # word id -> its JSON string (the words answered so far)

    def _tree_search(self) -> TreeSearch | None:
        """The tree search with its arrays and scratch kept between requests (a few contexts per
        call: most of ``model.topk``'s time would otherwise go to setting them up); CPU only."""
        m = self.model
        if self.numpy:
            return TreeSearch(m.tree, m.Q, m.qb, m.arrays)
        from ..output import TreeSoftmax

        if isinstance(m.out, TreeSoftmax) and self.device.type == "cpu":
            return TreeSearch(m.out.tree, m.out.weight, m.out.bias, layer_tree_arrays(m.out))
        return None

    def _node_rows(self, nodes) -> tuple[np.ndarray, np.ndarray]:
        """(weights (len(nodes), d), biases (len(nodes),)) of these tree nodes as numpy arrays:
        only these rows are read (and, for a model on a GPU, copied): O(len(nodes) d)."""
        rows = np.asarray(nodes, dtype=np.int64)
        if self.numpy:
            return self.model.Q[rows], self.model.qb[rows]
        import torch

        idx = torch.as_tensor(rows, device=self.device)
        out = self.model.out
        return out.weight.detach()[idx].cpu().numpy(), out.bias.detach()[idx].cpu().numpy()

    def _context_vectors(self, contexts: list[list[int]]) -> np.ndarray:
        """r_hat (B, d) of encoded contexts (B, n), in the model's dtype (float32), as a numpy array."""
        if self.numpy:
            return self.model.context_vectors(np.asarray(contexts, dtype=np.int64).reshape(len(contexts), self.n))
        import torch

        ctx = torch.tensor(contexts, dtype=torch.int64, device=self.device).view(len(contexts), self.n)
        with torch.inference_mode():
            return self.model.context_vector(ctx).cpu().numpy()

    def warm_up(self) -> None:
        """Run each kind of query once, so that the numba kernels are compiled (or loaded from their
        cache) before the first request, which would otherwise wait seconds for them."""
        start = [self.vocab.eos] * self.n
        self.topk([[self.vocab.eos] * self.n_read], 10)
        self._scores([""])
        sample_words(self.model, [], 1, self.vocab.eos, 0, 1.0, False)
        if self.index is not None:
            self.p_left(start, [0])

    @classmethod
    def load(
        cls, run, which: str = "best", device: str = "cpu", limits: Limits = Limits(), blank_lines: str | None = None
    ) -> Service:
        run = Run.open(run)
        model = run.numpy_model(which) if str(device) == "cpu" else None
        if model is None:
            model = run.model(which, device)
        return cls(model, run.vocab, run.record, run.path, which, limits, blank_lines=blank_lines)

    @classmethod
    def from_mixture(cls, mixture, limits: Limits = Limits(), blank_lines: str | None = None) -> Service:
        """A service answering with a mixture whose weights are set (hlbl.mixture); ``blank_lines``
        as ``hlbl score`` reads the mixture's text (None: the first run's rule)."""
        first = mixture.components[0]
        record = Run.open(first.path).record
        return cls(first.model, mixture.vocab, record, first.path, first.which, limits, mixture, blank_lines)

    # ---- model description ----------------------------------------------------------------

    def _model_info(self) -> dict:
        cfg, record = self.model.config, self.record
        epochs = Run(self.run).metrics(lenient=True)  # a log for display: an unreadable line is skipped
        valid = [v for v in (_finite(e.get("valid_ppl")) for e in epochs) if v is not None]
        test = [v for v in (_finite(e.get("test_ppl", e.get("test_perplexity"))) for e in epochs) if v is not None]
        try:  # the final report of `hlbl train`, where the run has one (a description: never an error here)
            report = Run(self.run).report() or {}
        except CheckpointError:
            report = {}
        reported = _finite(report.get("test_perplexity"))
        tree = self.model.tree
        out = {
            "run": self.run.name,
            "weights": self.which,
            "corpus": record.corpus.spec,
            "vocab_size": len(self.vocab),
            "dim": cfg.dim,
            "context": cfg.context,
            "full_context": cfg.full_context,
            "output": cfg.output,
            "parameters": self.model.num_parameters(),
            "recipe": record.train.to_json(),
            "epochs": len(epochs),
            # Best validation perplexity (the weights `best` holds); test perplexity when the run records one.
            "valid_perplexity": min(valid) if valid else None,
            "test_perplexity": reported if reported is not None else (test[-1] if test else None),
            "tree": None,
            "text": self.text.to_json(),  # the run's text protocol, with the blank-line rule scores are read by
        }
        if self.mixture is not None:  # predictions and scores are the mixture's; the rest is the run's
            fitted = self.mixture.fitted_on or {}
            out["mixture"] = {"components": self.mixture.describe(), "valid_perplexity": fitted.get("perplexity")}
        if tree is not None:
            out["tree"] = {
                "kind": record.options.tree,
                "fingerprint": tree.fingerprint(),
                **tree.stats(self.counts.astype(np.float64)),
            }
        return out

    # ---- next words, scores, samples ----------------------------------------------------------

    def context_ids(self, text: str) -> tuple[list[int], int, list[str]]:
        """The model's context for ``text`` (the start of a sentence): the last n words' ids,
        <eos>-padded; how many of those words are out of the vocabulary; and the words as read."""
        ids, oov = encode_context(self.vocab, text.split()[-self.n :] if self.n else [], self.n)
        return ids, oov, self.vocab.decode(ids)

    def context(self, text: str) -> tuple[list[int], int]:
        """What a prediction reads of ``text``: :meth:`context_ids` of the last :attr:`n_read` words
        (a mixture's n-gram model may read more words than the run), without the words."""
        m = self.n_read
        return encode_context(self.vocab, text.split()[-m:] if m else [], m)

    def topk(self, contexts: list[list[int]], k: int) -> tuple[list[list[float]], list[list[int]]]:
        """Exact top-k (probabilities, word ids) for a batch of encoded contexts: ``model.topk``'s."""
        if self.mixture is not None:
            lp, idx = self.mixture.topk(contexts, k)
            return np.exp(lp).tolist(), idx.tolist()
        if self.search is None:
            import torch

            ctx = torch.tensor(contexts, dtype=torch.int64, device=self.device).view(len(contexts), self.n)
            values, idx = self.model.topk(ctx, k)
            return values.double().exp().cpu().tolist(), idx.cpu().tolist()
        h = self._context_vectors(contexts)
        values, idx = self.search.topk(h.astype(np.float64), k)
        # model.topk returns the log-probabilities in the context vectors' dtype: rounded the same way.
        return np.exp(values.astype(h.dtype).astype(np.float64)).tolist(), idx.tolist()

    def prediction(self, context_words: list[str], oov: int, probs: list[float], ids: list[int]) -> dict:
        return {"context": context_words, "oov": oov, "words": self.vocab.decode(ids), "probs": probs}

    def prediction_json(self, context: list[int], oov: int, probs: list[float], ids: list[int]) -> bytes:
        """:meth:`prediction` as compact UTF-8 JSON (what ``json.dumps`` writes), from the context's
        word ids: the words' JSON strings are encoded once each and reused, floats written as
        ``json`` writes them (``repr``), at about a third of ``json.dumps``'s time."""
        if not all(map(math.isfinite, probs)):  # json's allow_nan=False error, as elsewhere
            json.dumps(probs, allow_nan=False)
        cache = self._word_json
        words = self.vocab.words

        def enc(i: int) -> bytes:
            b = cache.get(i)
            if b is None:
                b = cache[i] = json.dumps(words[i], ensure_ascii=False).encode("utf-8")
            return b

        return b'{"context":[%b],"oov":%d,"words":[%b],"probs":[%b]}' % (
            b",".join([enc(i) for i in context]),
            oov,
            b",".join([enc(i) for i in ids]),
            ",".join(map(float.__repr__, probs)).encode(),
        )

    def predict(self, text: str, k: int) -> dict:
        ids, oov = self.context(text)
        probs, idx = self.topk([ids], k)
        return self.prediction(self.vocab.decode(ids), oov, probs[0], idx[0])

    def _scores(self, sentences: list[str]) -> list:
        if self.mixture is not None:
            return self.mixture.score(sentences)
        return score_sentences(self.model, self.vocab, sentences, device=self.device)

    def score(self, sentences: list[str]) -> dict:
        """The ``hlbl score`` protocol: each sentence alone, its words then <eos>, from an all-<eos>
        context; a blank one is, as there, an empty sentence (``keep``) or none (``drop``: null in
        its place, so the answer lines up with the request, and counted in the totals'
        ``blank_lines_dropped``)."""
        kept = [is_sentence(s, self.blank_lines) for s in sentences]
        if not any(kept):
            raise DataError("no sentences to score: every one is blank, and blank lines are dropped (blank_lines drop)")
        scores = self._scores([s for s, k in zip(sentences, kept) if k])
        answers = iter(scores)
        total = {**score_report(scores), "blank_lines": self.blank_lines, "blank_lines_dropped": kept.count(False)}
        return {"sentences": [next(answers)._asdict() if k else None for k in kept], "total": total}

    def generate(self, prompt: str, tokens: int, seed: int, temperature: float, per_node: bool) -> dict:
        words = prompt.split()
        ids, oov = self.vocab.encode_counting_oov(words)
        sample = self.vocab.decode(sample_words(self.model, ids, tokens, self.vocab.eos, seed, temperature, per_node))
        # As `hlbl generate` prints it: the prompt as typed, then the sample; every <eos> ends a line.
        lines = text_lines(words + sample)
        return {
            "prompt_oov": oov,
            "words": sample,
            "text": "\n".join(lines),
            "seed": seed,
            "temperature": temperature,
            "per_node_temperature": per_node,
        }

    # ---- the tree ---------------------------------------------------------------------------

    def _tree(self) -> TreeIndex:
        if self.index is None:
            raise NotFound(f"this model has no word tree ({self.model.config.output} output)")
        return self.index

    def _node(self, node: int) -> int:
        ix = self._tree()
        if not 0 <= node < ix.tree.num_nodes:
            raise NotFound(f"no internal node {node} (ids 0..{ix.tree.num_nodes - 1})")
        return node

    def word_id(self, word: str) -> int:
        i = self.vocab.index.get(word)
        if i is None:
            raise NotFound(f"{word!r} is not in the vocabulary")
        return i

    def p_left(self, context: list[int], nodes) -> np.ndarray:
        """P(left at j | context) = sigmoid(h . q_j + b_j) for each node j, in float64."""
        h = self._context_vectors([context])[0].astype(np.float64)
        weight, bias = self._node_rows(nodes)
        s = weight.astype(np.float64) @ h + bias.astype(np.float64)
        return 0.5 * (1.0 + np.tanh(0.5 * s))  # sigmoid without overflow in exp(-s)

    def decisions(self, context: list[int], nodes: list[int]) -> dict:
        """P(left) at each of ``nodes`` for a context (the explorer's bars)."""
        self._tree()
        for j in nodes:
            self._node(j)
        return {"nodes": nodes, "p_left": self.p_left(context, nodes).tolist() if nodes else []}

    def _child(self, c: int, top: int) -> dict:
        ix = self.index
        if c < 0:
            w = -1 - c
            return {
                "kind": "leaf",
                "word": self.vocab.words[w],
                "id": w,
                "count": int(self.counts[w]),
                "codes": int(ix.tree.codes_per_word[w]),
            }
        below = ix.words_below(c)
        return {
            "kind": "node",
            "node": c,
            "leaves": int(ix.size[c]),
            "words": len(below),
            "top": self.vocab.decode(below[:top]),
        }

    def tree_summary(self) -> dict:
        ix = self._tree()
        return {"root": 0, "nodes": ix.tree.num_nodes, "leaves": int(ix.size[0]), "stats": self.model_info["tree"]}

    def node(self, node: int, context: list[int] | None = None, top: int = 5) -> dict:
        """A node: its place (depth, parent, side), what lies below, and its two children; with
        a context, P(left) at it and at its internal children."""
        ix = self.index
        node = self._node(node)
        below = ix.words_below(node)
        kids = [self._child(int(c), top) for c in ix.tree.children[node]]
        out = {
            "node": node,
            "depth": int(ix.depth[node]),
            "parent": None if node == 0 else int(ix.parent[node]),
            "side": None if node == 0 else ("left" if ix.side[node] == 1 else "right"),
            "leaves": int(ix.size[node]),
            "words": len(below),
            "top": self.vocab.decode(below[:top]),
            "children": kids,
        }
        if context is not None:
            inner = [node] + [k["node"] for k in kids if k["kind"] == "node"]
            p = self.p_left(context, inner).tolist()
            out["p_left"] = p[0]
            for kid in kids:
                if kid["kind"] == "node":
                    kid["p_left"] = p[inner.index(kid["node"])]
        return out

    def node_words(self, node: int, offset: int, limit: int) -> dict:
        node = self._node(node)
        below = self.index.words_below(node)
        page = below[offset : offset + limit]
        return {
            "node": node,
            "total": len(below),
            "offset": offset,
            "words": [{"word": self.vocab.words[w], "id": int(w), "count": int(self.counts[w])} for w in page],
        }

    def word(self, word: str) -> dict:
        """A word's codes: the nodes and decisions (1 = left) from the root to each of its leaves."""
        tree = self._tree().tree
        w = self.word_id(word)
        codes = [{"nodes": nodes, "bits": bits, "depth": len(nodes)} for nodes, bits in tree.codes(w)]
        return {
            "word": word,
            "id": w,
            "count": int(self.counts[w]),
            "codes": codes,
            "depths": [c["depth"] for c in codes],
        }

    def path(self, context: list[int], word: str) -> dict:
        """For a context, the decisions on the way to ``word``: P(left) at each node of each of
        its codes, the probability of the branch taken, and of the whole path; P(word) is the sum
        over its paths."""
        tree = self._tree().tree
        w = self.word_id(word)
        codes = tree.codes(w)
        p = self.p_left(context, [j for nodes, _ in codes for j in nodes])
        paths, at, total = [], 0, 0.0
        for nodes, bits in codes:
            pl = p[at : at + len(nodes)]
            at += len(nodes)
            taken = np.where(np.asarray(bits) == 1, pl, 1.0 - pl)
            prob = float(np.prod(taken))
            total += prob
            paths.append({"nodes": nodes, "bits": bits, "p_left": pl.tolist(), "p_taken": taken.tolist(), "prob": prob})
        return {"word": word, "id": w, "prob": total, "paths": paths}


__all__ = ["Limits", "NotFound", "Service", "TreeIndex"]
