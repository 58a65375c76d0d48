"""Lines of a byte stream (standard input) in bounded memory and linear time, whatever the input.

``hlbl score`` and ``hlbl predict`` read their input here. The text rules are the corpus
reader's (:mod:`hlbl.data.vocab`): UTF-8, strictly (an error names the line), a leading
byte-order mark dropped, and ``\\n``, ``\\r\\n`` or a lone ``\\r`` ending a line, whatever the
line's length.

Memory does not grow with the input:

* a line of up to ``LONG_LINE_BYTES`` (1 MiB) is one ``str``; a longer one is given, as it is
  read, in pieces cut at ASCII whitespace (space, tab, vertical tab, form feed) to a
  :class:`LongLine` object, whose ``finish()`` result stands for the line;
* a token (a run of bytes without ASCII whitespace) longer than ``MAX_TOKEN_BYTES`` (1 MiB) is no
  word of any vocabulary: its bytes are checked as UTF-8 and dropped as they arrive, and the
  long line's object is told ``unknown()`` in its place (score and predict read it as ``<unk>``);
  (``MAX_TOKEN_BYTES`` is no less than ``LONG_LINE_BYTES``: only a long line can hold such a token);
* a list of lines holds at most ``size`` lines and about ``LONG_LINE_BYTES`` of their text;
* a caller that gives no ``long_line`` (scores per token, of a mixture, of an n-gram model: they
  need the whole sentence) gets a long line whole, as one ``str``: that line's text is held, its
  too long tokens each as ``<unk>``.
"""

from __future__ import annotations

import codecs
import os
from typing import BinaryIO, Callable, Iterator, Protocol

from .errors import DataError

LONG_LINE_BYTES = 1 << 20  # a longer line is read piece by piece (LongLine)
MAX_TOKEN_BYTES = 1 << 20  # a longer token is an unknown word, its text never held
READ_BYTES = 1 << 16  # one read of the stream

_SPACES = b" \t\x0b\x0c"  # where a long line may be cut (never inside a token or a UTF-8 sequence)


class LongLine(Protocol):
    """What a caller makes of a line longer than ``LONG_LINE_BYTES``, fed in order."""

    def feed(self, text: str) -> None:
        """The next piece of the line (whole tokens)."""

    def unknown(self) -> None:
        """A token longer than ``MAX_TOKEN_BYTES`` at this place in the line."""

    def finish(self) -> object:
        """The line has ended: its entry in the list of lines (None: no entry)."""


class _WholeLine:
    """A long line held whole (``long_line`` None): its pieces joined, as if read in one."""

    def __init__(self):
        self.parts: list[str] = []

    def feed(self, text: str) -> None:
        self.parts.append(text)  # (pieces end at a space, or are followed by one: joined as read)

    def unknown(self) -> None:
        self.parts.append("<unk>")  # (a token over MAX_TOKEN_BYTES is no word: it reads as unknown)

    def finish(self) -> object:
        return "".join(self.parts)


