"""hlbl.atomic: a file is replaced whole or not at all."""

import os
import stat

import numpy as np
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


def test_a_path_that_is_not_a_regular_file_is_refused_and_a_link_written_through(tmp_path):
    from hlbl.ngram import train_kneser_ney, write_arpa
    from hlbl.ngram.binary import write_binary
    from hlbl.data import EOS, Vocab

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    vocab = Vocab(("a", "b", EOS, "<unk>"), (3, 2, 2, 0))
    model = train_kneser_ney(np.asarray([0, 1, 2, 0, 2]), vocab, order=2)
    for write in (
        lambda p: atomic.write_text(p, "x"),
        lambda p: write_arpa(model, p),
        lambda p: write_binary(model, p),
    ):
        with pytest.raises(OSError, match="cannot write .*pipe: not a regular file \\(a named pipe\\)"):
            write(fifo)
        assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert sorted(os.listdir(tmp_path)) == ["pipe"]  # no temporary left
    # a symbolic link is written through: the link stays, its target gets the bytes
    target = tmp_path / "real.txt"
    target.write_text("old")
    (tmp_path / "link.txt").symlink_to("real.txt")
    atomic.write_text(tmp_path / "link.txt", "new")
    assert os.path.islink(tmp_path / "link.txt") and target.read_text() == "new"
    # a link to a pipe is refused like the pipe
    (tmp_path / "to-pipe").symlink_to(fifo)
    with pytest.raises(OSError, match="not a regular file"):
        atomic.write_text(tmp_path / "to-pipe", "x")
    assert os.path.islink(tmp_path / "to-pipe")


def test_the_cli_refuses_an_output_that_is_not_a_regular_file_before_any_work(tmp_path, capsys):
    from conftest import tiny_corpus
    from hlbl.cli import main

    data = tiny_corpus(tmp_path / "corpus", n_train=20)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert main(["ngram", "train", "--data", str(data), "--order", "2", "--out", str(fifo)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a regular file (a named pipe)" in err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
