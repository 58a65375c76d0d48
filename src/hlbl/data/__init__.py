"""Corpora, vocabularies and integer-encoded token streams, in three modules:

- :mod:`hlbl.data.vocab`: the text rules (how a file becomes sentences of tokens), the special
  tokens ``<eos>`` and ``<unk>``, word counts and :class:`Vocab`;
- :mod:`hlbl.data.corpus`: a corpus directory found by path or name, and its splits encoded once
  into a cache on disk and memory-mapped (:class:`Corpus`, :func:`load_corpus`);
- :mod:`hlbl.data.streams`: what training and evaluation read of an encoded stream (contexts,
  batches, epoch orders, reading a mapped stream through its file).

Every name is re-exported here. Tunables such as ``LONG_LINE`` or ``ORDER_IN_MEMORY`` are read
from the module that defines them: a test that changes one patches that module, not this one.
"""

from ..errors import DataError
from .corpus import (
    ENCODING_VERSION,
    PTB_MD5,
    PTB_URL,
    SPLITS,
    Corpus,
    corpus_record,
    default_cache_dir,
    encode_file,
    fetch_ptb,
    load_corpus,
    resolve_corpus,
    scan_file,
)
from .streams import (
    BLOCK_TOKENS,
    GROUP_BLOCKS,
    ORDER_IN_MEMORY,
    READ_TOKENS,
    EpochOrder,
    EpochReader,
    EpochSpan,
    mapped_file,
    batches,
    contexts,
    epoch_order,
    epoch_span,
    read_tokens,
    stream_fingerprint,
    stream_pieces,
    stream_windows,
)
from .vocab import (
    BLANK_LINES,
    EOS,
    LONG_LINE,
    PROGRESS_BYTES,
    UNK,
    VOCAB_FORMAT,
    VOCAB_VERSION,
    TextProtocol,
    Vocab,
    count_file,
    first_bad_byte,
    iter_sentences,
    line_pieces,
    text_lines,
)

__all__ = [
    "BLANK_LINES",
    "BLOCK_TOKENS",
    "Corpus",
    "DataError",
    "ENCODING_VERSION",
    "EOS",
    "EpochOrder",
    "EpochReader",
    "EpochSpan",
    "GROUP_BLOCKS",
    "LONG_LINE",
    "ORDER_IN_MEMORY",
    "PROGRESS_BYTES",
    "PTB_MD5",
    "PTB_URL",
    "READ_TOKENS",
    "SPLITS",
    "UNK",
    "VOCAB_FORMAT",
    "TextProtocol",
    "VOCAB_VERSION",
    "Vocab",
    "batches",
    "contexts",
    "corpus_record",
    "count_file",
    "default_cache_dir",
    "encode_file",
    "epoch_order",
    "epoch_span",
    "fetch_ptb",
    "first_bad_byte",
    "iter_sentences",
    "line_pieces",
    "load_corpus",
    "mapped_file",
    "read_tokens",
    "resolve_corpus",
    "scan_file",
    "stream_fingerprint",
    "stream_pieces",
    "stream_windows",
    "text_lines",
]
