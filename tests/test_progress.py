"""Progress of long steps: a bar on a terminal, a plain line every few seconds in a log."""

import io

import numpy as np
import torch

from hlbl import progress as pg


class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_log_lines_come_every_interval_and_not_for_short_steps():
    out, clock = io.StringIO(), FakeClock()
    bar = pg.LogLines(total=4_000_000, desc="epoch 3", unit="w", every=10.0, file=out, clock=clock)
    for _ in range(9):  # 9 s of work: shorter than the interval, no line
        clock.t += 1.0
        bar.update(100_000)
    assert out.getvalue() == ""
    clock.t += 1.0
    bar.set_postfix(loss="5.123")
    bar.update(100_000)  # 10 s: the first line
    clock.t += 5.0
    bar.update(1_000_000)  # 5 s later: none
    clock.t += 5.0
    bar.update(1_000_000)  # 10 s after the first: the second
    bar.close()
    lines = out.getvalue().splitlines()
    assert lines == [
        "epoch 3: 1M/4M w (25%), 100k w/s, 0:10 elapsed, ~0:30 left, loss=5.123",
        "epoch 3: 3M/4M w (75%), 150k w/s, 0:20 elapsed, ~0:07 left, loss=5.123",
    ]


def test_progress_is_a_bar_on_a_terminal_and_lines_elsewhere():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    assert isinstance(pg.progress(10, "x", file=io.StringIO()), pg.LogLines)
    assert not isinstance(pg.progress(10, "x", file=Tty()), pg.LogLines)
    assert not isinstance(pg.progress(10, "x", show=False, file=io.StringIO()), pg.LogLines)  # --quiet


def test_a_redirected_epoch_prints_progress_lines(monkeypatch, capsys):
    """Both engines' epochs, with stderr not a terminal (pytest captures it), write progress lines."""
    from hlbl import fast
    from hlbl.model import LBL, LBLConfig
    from hlbl.config import TrainConfig
    from hlbl.engine import train_epoch
    from hlbl.optim import make_optimizer
    from hlbl.tree import random_tree

    monkeypatch.setattr(pg, "LOG_EVERY", 0.0)  # a line at every update
    V = 30
    stream = np.random.default_rng(0).integers(0, V, 600).astype(np.int32)
    for run in (train_epoch, fast.train_epoch):
        model = LBL(LBLConfig(V, dim=8, context=2), random_tree(V, 0), torch.Generator().manual_seed(0))
        cfg = TrainConfig(batch_size=100, progress=True)
        run(model, make_optimizer(model, cfg, cfg.lr), stream, 0, cfg, 1, True)
        err = capsys.readouterr().err
        assert "epoch 1: " in err and "/600 w" in err, err
        run(model, make_optimizer(model, cfg, cfg.lr), stream, 0, cfg, 2, False)  # show=False: silent
        assert "epoch 2" not in capsys.readouterr().err


def test_heartbeat_writes_lines_while_no_unit_finishes(monkeypatch):
    """A step stuck inside one long unit (an n-gram order's sort) still writes a line every
    interval, with the elapsed time moving; after close the thread writes nothing more."""
    import time

    monkeypatch.setattr(pg, "LOG_EVERY", 0.05)
    out = io.StringIO()
    bar = pg.progress(5, "counting n-grams", "order", file=out, heartbeat=True)
    bar.every = 0.05
    bar.update(1)
    time.sleep(0.5)
    bar.close()
    time.sleep(0.15)
    lines = out.getvalue().splitlines()
    assert len(lines) >= 3 and all(line.startswith("counting n-grams: 1/5 order (20%)") for line in lines), lines
    assert len(out.getvalue().splitlines()) == len(lines)
    quiet = io.StringIO()
    pg.progress(5, "x", file=quiet, heartbeat=False).update(1)
    time.sleep(0.15)
    assert quiet.getvalue() == ""
