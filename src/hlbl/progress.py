"""Progress of long steps (an epoch, encoding a corpus, counting n-grams) on stderr.

On a terminal it is a tqdm bar. When stderr is not a terminal (redirected to a log, a pipe, a
batch system's output file) a bar would fill the log with carriage returns, so instead one plain
line is written every :data:`LOG_EVERY` seconds, and nothing for steps shorter than that::

    epoch 3: 1.21M/4.53M w (27%), 12.3k w/s, 1:38 elapsed, ~4:30 left, loss=5.123

:func:`progress` returns either one; both take ``update(n)``, ``set_postfix(**kw)`` and ``close()``
(and work as context managers).

A step whose units come seldom (one order of n-gram counting: one numpy sort of 50M keys) passes
``heartbeat=True``: a daemon thread then writes the line (or redraws the bar) every interval even
when no unit has finished, so the elapsed time keeps moving and a log is never silent for minutes.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

from tqdm import tqdm

LOG_EVERY = 10.0  # seconds between progress lines when stderr is not a terminal


def _si(x: float) -> str:
    """1234567 -> '1.23M' (as tqdm's unit_scale writes it)."""
    for factor, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= factor:
            return f"{x / factor:.3g}{suffix}"
    return f"{x:.3g}" if x != int(x) else str(int(x))


def _clock(seconds: float) -> str:
    """Seconds as h:mm:ss or m:ss."""
    s = int(round(seconds))
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class LogLines:
    """tqdm's interface, writing one line every ``every`` seconds (see the module docstring)."""

    def __init__(
        self,
        total: float | None = None,
        desc: str | None = None,
        unit: str = "it",
        every: float | None = None,
        file: TextIO | None = None,
        clock=time.monotonic,
    ):
        self.total, self.desc, self.unit = total, desc, unit
        self.every = LOG_EVERY if every is None else every
        self.file = file if file is not None else sys.stderr
        self.clock = clock
        self.n = 0
        self.postfix: dict = {}
        self.start = self.last = clock()

    def update(self, n: float = 1) -> None:
        self.n += n
        self.refresh()

    def refresh(self) -> None:
        """Write the line if the interval has passed since the last one."""
        now = self.clock()
        if now - self.last >= self.every:
            self.last = now
            self.file.write(self.line(now - self.start) + "\n")
            self.file.flush()

    def set_postfix(self, refresh: bool = True, **kwargs) -> None:
        self.postfix = kwargs

    def line(self, elapsed: float) -> str:
        """The progress line after ``elapsed`` seconds."""
        parts = [f"{_si(self.n)}/{_si(self.total)} {self.unit}" if self.total else f"{_si(self.n)} {self.unit}"]
        if self.total:
            parts[0] += f" ({100 * self.n / self.total:.0f}%)"
        if elapsed > 0:
            parts.append(f"{_si(self.n / elapsed)} {self.unit}/s")
        parts.append(f"{_clock(elapsed)} elapsed")
        if self.total and 0 < self.n < self.total:
            parts.append(f"~{_clock(elapsed * (self.total - self.n) / self.n)} left")
        parts += [f"{k}={v}" for k, v in self.postfix.items()]
        return (f"{self.desc}: " if self.desc else "") + ", ".join(parts)

    def close(self) -> None:
        pass

    def __enter__(self) -> "LogLines":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _beat(bar, stop: threading.Event, every: float) -> None:
    """The heartbeat thread: refresh ``bar`` every ``every`` seconds until ``stop`` is set."""
    while not stop.wait(every):
        try:
            bar.refresh()
        except Exception:  # a closed file or bar: the heartbeat simply ends
            return


def progress(
    total: float | None = None,
    desc: str | None = None,
    unit: str = "it",
    show: bool = True,
    file: TextIO | None = None,
    heartbeat: bool = False,
):
    """A progress display for a step of ``total`` units: a tqdm bar when ``file`` (stderr by
    default) is a terminal, else :class:`LogLines`; nothing at all (a disabled bar) if not ``show``.
    ``heartbeat``: refresh it from a thread every interval even without updates (module docstring)."""
    file = file if file is not None else sys.stderr
    tty = hasattr(file, "isatty") and file.isatty()
    if show and not tty:
        bar = LogLines(total, desc, unit, file=file)
    else:
        bar = tqdm(
            total=total,
            desc=desc,
            unit=unit,
            unit_scale=True,
            leave=False,
            file=file,
            mininterval=1.0,
            disable=not show,
        )
    if heartbeat and show:
        stop = threading.Event()
        every = LOG_EVERY if not tty else 1.0
        threading.Thread(target=_beat, args=(bar, stop, max(every, 0.05)), daemon=True).start()
        close = bar.close

        def close_and_stop() -> None:
            stop.set()
            close()

        bar.close = close_and_stop
    return bar
