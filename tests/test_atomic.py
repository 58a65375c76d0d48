"""hlbl.atomic: a file is replaced whole or not at all."""

import os
import stat

import pytest

from hlbl import atomic


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    dest = tmp_path / "f.json"
    atomic.write_text(dest, "old")
    with pytest.raises(RuntimeError):
        with atomic.atomic_path(dest) as tmp, open(tmp, "w") as f:
            f.write("half of the new")
            raise RuntimeError("killed mid-write")
    assert dest.read_text() == "old" and os.listdir(tmp_path) == ["f.json"]


def test_permissions_follow_the_umask_and_errors_name_the_destination(tmp_path):
    old = os.umask(0o027)
    try:
        atomic.write_bytes(tmp_path / "g", b"x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "g").stat().st_mode) == 0o640  # not mkstemp's 0600
    (tmp_path / "d").mkdir()
    with pytest.raises(OSError, match="cannot write .*d"):
        atomic.write_text(tmp_path / "d", "a directory is in the way")
    with pytest.raises(OSError, match="cannot write .*missing"):
        atomic.write_text(tmp_path / "missing" / "f", "no such directory")
    assert sorted(os.listdir(tmp_path)) == ["d", "g"]


def test_signals_wait_for_the_end_of_a_deferred_block(python_sigint):
    import os
    import signal

    seen = []
    old = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        with atomic.interrupts_deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            assert seen == []  # held
        assert seen == [signal.SIGTERM]  # delivered once the block ended, to the handler of before
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        old_int = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
        try:
            with atomic.interrupts_deferred():
                os.kill(os.getpid(), signal.SIGINT)
                os.kill(os.getpid(), signal.SIGTERM)
            assert seen[1:] == [signal.SIGTERM, signal.SIGINT]  # both, the termination first
        finally:
            signal.signal(signal.SIGINT, old_int)
    finally:
        signal.signal(signal.SIGTERM, old)
