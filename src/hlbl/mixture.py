"""Mixtures of trained runs and an n-gram model: the model a user deploys when one model is not
the best they have.

A mixture gives every token the probability ``sum_k w_k p_k(token | its context)``: K components
(one or more trained runs over one vocabulary, and at most one n-gram model, always last), with
weights ``w_k >= 0`` summing to 1. It is a distribution over the runs' vocabulary when every
component is one: an n-gram model lacking some of the vocabulary's words would give each its
``<unk>`` probability, so such a model is refused (:meth:`Mixture.stream_log_probs`).

Weights are fitted on a validation split by maximum likelihood (:mod:`hlbl.ngram.mixture`:
exact bisection for two components, EM for more) and can be saved (:meth:`Mixture.save`) as a
small JSON file, read back by :meth:`Mixture.from_file` or applied to the same components by
:meth:`Mixture.use_weights_of`; both check that each file is the one the weights were fitted
with, by its SHA-256, so weights never silently meet other models.

Two protocols, as for a single model:

* a split scored as one stream (:meth:`Mixture.evaluate`, ``hlbl eval``): the runs keep
  context across lines, the n-gram model starts each line from ``<s>``; every token of the
  stream is predicted by every component, so the per-token probabilities pair one to one.
* sentences scored each alone (:meth:`Mixture.score`, ``hlbl score``): the runs from an
  all-``<eos>`` context, the n-gram model from ``<s>`` (:mod:`hlbl.scoring`).

The n-gram model's scores of a split are cached on disk by content (:mod:`hlbl.ngram.cache`).

The mixture file (JSON)::

    {"format": "hlbl-mixture", "version": 1,
     "components": [{"model": "runs/T7", "kind": "run", "path": "runs/T7", "which": "best",
                     "sha256": "<of the weights file>", "weight": 0.43}, ...,
                    {"model": "kn5.arpa", "kind": "ngram", "path": "kn5.arpa", "sha256": "...", "weight": 0.31}],
     "vocab_sha256": "...",
     "fitted_on": {"split": "valid", "data": "ptb", "blank_lines": "drop", "stream_sha256": "...",
                   "tokens": 73760, "perplexity": 121.3}}

``path`` is relative to the mixture file's directory (a directory holding the file and its
models can be moved whole); ``model`` is the name the components were given, for reports.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from . import atomic
from .errors import ConfigError, DataError
from .files import file_sha256, refuse_special
from .ngram.cache import NgramFile, words_sha256
from .scoring import SentenceScore, TokenScores, ngram_token_scores, token_scores

MIXTURE_FORMAT = "hlbl-mixture"
MIXTURE_VERSION = 1
KINDS = ("run", "ngram")
MAX_MIXTURE_BYTES = 1 << 20  # a mixture file is a few hundred bytes a component


@dataclass
class Component:
    """One model of a mixture: a trained run (``model`` an :class:`hlbl.model.LBL`) or an n-gram
    model file (``model`` an :class:`hlbl.ngram.cache.NgramFile`)."""

    name: str  # as it was given (a run directory, an n-gram file): what reports call it
    kind: str  # "run" or "ngram"
    path: Path  # the run directory or the n-gram file
    model: object
    which: str | None = None  # a run's weights: best or last
    _digest: str | None = field(default=None, repr=False)
    words: tuple[str, ...] | None = field(default=None, repr=False)  # a run's vocabulary, where known

    @property
    def weights_file(self) -> Path:
        """The file the component's parameters come from (what its digest is of)."""
        return self.path / f"{self.which}.safetensors" if self.kind == "run" else self.path

    @property
    def digest(self) -> str:
        if self._digest is None:
            self._digest = self.model.digest if self.kind == "ngram" else file_sha256(self.weights_file)
        return self._digest


