"""Warm starts: a new model that begins from a trained one (the paper's iterated bootstrap).

A tree rebuilt from a trained model's features is trained on, keeping what the model learned about
contexts: the word vectors R and context weights C are copied, and only the output layer starts
afresh, with the zero node vectors and unigram biases of an untrained layer (so the first
prediction is the unigram distribution, whatever the tree). ``keep_output`` keeps the source's
output layer too: on the same tree (or layer) as is, to go on with another recipe (e.g. a lower
learning rate); on word classes refined by exchange moves (``hlbl tree refine``) each membership's
vector and bias move with it (:func:`hlbl.classes.match_leaves`).
"""

from __future__ import annotations

from typing import Callable

import torch

from .data import Vocab
from .classes import match_leaves
from .errors import ConfigError, TreeError
from .model import LBL
from .output.classes import carry_output


def warm_start(
    model: LBL,
    source: LBL,
    source_vocab: Vocab,
    vocab: Vocab,
    log: Callable[[str], None] = lambda msg: None,
    keep_output: bool = False,
    name: str = "the source model",
) -> None:
    """Start ``model`` (over ``vocab``) from ``source`` (trained over ``source_vocab``), which must
    share the vocabulary word for word, the feature size, the context size and the form of C.
    ``name``: how messages call the source (e.g. its run directory)."""
    if list(source_vocab.words) != list(vocab.words):
        raise ConfigError(
            "init_from",
            f"init_from {name}: its vocabulary differs from this run's (the same corpus and vocabulary rule are needed)",
        )
    for key in ("dim", "context", "full_context"):
        mine, theirs = getattr(model.config, key), getattr(source.config, key)
        if mine != theirs:
            raise ConfigError("init_from", f"init_from {name}: its {key} is {theirs}, this run's {mine}")
    leaf_map, same = _output_mapping(model, source) if keep_output else (None, False)
    with torch.no_grad():
        model.R.weight.copy_(source.R.weight)
        model.C.copy_(source.C)
        for param_name, p in model.out.named_parameters():
            if "bias" not in param_name:
                p.zero_()
    if same:
        model.out.load_state_dict(source.out.state_dict())
        log(f"started from every weight of {name}")
    elif leaf_map is not None:
        carry_output(source.out, model.out, leaf_map)
        log(f"started from every weight of {name}; the output layer carried over to the refined classes")
    else:
        model.init_unigram(vocab.counts)
        log(f"started from the word vectors and context weights of {name}; the output layer from the unigram")


def _output_mapping(model: LBL, source: LBL):
    """For ``keep_output``: (None, True) when both layers share their structure; (leaf map, False)
    for word classes that differ by exchange moves; else ConfigError."""
    if model.config.output != source.config.output:
        raise ConfigError(
            "keep_output",
            f"keep_output: the source has {source.config.output} output, this model {model.config.output}",
        )
    mine, theirs = model.structure, source.structure
    if (mine is None and theirs is None) or (
        mine is not None and theirs is not None and mine.fingerprint() == theirs.fingerprint()
    ):
        return None, True
    if model.config.output != "classes":
        raise ConfigError(
            "keep_output",
            "keep_output needs the source's own tree (or its word classes up to moves)",
        )
    try:
        return match_leaves(theirs, mine), False
    except TreeError as e:
        raise ConfigError("keep_output", f"keep_output: {e}") from None
