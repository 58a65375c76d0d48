"""The log line when numba compiles (hlbl.jit), and none when nothing is compiled."""

import logging

import numba
import pytest

from hlbl.jit import compile_logged


@pytest.mark.quick
def test_a_compilation_is_logged_once_with_its_seconds(caplog):
    @numba.njit  # a new function: numba has to compile it (no cache)
    def inner(x):
        return x * 2

    @numba.njit
    def outer(x):
        return inner(x) + 1

    with caplog.at_level(logging.INFO, logger="hlbl"):
        with compile_logged("the test kernel"):
            assert outer(20) == 41
        with compile_logged("the test kernel"):  # compiled already: nothing to say
            assert outer(1) == 3
    lines = [r.getMessage() for r in caplog.records if r.name == "hlbl.jit"]
    assert len(lines) == 1, lines  # the nested compilation of inner is part of outer's
    assert lines[0].startswith("compiled the test kernel (numba, first use; cached for later runs) in ")
    assert lines[0].endswith(" s")
