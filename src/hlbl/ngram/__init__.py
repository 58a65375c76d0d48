"""Kneser-Ney n-gram baseline: estimation, ARPA files, scoring, interpolation with neural models.

Model
-----
Interpolated modified Kneser-Ney (Chen & Goodman 1998, section 3), computed as KenLM's
``lmplz`` computes it, so that on PTB it gives KenLM's perplexities:

* Every sentence is ``<s> w_1 .. w_n </s>``. ``</s>`` is our ``<eos>``; ``<s>`` is only ever a
  context (its unigram gets log10 probability -99); ``<unk>`` is an ordinary word of the
  vocabulary (on PTB it is frequent). The vocabulary is the neural models' (:class:`hlbl.data.Vocab`).
* Counts. For the highest order N, ``a(g)`` is the raw count ``c(g)``. For a lower order, ``a(g)``
  is the continuation count ``N1+(. g)`` = number of distinct words ``v`` with ``v g`` seen, except
  for n-grams starting with ``<s>``, which keep their raw count (nothing can precede ``<s>``).
* Discounts, three per order from the counts of counts ``n_j`` of the adjusted counts ``a``::

      Y = n1 / (n1 + 2 n2),   D_j = j - (j + 1) Y n_{j+1} / n_j   (j = 1, 2, 3; D_3 serves 3+)

  An order whose ``n_1``, ``n_2`` or ``n_3`` is 0, or whose discounts leave ``[0, j]`` (tiny
  corpora), uses KenLM's fallback ``(0.5, 1.0, 1.5)``.
* Probabilities, interpolating every order down to the uniform distribution over the V words
  of the vocabulary (``<s>`` excluded), with ``h'`` the history ``h`` without its oldest word::

      p(w | h) = (a(h w) - D(a(h w))) / sum_x a(h x)  +  gamma(h) p(w | h')
      gamma(h) = (D_1 N_1(h .) + D_2 N_2(h .) + D_3 N_3+(h .)) / sum_x a(h x)
      p(w)     = (a(w) - D(a(w))) / sum_x a(x)  +  gamma() / V

  where ``N_j(h .)`` counts the words following ``h`` with adjusted count j (3+ for j = 3). The
  first term is 0 for an unseen ``h w``, so ``p(w | h) = gamma(h) p(w | h')`` there: this is exactly
  a back-off model with ARPA probability ``p(w | h)`` for every seen n-gram and back-off weight
  ``gamma(h)`` for every context; a context not seen at all has weight 1.

Counting uses numpy sorts (see :mod:`.kneser_ney`); PTB order 5 takes about a second, the
unpruned 5-gram of a 50M-token corpus a few minutes and about 125 bytes of memory a token
(``docs/scale.md``). Models are written as ARPA text or, faster at that scale, as one
safetensors file (:mod:`.binary`); :func:`read_arpa` reads both.

Evaluation protocol, and how it lines up with the neural models
---------------------------------------------------------------
The neural models read a split as ONE stream with ``<eos>`` after every line and predict all N
tokens of it (N = 82,430 on PTB test). The n-gram scorer cuts that same stream at each ``<eos>``
into sentences, scores each one from the context ``<s>`` and predicts its ``<eos>`` as ``</s>``
(KenLM's and SRILM's convention: one ``</s>`` a line, ``<s>`` only as context). So both predict
the same N tokens, words plus one ``<eos>`` a line, in the same order; they differ only in the
context of a sentence's first word: the previous sentence's tail for the neural stream, ``<s>``
for the n-gram. Per-token log-probabilities therefore pair up one to one, which is what
interpolation needs. Perplexity is ``exp(nll)`` with ``nll`` the mean natural-log NLL per token.

A model estimated here records its blank-line protocol and vocabulary rule in its file
(:mod:`.protocol`); the CLI reads text with that protocol and refuses another.

Interpolation
-------------
:func:`interpolate` mixes per-token probabilities linearly; :func:`tune_weight` picks the weight
that maximises validation likelihood (see :mod:`.mixture`).

Public API
----------
:func:`train_kneser_ney`, :class:`NgramModel`, :func:`write_arpa`, :func:`read_arpa`,
:func:`parse_arpa`, :class:`ArpaError`, :func:`token_log_probs`, :func:`interpolate`,
:func:`tune_weight`.
"""

from __future__ import annotations

import os

import numpy as np

from ..data import Vocab
from .arpa import ArpaError, parse_arpa, read_arpa, write_arpa
from .kneser_ney import modified_kn_discounts, train_kneser_ney
from .mixture import interpolate, tune_weight
from .model import LN10, NgramModel, stream_log10

__all__ = [
    "ArpaError",
    "NgramModel",
    "interpolate",
    "modified_kn_discounts",
    "parse_arpa",
    "read_arpa",
    "token_log_probs",
    "train_kneser_ney",
    "tune_weight",
    "write_arpa",
]


def token_log_probs(arpa_or_model: NgramModel | str | os.PathLike, stream: np.ndarray, vocab: Vocab) -> np.ndarray:
    """(N,) natural-log probability of every token of a split stream under an n-gram model.

    ``arpa_or_model`` is an :class:`NgramModel` or the path of an ARPA file; ``stream`` holds
    ``vocab`` ids in our split format. Words of ``vocab`` that the model lacks count as its
    ``<unk>``. Same N tokens, same order as the neural models' stream protocol (module doc).
    """
    model = arpa_or_model if isinstance(arpa_or_model, NgramModel) else read_arpa(arpa_or_model)
    return stream_log10(model, stream, vocab.words, vocab.eos) * LN10
