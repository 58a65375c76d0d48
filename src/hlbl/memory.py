"""Back large parameter tables with 2 MiB pages (Linux transparent huge pages), an optimisation hint.

Why: the fast engine reads and writes random rows of tables that, for a large vocabulary, are far
bigger than what the CPU's TLB maps with 4 KiB pages (V = 1M, d = 100: four 400 MB tables with
their momentum buffers). Every row is then a TLB miss and a page walk on top of the cache miss.
On 2 MiB pages the TLB covers gigabytes (``bench/hugepages.py`` measures the gain at V = 1M:
``results/hugepages.log``); at V = 10k the tables are below ``MIN_BYTES``.

Many systems set THP to ``madvise`` (only regions that ask get huge pages), so we ask:
``madvise(MADV_HUGEPAGE)`` for future faults and ``madvise(MADV_COLLAPSE)`` (Linux >= 6.1) to
turn the pages already there into huge pages now. Collapsing copies the memory once (about 2 s/GB);
on a range already collapsed it returns at once. Anywhere this does not apply (not Linux, an old
kernel, THP disabled, a small array) it silently does nothing: results never depend on it.

:func:`memory_limit` is the memory a process can have at most, for checks made before a large
allocation (a word tree's padded path tables).
"""

from __future__ import annotations

import ctypes
import os
import sys

import numpy as np

HUGE_PAGE = 2 << 20
MIN_BYTES = 32 << 20  # smaller tables fit the TLB's reach anyway
_MADV_HUGEPAGE = 14
_MADV_COLLAPSE = 25


def _madvise():
    """libc's madvise(addr, length, advice) -> int, or None where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def prefer_huge_pages(*arrays: np.ndarray, min_bytes: int = MIN_BYTES) -> int:
    """Ask the kernel to back each array of at least ``min_bytes`` with huge pages.

    Only whole 2 MiB pages inside an array are advised, so memory outside it is never affected;
    arrays that are not one contiguous block (reversed, strided or broadcast views) are skipped.
    Returns the number of bytes advised (0 where nothing applies); never raises for lack of support.
    """
    madvise = _madvise()
    if madvise is None:
        return 0
    done = 0
    for a in arrays:
        if a.nbytes < min_bytes or not (a.flags.c_contiguous or a.flags.f_contiguous):
            continue  # (a view's [data, data + nbytes) need not be its memory)
        start = -(-a.ctypes.data // HUGE_PAGE) * HUGE_PAGE
        end = (a.ctypes.data + a.nbytes) // HUGE_PAGE * HUGE_PAGE
        if end <= start:
            continue
        if madvise(start, end - start, _MADV_HUGEPAGE) != 0:
            continue  # THP not available here
        madvise(start, end - start, _MADV_COLLAPSE)  # best effort: the hint above still holds for new pages
        done += end - start
    return done


def memory_limit() -> int | None:
    """Bytes this process can have at most: the least of the machine's physical memory, the
    address-space limit (``ulimit -v``) and the cgroup's ``memory.max`` (a container's limit);
    None where none of them is known."""
    limits = []
    try:
        limits.append(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):  # not on every system
        pass
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY:
            limits.append(soft)
    except (ImportError, OSError, ValueError, AttributeError):
        pass
    try:
        with open("/sys/fs/cgroup/memory.max") as f:  # cgroup v2; "max" where unlimited
            text = f.read().strip()
        if text.isdigit():
            limits.append(int(text))
    except OSError:
        pass
    return min(limits) if limits else None
