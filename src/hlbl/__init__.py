"""hlbl: hierarchical log-bilinear language models (Mnih & Hinton 2008) and an exact tree softmax for PyTorch.

The names below are the public API; each is loaded on first use, so ``import hlbl`` itself stays
cheap (PyTorch loads with the first model or layer, numba only when the fast engine runs).

>>> import hlbl
>>> tree = hlbl.huffman_tree([100, 50, 20, 10])
>>> layer = hlbl.TreeSoftmax(16, tree)

The library reports progress through the ``hlbl`` logger (:mod:`logging`) and prints nothing by
default; the ``hlbl`` command shows those messages on stderr.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING

from ._version import __version__
from .errors import CheckpointError, ConfigError, DataError, HlblError, TreeError

logging.getLogger(__name__).addHandler(logging.NullHandler())

# public name -> module that defines it
_LAZY = {
    # models and output layers
    "LBL": "model",
    "LBLConfig": "config",
    "TreeSoftmax": "output",
    "HybridSoftmax": "output",
    "hybrid_split": "output",
    "FlatSoftmax": "output",
    "AdaptiveSoftmax": "output",
    "ClassSoftmax": "output",
    "make_output_layer": "output",
    # trees
    "WordTree": "tree",
    "random_tree": "tree",
    "balanced_tree": "tree",
    "huffman_tree": "tree",
    "build_tree": "tree",
    "build_tree_from_features": "treebuild",
    "word_features": "treebuild",
    "join_trees": "treebuild",
    "WordFeatures": "features",
    "hidden_features": "features",
    "embedding_features": "features",
    "learn_tree": "features",
    "WordClasses": "classes",
    "frequency_classes": "classes",
    "kmeans_classes": "classes",
    # data
    "Vocab": "data",
    "Corpus": "data",
    "load_corpus": "data",
    "resolve_corpus": "data",
    # training, evaluation, inference
    "TrainConfig": "config",
    "fit": "run",
    "Run": "run",
    "evaluate": "evaluate",
    "token_log_probs": "evaluate",
    "score_sentences": "scoring",
    "score_report": "scoring",
    "Mixture": "mixture",
    "load_model": "run",
}

__all__ = [  # the errors and __version__, then every name of _LAZY
    "__version__",
    "HlblError",
    "DataError",
    "ConfigError",
    "TreeError",
    "CheckpointError",
    "LBL",
    "LBLConfig",
    "TreeSoftmax",
    "HybridSoftmax",
    "hybrid_split",
    "FlatSoftmax",
    "AdaptiveSoftmax",
    "ClassSoftmax",
    "make_output_layer",
    "WordTree",
    "random_tree",
    "balanced_tree",
    "huffman_tree",
    "build_tree",
    "build_tree_from_features",
    "word_features",
    "join_trees",
    "WordFeatures",
    "hidden_features",
    "embedding_features",
    "learn_tree",
    "WordClasses",
    "frequency_classes",
    "kmeans_classes",
    "Vocab",
    "Corpus",
    "load_corpus",
    "resolve_corpus",
    "TrainConfig",
    "Run",
    "fit",
    "evaluate",
    "token_log_probs",
    "score_sentences",
    "score_report",
    "Mixture",
    "load_model",
]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hlbl' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


if TYPE_CHECKING:  # what type checkers and IDEs see
    from .classes import WordClasses, frequency_classes, kmeans_classes
    from .data import Corpus, Vocab, load_corpus, resolve_corpus
    from .evaluate import evaluate, token_log_probs
    from .features import WordFeatures, embedding_features, hidden_features, learn_tree
    from .mixture import Mixture
    from .config import LBLConfig, TrainConfig
    from .model import LBL
    from .output import (
        AdaptiveSoftmax,
        ClassSoftmax,
        FlatSoftmax,
        HybridSoftmax,
        TreeSoftmax,
        hybrid_split,
        make_output_layer,
    )
    from .scoring import score_report, score_sentences
    from .run import Run, fit, load_model
    from .tree import WordTree, balanced_tree, build_tree, huffman_tree, random_tree
    from .treebuild import build_tree_from_features, join_trees, word_features
