"""The token protocol and vocabulary rule an n-gram model was estimated with, as its files record them.

A perplexity is only comparable, and a mixture with a neural run only pairs tokens up, when the
text is cut into tokens the same way. Two choices decide that here: what a blank line is
(``blank_lines``: ``drop``, no sentence; ``keep``, an empty sentence with its one ``</s>``, the
protocol of WikiText's and KenLM's published perplexities) and which words are the vocabulary
(``max_vocab``, ``min_count``; the vocabulary is open: any other word is ``<unk>``). A model
estimated here carries that record:

* in an ARPA file, as one comment line before ``\\data\\``::

      # hlbl-ngram-protocol {"blank_lines": "keep", "max_vocab": null, "min_count": "auto", ...}

  KenLM skips lines starting with ``#`` before ``\\data\\`` (its reader requires that of any
  text there), and the ARPA format allows text there, so other tools read the file as before;
* in the binary form, as the metadata entry ``protocol`` (the same JSON object).

A file without the record (from KenLM, SRILM, or an older hlbl) is read as before: nothing is
checked against it. :func:`hlbl.ngram.cache.read_protocol` reads only a file's head, so checking
costs no parse.
"""

from __future__ import annotations

import json

from ..config import BLANK_LINES
from ..data import TextProtocol
from ..errors import DataError

ARPA_TAG = "# hlbl-ngram-protocol "
_KEYS = ("blank_lines", "max_vocab", "min_count", "open_vocabulary")


def make_protocol(text: TextProtocol) -> dict:
    """The record of a model estimated from text read with ``text`` (its fields, as run.json's
    ``text`` holds them, and that the vocabulary is open)."""
    return {**text.to_json(), "open_vocabulary": True}


def arpa_line(protocol: dict) -> str:
    """The ARPA comment line holding ``protocol`` (with its newline)."""
    return ARPA_TAG + json.dumps(protocol, sort_keys=True) + "\n"


def parse_protocol(text: str, name: str) -> dict:
    """The record in JSON ``text``, checked; one-line :class:`DataError` naming ``name`` otherwise."""
    try:
        record = json.loads(text)
    except ValueError:
        record = None
    if not isinstance(record, dict) or record.get("blank_lines") not in BLANK_LINES:
        raise DataError(
            f"{name}: damaged protocol record {text.strip()[:80]!r} (expected a JSON object with blank_lines)"
        )
    return {k: record.get(k) for k in _KEYS}


def arpa_protocol(head: bytes, name: str) -> dict | None:
    """The record among the lines before ``\\data\\`` of an ARPA file's ``head``, or None."""
    for raw in head.split(b"\n"):
        line = raw.decode("utf-8", "replace").strip()
        if line == "\\data\\":
            return None
        if line.startswith(ARPA_TAG.strip()):
            return parse_protocol(line[len(ARPA_TAG.strip()) :], name)
    return None