def load_run_component(run: str | os.PathLike, which: str = "best", device="cpu", name: str | None = None):
    """A trained run as a component, and its vocabulary."""
    from .run import load_model

    model, vocab, _ = load_model(run, which=which, device=device)
    model.eval()
    return Component(
        str(run) if name is None else name, "run", Path(run), model, which, words=tuple(vocab.words)
    ), vocab


def ngram_component(path: str | os.PathLike, name: str | None = None) -> Component:
    """An n-gram model file as a component (read only when its scores are not in the cache)."""
    return Component(str(path) if name is None else name, "ngram", Path(path), NgramFile(path))


class Mixture:
    """Components over one vocabulary and their weights (None until :meth:`fit` or given)."""

    def __init__(
        self,
        components: Sequence[Component],
        vocab,
        weights: Sequence[float] | None = None,
        fitted_on: dict | None = None,
        device="cpu",
    ):
        kinds = [c.kind for c in components]
        if "run" not in kinds or kinds.count("ngram") > 1 or "ngram" in kinds[:-1] or len(kinds) < 2:
            raise ConfigError(
                None,
                "a mixture is one or more trained runs and at most one n-gram model (last), two models at least; "
                f"got {', '.join(kinds) or 'none'}",
            )
        for c in components:  # ids mean words: a run of other words would be scored with mismatched ids
            size = getattr(getattr(c.model, "config", None), "vocab_size", None)
            if c.kind == "run" and (
                (c.words is not None and list(c.words) != list(vocab.words))
                or (size is not None and size != len(vocab))
            ):
                raise DataError(f"{c.name}: its vocabulary differs from the mixture's; a mixture needs the same words")
        self.components = list(components)
        self.vocab = vocab
        self.device = device
        self.weights: np.ndarray | None = None
        self.source: Path | None = None  # the mixture file the weights were read from
        self._ngram_ids: np.ndarray | None = None  # the vocabulary's ids in the n-gram model (next_log_probs)
        if weights is not None:
            self.set_weights(weights)
        self.fitted_on = fitted_on  # where the weights were fitted: split, data, tokens, perplexity

    # ---- building one ----------------------------------------------------------------------

    @classmethod
    def load(
        cls,
        runs: Sequence[str | os.PathLike],
        ngram: str | os.PathLike | None = None,
        weights: Sequence[float] | float | None = None,
        which: str = "best",
        device="cpu",
    ) -> Mixture:
        """Trained runs (one vocabulary) and an optional n-gram model file. ``weights``: one per
        component, or one number for two components (the first run's share), or None (then
        :meth:`fit` or :meth:`use_weights_of`)."""
        if isinstance(runs, (str, os.PathLike)):
            runs = [runs]
        first, vocab = load_run_component(runs[0], which, device)
        components = [first]
        for run in runs[1:]:
            other, other_vocab = load_run_component(run, which, device)
            if list(other_vocab.words) != list(vocab.words):
                raise DataError(f"{run}: its vocabulary differs from {runs[0]}'s; a mixture needs the same words")
            components.append(other)
        if ngram is not None:
            components.append(ngram_component(ngram))
        return cls(components, vocab, _weight_list(weights, len(components)), device=device)

    @classmethod
    def from_file(cls, path: str | os.PathLike, device="cpu") -> Mixture:
        """The mixture a :meth:`save` wrote: its components, read from where the file says (paths
        relative to the file's directory) and checked against its digests, and its weights."""
        path = Path(path)
        spec = read_mixture_file(path)
        runs, ngram = [], None
        for c in spec["components"]:
            where = Path(c["path"]) if Path(c["path"]).is_absolute() else path.parent / c["path"]
            if c["kind"] == "ngram":
                ngram = (where, c["model"])
            else:
                runs.append((where, c["which"], c["model"]))
        first, vocab = load_run_component(runs[0][0], runs[0][1], device, runs[0][2])
        components = [first] + [load_run_component(r, w, device, n)[0] for r, w, n in runs[1:]]
        if ngram is not None:
            components.append(ngram_component(*ngram))
        mix = cls(components, vocab, device=device)
        mix.use_weights_of(path, spec)
        return mix

    def use_weights_of(self, path: str | os.PathLike, spec: dict | None = None) -> Mixture:
        """Take the weights of a mixture file whose components are these (by kind, order and
        SHA-256 of each file), with where they were fitted; a file about other models is refused."""
        path = Path(path)
        spec = read_mixture_file(path) if spec is None else spec
        theirs = spec["components"]
        if [c["kind"] for c in theirs] != [c.kind for c in self.components]:
            raise DataError(
                f"{path} mixes {_kinds(c['kind'] for c in theirs)}, these models are "
                f"{_kinds(c.kind for c in self.components)}: give the same models in the same order"
            )
        if spec.get("vocab_sha256") not in (None, words_sha256(self.vocab.words)):
            raise DataError(f"{path} was fitted on another vocabulary than {self.components[0].name}'s")
        for mine, rec in zip(self.components, theirs):
            if mine.digest != rec["sha256"]:
                what = f"{mine.which} weights" if mine.kind == "run" else "file"
                raise DataError(
                    f"{mine.name}: its {what} are not the ones {path} was fitted with (SHA-256 differs): "
                    "fit the weights again"
                )
        self.set_weights([c["weight"] for c in theirs])
        self.fitted_on = spec.get("fitted_on")
        self.source = path
        return self

    def set_weights(self, weights: Sequence[float]) -> None:
        w = np.asarray(weights, dtype=np.float64).reshape(-1)
        if len(w) != len(self.components) or not np.isfinite(w).all() or (w < 0).any() or abs(w.sum() - 1) > 1e-6:
            raise ConfigError(
                "weights",
                f"weights must be {len(self.components)} numbers >= 0 summing to 1 (one per model), "
                f"got {np.round(w, 6).tolist()}",
            )
        self.weights = w / w.sum()
        self.fitted_on = None
        self.source = None

    # ---- scoring ---------------------------------------------------------------------------

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.components]

    def describe(self) -> list[dict]:
        """``[{"model": name, "weight": w}, ...]``: the components, named, with their weights."""
        w = self._weights()
        return [{"model": c.name, "weight": float(x)} for c, x in zip(self.components, w)]

    def stream_log_probs(self, stream: np.ndarray, cache: bool = True) -> np.ndarray:
        """(K, N) natural-log probability of every token of a split stream (ids of the vocabulary)
        under each component, by the stream protocol (module doc); the n-gram model's from the
        score cache when it has them (``cache=False``: computed, not stored)."""
        from .evaluate import token_log_probs

        rows = []
        for c in self.components:
            if c.kind == "run":
                rows.append(token_log_probs(c.model, stream, self.vocab.eos, device=self.device))
                continue
            lp10, missing = c.model.stream_log10(stream, self.vocab.words, self.vocab.eos, cache)
            _refuse_missing(c, missing, len(self.vocab), self.components[0].name)
            rows.append(lp10 * math.log(10.0))
        return np.stack(rows)

    def fit(self, valid, cache: bool = True) -> Mixture:
        """Weights maximising the likelihood of a validation split: a :class:`hlbl.data.Corpus`
        (its ``valid`` split, recorded with the corpus's name and blank-line protocol) or a stream."""
        from .data import stream_fingerprint
        from .ngram.mixture import tune_weight, tune_weights

        stream = valid["valid"] if hasattr(valid, "splits") else valid
        L = self.stream_log_probs(stream, cache)
        try:
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                w = tune_weights(L) if len(L) > 2 else np.asarray([tune_weight(L[0], L[1])])
        except ValueError as e:  # a token no model gives any probability
            raise DataError(f"cannot fit the mixture weights on the valid split: {e}") from None
        self.set_weights(w if len(L) > 2 else [w[0], 1.0 - w[0]])
        mixed = self._mix(L)
        self.fitted_on = {
            "split": "valid",
            "data": getattr(valid, "name", None),
            "blank_lines": getattr(valid, "blank_lines", None),
            "stream_sha256": stream_fingerprint(stream),
            "tokens": int(len(stream)),
            "perplexity": _perplexity(mixed),
        }
        return self

    def evaluate(self, stream: np.ndarray, split: str = "test", cache: bool = True) -> dict:
        """The mixture's perplexity on a split stream: ``perplexity``, ``tokens``, ``nll`` (as
        :func:`hlbl.evaluate.perplexity_report`) and ``components``, each model named with its
        weight and its own perplexity on the split (None where it gives a token probability 0)."""
        from .evaluate import perplexity_report

        L = self.stream_log_probs(stream, cache)
        mixed = self._mix(L)
        if not np.isfinite(mixed).all():
            raise DataError(self._zero_message(L, mixed, stream, split))
        report = perplexity_report(mixed)
        report["components"] = [{**d, "perplexity": _perplexity(row)} for d, row in zip(self.describe(), L)]
        return report

    def token_scores(
        self, sentences: Iterable[str | Sequence[str]], batch_size: int = 4096, contexts: Sequence | None = None
    ) -> TokenScores:
        """Every token's mixed log-probability under the sentence protocol (module doc).
        ``contexts``: text the runs read before each sentence (:func:`hlbl.scoring.token_scores`);
        the n-gram model starts each sentence from ``<s>`` whatever precedes it."""
        sentences = list(sentences)
        parts = []
        for c in self.components:
            if c.kind == "run":
                parts.append(token_scores(c.model, self.vocab, sentences, batch_size, self.device, contexts))
            else:
                _refuse_missing(c, c.model.missing_words(self.vocab.words), len(self.vocab), self.components[0].name)
                parts.append(ngram_token_scores(c.model.model, self.vocab, sentences))
        mixed = self._mix(np.stack([p.log_probs for p in parts]))
        return TokenScores(mixed, parts[0].lengths, parts[0].oov)

    def score(self, sentences: Iterable[str | Sequence[str]], batch_size: int = 4096) -> list[SentenceScore]:
        """:func:`hlbl.scoring.score_sentences` for the mixture: each sentence's log10
        probability, tokens (words + ``<eos>``) and out-of-vocabulary words."""
        return self.token_scores(sentences, batch_size).sentences()

    # ---- next words -------------------------------------------------------------------------

    @property
    def context_size(self) -> int:
        """Words of history the mixture reads: the longest run context, or the n-gram order - 1."""
        sizes = [c.model.config.context for c in self.components if c.kind == "run"]
        sizes += [c.model.model.order - 1 for c in self.components if c.kind == "ngram"]
        return max(sizes)

    def next_log_probs(self, contexts: Sequence[Sequence[int]]) -> np.ndarray:
        """(B, V) natural-log probability of every word after each context: the last
        :attr:`context_size` word ids of the start of a sentence, left-padded with ``<eos>``
        (:func:`hlbl.scoring.encode_context`). The runs read their last ``n`` ids; the n-gram
        model reads the words after the last ``<eos>`` with ``<s>`` before them (a context with
        no ``<eos>`` starts further back than it can see), and is looked up once per word: V
        lookups a context, which is what bounds the speed on a large vocabulary."""
        import torch

        ctx = np.asarray(contexts, dtype=np.int64).reshape(len(contexts), -1)
        rows = []
        for c in self.components:
            if c.kind == "run":
                n = c.model.config.context
                with torch.no_grad():
                    h = c.model.context_vector(torch.as_tensor(ctx[:, ctx.shape[1] - n :], device=self.device))
                    rows.append(c.model.out.log_prob(h).double().cpu().numpy())
            else:
                rows.append(np.stack([self._ngram_next(c.model.model, row) for row in ctx]))
        with np.errstate(divide="ignore"):
            return np.logaddexp.reduce(np.log(self._weights())[:, None, None] + np.stack(rows), axis=0)

    def _ngram_next(self, ngram, row: np.ndarray) -> np.ndarray:
        """(V,) natural-log p(w | the sentence start in ``row``) under the n-gram model."""
        if self._ngram_ids is None:  # our word ids -> the model's (<eos> -> </s>), once
            self._ngram_ids = ngram.vocab_map(self.vocab.words)
        targets = self._ngram_ids
        ends = np.flatnonzero(row == self.vocab.eos)
        history = ([ngram.bos] if len(ends) else []) + list(targets[row[ends[-1] + 1 :] if len(ends) else row])
        history = history[-(ngram.order - 1) :] if ngram.order > 1 else []
        windows = np.full((len(targets), ngram.order), -1, dtype=np.int64)
        if history:
            windows[:, ngram.order - 1 - len(history) : ngram.order - 1] = history
        windows[:, -1] = targets
        return ngram.score_windows(windows) * math.log(10.0)

    def topk(self, contexts: Sequence[Sequence[int]], k: int) -> tuple[np.ndarray, np.ndarray]:
        """The k most probable next words of the mixture after each context (as
        :meth:`next_log_probs` reads them): (B, k) log-probabilities and word ids, best first,
        ties to the lower word id; exact, from the full distribution."""
        lp = self.next_log_probs(contexts)
        idx = np.argsort(-lp, axis=1, kind="stable")[:, : max(1, min(int(k), lp.shape[1]))]
        return np.take_along_axis(lp, idx, axis=1), idx

    # ---- saving ----------------------------------------------------------------------------

    def to_json(self, relative_to: str | os.PathLike | None = None) -> dict:
        """The mixture file's content; paths relative to the directory ``relative_to`` if given."""
        comps = []
        for d, c in zip(self.describe(), self.components):
            where = os.path.abspath(c.path)
            if relative_to is not None:
                try:
                    where = os.path.relpath(where, os.path.abspath(relative_to))
                except ValueError:  # another drive (Windows): no relative path
                    pass
            comps.append(
                {
                    "model": c.name,
                    "kind": c.kind,
                    "path": Path(where).as_posix(),
                    "which": c.which,
                    "sha256": c.digest,
                    "weight": d["weight"],
                }
            )
        return {
            "format": MIXTURE_FORMAT,
            "version": MIXTURE_VERSION,
            "components": comps,
            "vocab_sha256": words_sha256(self.vocab.words),
            "fitted_on": self.fitted_on,
        }

    def save(self, path: str | os.PathLike) -> None:
        """Write the mixture file (atomically), its paths relative to its own directory."""
        path = Path(path)
        text = json.dumps(self.to_json(path.parent), indent=1) + "\n"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic.write_text(path, text)
        except OSError as e:
            raise DataError(f"cannot write {path}: {e.strerror or e}") from None

    # ---- internals -------------------------------------------------------------------------

    def _weights(self) -> np.ndarray:
        if self.weights is None:
            raise ConfigError("weights", "weights are not set: fit them on a valid split or give them")
        return self.weights

    def _mix(self, L: np.ndarray) -> np.ndarray:
        from .ngram.mixture import interpolate_many

        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return interpolate_many(L, self._weights())

    def _zero_message(self, L: np.ndarray, mixed: np.ndarray, stream: np.ndarray, split: str) -> str:
        """Tokens the mixture gives probability 0: which models give them 0 and which weigh nothing."""
        zero = np.flatnonzero(~np.isfinite(mixed))
        first = int(zero[0])
        word = self.vocab.words[int(stream[first])]
        blamed = [
            c.name for c, row, w in zip(self.components, L, self._weights()) if w > 0 and not np.isfinite(row[first])
        ]
        idle = [c.name for c, w in zip(self.components, self._weights()) if w == 0]
        return (
            f"{', '.join(blamed)} give{'s' if len(blamed) == 1 else ''} {len(zero):,} of the {len(mixed):,} {split} "
            f"tokens probability 0 (log10 -inf), the first {word!r} (token {first + 1:,})"
            + (f", and the mixture weight of {', '.join(idle)} is 0" if idle else "")
            + ": the mixture's perplexity is infinite"
        )