def more_input_waiting(stream) -> Callable[[], bool]:
    """A test of whether more of ``stream`` (stdin's bytes) can be read without waiting."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError):  # in memory (io.UnsupportedOperation): all of it is there
        return lambda: True
    if os.name != "posix":  # select() cannot watch pipes there: answer per line only to a terminal
        tty = os.isatty(fd)
        return lambda: not tty
    import select

    return lambda: bool(select.select([fd], [], [], 0)[0])


def _last_space(data) -> int:
    return max(data.rfind(c) for c in _SPACES)


def _first_space(data) -> int:
    found = [i for i in (data.find(c) for c in _SPACES) if i >= 0]
    return min(found) if found else -1


class _Line:
    """The line being read: its bytes not yet decoded, and where a long line stands."""

    def __init__(self, long_line: Callable[[], LongLine], name: str):
        self.long_line, self.name = long_line, name
        self.number = 0  # lines ended so far
        self._reset()

    def _reset(self) -> None:
        self.pending = bytearray()  # bytes of the line not yet decoded
        self.offset = 0  # bytes of the line before ``pending`` (for error positions)
        self.token = 0  # long lines: where in ``pending`` the last, unfinished, token starts
        self.sink: LongLine | None = None
        self.skip = None  # a UTF-8 decoder while a too long token's bytes are dropped
        self.skipped = 0  # the bytes it has been given

    @property
    def started(self) -> bool:
        return bool(self.pending) or self.offset > 0 or self.sink is not None

    def _decode(self, raw, at: int) -> str:
        """``raw`` (bytes ``at``.. of the line) as text; one-line error naming the line otherwise."""
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            self._not_utf8(raw[e.start], at + e.start)
        return text.removeprefix("\ufeff") if self.number == 0 and at == 0 else text

    def _not_utf8(self, byte: int, at: int):
        raise DataError(
            f"{self.name} is not UTF-8 text (line {self.number + 1}: byte 0x{byte:02x} at byte {at + 1} of the line)"
        )

    def _drop(self, raw, final: bool = False) -> None:
        """Bytes of a too long token: checked as UTF-8 (in pieces that may split a character), not kept."""
        assert self.skip is not None
        held = len(self.skip.getstate()[0])  # bytes of a character cut by the previous piece
        try:
            self.skip.decode(bytes(raw), final)
        except UnicodeDecodeError as e:
            self._not_utf8(e.object[e.start], self.skipped - held + e.start)
        self.skipped += len(raw)

    def _feed(self, upto: int) -> None:
        """Give ``pending[:upto]`` (whole tokens) to the long line's object."""
        if upto:
            self.sink.feed(self._decode(self.pending[:upto], self.offset))
            del self.pending[:upto]
            self.offset += upto
            self.token -= upto

    def add(self, data: bytes) -> None:
        """More of the line (no line end in ``data``)."""
        if self.sink is None:
            self.pending += data
            if len(self.pending) <= LONG_LINE_BYTES:
                return
            self.sink = self.long_line()
            data, self.pending = bytes(self.pending), bytearray()
        while data:
            if self.skip is not None:  # in a too long token: up to the next space, nothing is kept
                cut = _first_space(data)
                self._drop(data if cut < 0 else data[:cut], final=cut >= 0)
                if cut < 0:
                    return
                self.offset, self.skip, data = self.skipped, None, data[cut:]
            first = _first_space(data)
            if len(self.pending) - self.token + (len(data) if first < 0 else first) > MAX_TOKEN_BYTES:
                self._too_long()  # the token going on from the last piece
            elif len(data) > MAX_TOKEN_BYTES and max(map(len, data.split()), default=0) > MAX_TOKEN_BYTES:
                # (only a piece longer than the bound holds a too long token: bytes.split() cuts at
                # exactly the ASCII whitespace, as the line ends are gone)
                at = data.find(next(t for t in data.split() if len(t) > MAX_TOKEN_BYTES))
                self._append(data[:at])
                data = data[at:]
            else:
                self._append(data)
                return

    def _append(self, data: bytes) -> None:
        last = _last_space(data)
        if last >= 0:
            self.token = len(self.pending) + last + 1
        self.pending += data
        if len(self.pending) > LONG_LINE_BYTES:
            self._feed(self.token)

    def _too_long(self) -> None:
        """The last token of ``pending`` goes on past MAX_TOKEN_BYTES: what is before it is fed, the
        rest of it dropped as it comes (``skip``)."""
        self._feed(self.token)
        self.sink.unknown()
        self.skip, self.skipped = codecs.getincrementaldecoder("utf-8")(), self.offset
        self._drop(self.pending)
        self.pending, self.token = bytearray(), 0

    def whole(self, raw: bytes) -> str:
        """A line read in one piece (nothing of it added before): its text."""
        if self.number:
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = self._decode(raw, 0)  # (raises, naming the line)
        else:
            text = self._decode(raw, 0)
        self.number += 1
        return text

    def end(self) -> object:
        """The line has ended: its ``str``, or its long line object's ``finish()``."""
        if self.sink is None:
            entry = self._decode(self.pending, 0)
        else:
            if self.skip is not None:
                self._drop(b"", final=True)
            self._feed(len(self.pending))
            entry = self.sink.finish()
        self.number += 1
        self._reset()
        return entry


def read_lines(
    stream: BinaryIO, long_line: Callable[[], LongLine] | None, size: int = 1024, name: str = "standard input"
) -> Iterator[list]:
    """Lines of ``stream`` (line end removed) in lists of at most ``size`` lines and about
    ``LONG_LINE_BYTES`` of text. A list goes out when it is full or when no more input is
    waiting, so a person typing, or a program that writes a line and waits for the answer, gets
    it at once, while a file still goes through in large batches. An entry is a ``str``, or for a
    line longer than ``LONG_LINE_BYTES`` what ``long_line().finish()`` returned (none if None), or
    with ``long_line`` None, that line whole as a ``str``."""
    if long_line is None:
        long_line = _WholeLine
    waiting = more_input_waiting(stream)
    line = _Line(long_line, name)
    chunk: list = []
    held = 0  # bytes of text in chunk
    cr = False  # the last read ended in \r: a \n starting the next one is the rest of that line end
    while True:
        block = stream.read1(READ_BYTES)  # what is there, waiting only when nothing is
        if not block:
            break
        if cr and block.startswith(b"\n"):
            block = block[1:]
        cr = block.endswith(b"\r")
        if b"\r" in block:
            block = block.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        *ended, rest = block.split(b"\n")
        for i, raw in enumerate(ended):
            if (i == 0 and line.started) or len(raw) > LONG_LINE_BYTES:  # only the first can go on a line
                line.add(raw)
                entry = line.end()
            else:
                entry = line.whole(raw)
            if entry is not None:
                chunk.append(entry)
                held += len(entry) if isinstance(entry, str) else 0
            if len(chunk) >= size or held > LONG_LINE_BYTES:
                yield chunk
                chunk, held = [], 0
        line.add(rest)
        if chunk and not waiting():
            yield chunk
            chunk, held = [], 0
    if line.started:  # the last line, without a line end
        entry = line.end()
        if entry is not None:
            chunk.append(entry)
    if chunk:
        yield chunk
