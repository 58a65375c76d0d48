import sys
from pathlib import Path

import numpy as np

from hlbl.memory import HUGE_PAGE, prefer_huge_pages


def _thp_mode() -> str | None:
    p = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not p.exists():
        return None
    return p.read_text().split("[")[1].split("]")[0]


def test_small_arrays_are_left_alone():
    assert prefer_huge_pages(np.ones(1000, np.float32)) == 0


def test_huge_pages_keep_the_data_and_cover_only_whole_pages_inside_the_array():
    a = np.random.default_rng(0).standard_normal((3 * HUGE_PAGE // 400 + 7, 100)).astype(np.float32)
    before = a.copy()
    n = prefer_huge_pages(a, min_bytes=0)
    np.testing.assert_array_equal(a, before)  # collapsing pages moves memory, never the values
    assert n % HUGE_PAGE == 0 and n <= a.nbytes
    if sys.platform.startswith("linux") and _thp_mode() in ("always", "madvise"):
        assert n >= HUGE_PAGE  # the array spans at least two whole 2 MiB pages
    a[-1] = 1.0  # still ordinary writable memory


def test_views_that_are_not_one_block_are_left_alone():
    base = np.zeros(5 * HUGE_PAGE // 8)  # float64: 5 huge pages
    # A reversed view's data pointer is its last element, and a broadcast one spans far more
    # bytes than its buffer: [data, data + nbytes) would reach memory outside either.
    assert prefer_huge_pages(base[::-1], min_bytes=0) == 0
    assert prefer_huge_pages(np.broadcast_to(np.zeros(1), (8 << 20,)), min_bytes=0) == 0