def _weight_list(weights, k: int) -> list[float] | None:
    if weights is None:
        return None
    if isinstance(weights, (int, float)):
        w = float(weights)
        if k != 2 or not 0.0 <= w <= 1.0:
            raise ConfigError(
                "weights",
                f"weights: one number is the first model's share of a mixture of two, in [0, 1]; got {w} for {k} models",
            )
        return [w, 1.0 - w]
    return list(weights)


def _kinds(kinds: Iterable[str]) -> str:
    kinds = list(kinds)
    return f"{kinds.count('run')} run(s)" + (" and an n-gram model" if "ngram" in kinds else "")


def _perplexity(lp: np.ndarray) -> float | None:
    """exp(mean NLL), or None where a token has probability 0 (JSON holds no infinity)."""
    if len(lp) == 0 or not np.isfinite(lp).all():
        return None
    nll = -float(np.sum(lp, dtype=np.float64)) / len(lp)
    return math.exp(nll) if nll < 709.0 else None


def _refuse_missing(c: Component, missing: tuple[int, str | None], size: int, run: str) -> None:
    """An n-gram model lacking some of the runs' words would give each its <unk> probability:
    several words would share <unk>'s mass and the mixture would not be a distribution (its
    perplexity could even beat both models'), so it is refused."""
    count, example = missing
    if count:
        raise DataError(
            f"{count:,} of the model's {size:,} words (e.g. {example!r}) are not in {c.name}, so the mixture "
            f"would not be a distribution; build the n-gram model on {run}'s training data with its vocabulary "
            "settings (min_count, max_vocab)"
        )


