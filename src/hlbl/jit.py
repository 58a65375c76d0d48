"""One log line when numba compiles: the first use of the kernels after an install (or a change
to them) compiles them, which takes seconds (about 20 s for the training kernels); later runs load
them from numba's cache at once and log nothing.

``with compile_logged("the training kernels"):`` around a first call of numba code logs, if numba
compiled anything inside the block (numba's ``numba:compile`` events: a load from its cache is
none), ``compiled the training kernels (numba, first use; cached for later runs) in 19.8 s`` at
INFO on the ``hlbl`` logger, which the command line prints to stderr. numba is imported when the
block is entered, so importing this module costs nothing.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from typing import Iterator

logger = logging.getLogger(__name__)


@contextmanager
def compile_logged(what: str) -> Iterator[None]:
    """Log how long numba spent compiling inside the block (nothing if it compiled nothing)."""
    from numba.core import event

    timer = _compile_timer()
    with event.install_listener("numba:compile", timer):
        yield
    if timer.count:
        logger.info("compiled %s (numba, first use; cached for later runs) in %.1f s", what, timer.seconds)


def _compile_timer():
    """A numba event listener summing the seconds of the outermost compilations (compiling a
    kernel compiles the functions it calls inside its own event: those are not counted twice),
    with their ``count``. (The class is made here: numba is imported only when it is needed.)"""
    from numba.core import event

    class CompileTimer(event.Listener):
        def __init__(self):
            self.depth, self.count, self.seconds, self.t0 = 0, 0, 0.0, 0.0

        def on_start(self, ev):
            if self.depth == 0:
                self.t0 = time.perf_counter()
            self.depth += 1

        def on_end(self, ev):
            self.depth -= 1
            if self.depth == 0:
                self.count += 1
                self.seconds += time.perf_counter() - self.t0

    return CompileTimer()