def read_mixture_file(path: str | os.PathLike) -> dict:
    """A mixture file's content, checked; one-line errors naming the file."""
    path = Path(path)
    refuse_special(path, DataError, "a mixture file")  # (a pipe would block the read, /dev/zero never end)
    try:
        if path.stat().st_size > MAX_MIXTURE_BYTES:
            raise DataError(f"{path}: not a mixture file (over {MAX_MIXTURE_BYTES:,} bytes)")
        spec = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise DataError(f"cannot read mixture file {path}: {e.strerror or e}") from None
    except (ValueError, RecursionError) as e:  # (UnicodeDecodeError is a ValueError)
        raise DataError(f"{path}: not a mixture file (not JSON: {str(e).splitlines()[0] if str(e) else e})") from None
    if not isinstance(spec, dict) or spec.get("format") != MIXTURE_FORMAT:
        raise DataError(f"{path}: not a mixture file (format is not {MIXTURE_FORMAT!r})")
    if spec.get("version") != MIXTURE_VERSION:
        raise DataError(f"{path}: mixture file version {spec.get('version')!r} is not supported (this reads 1)")
    comps = spec.get("components")
    ok = isinstance(comps, list) and len(comps) >= 2
    for c in comps if ok else ():
        ok = ok and isinstance(c, dict) and c.get("kind") in KINDS
        ok = ok and all(isinstance(c.get(k), str) for k in ("model", "path", "sha256"))
        ok = ok and isinstance(c.get("weight"), (int, float)) and not isinstance(c.get("weight"), bool)
        ok = ok and (c.get("kind") == "ngram" or c.get("which") in ("best", "last"))
    if not ok:
        raise DataError(f"{path}: damaged mixture file (components)")
    fitted = spec.get("fitted_on")
    if fitted is not None and not (
        isinstance(fitted, dict) and all(v is None or isinstance(v, (str, int, float)) for v in fitted.values())
    ):
        raise DataError(f"{path}: damaged mixture file (fitted_on is not an object of plain values)")
    return spec


__all__ = ["Component", "Mixture", "read_mixture_file", "MIXTURE_FORMAT", "MIXTURE_VERSION"]
