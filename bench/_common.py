"""What the benchmark scripts share: their flags, their corpora, their clocks and their result files.

* :func:`add_common` gives a parser ``--quick`` (every script has it: seconds on a tiny synthetic
  corpus, every output in a temporary directory, never over ``results/``), and where the script
  takes them ``--threads``, ``--data`` and ``--out``; :func:`finish_args` then applies quick mode.
* :func:`quick_dir`: where quick mode writes (``$HLBL_BENCH_OUT`` if set, else a fresh temporary
  directory); quick mode also points ``$HLBL_CACHE`` there, so nothing lands in the user's cache.
* :func:`run_subcommand`: a script with subcommands runs the one named, or with ``--quick`` all
  of them, small; :func:`quick_run`: a model trained for quick mode (``hlbl train``, one epoch).
* :func:`tiny_corpus`: a small synthetic corpus (train/valid/test text files) written to a
  directory; :func:`corpus_spec` is PTB (or ``--data``) normally, that corpus in quick mode.
* :func:`zipf_stream`: an i.i.d. Zipf token stream (the synthetic large-vocabulary corpora);
  :func:`zipf_model`: the scaling benchmarks' BALANCED-tree HLBL on one.
* :class:`Clock`, :func:`rate`, :func:`spread`: wall and CPU time of a block, words/s, and the
  median and range over rounds; :func:`side_by_side`: words/s of several models in turn, round
  robin, with each one's ratio to the flat LBL in the same round.
* :func:`write_json`: a results file written atomically (whole or not at all); :func:`machine`:
  what it was measured on.

``python bench/_common.py corpus DIR`` writes the synthetic corpus into DIR (the shell scripts'
quick mode uses it); ``python bench/_common.py quick-dir`` prints (and makes) quick mode's directory.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
_QUICK_DIR: list[Path] = []


# ---- flags ------------------------------------------------------------------------------------


def add_common(
    ap: argparse.ArgumentParser,
    *,
    threads: int | str | None = None,
    data: str | None = None,
    out: str | None = None,
    out_help: str = "",
    optional_out: bool = False,
) -> argparse.ArgumentParser:
    """Add ``--quick`` and, where given a default, ``--threads``, ``--data`` and ``--out``.

    ``out``: the default result path relative to the repository (e.g. ``results/throughput.json``);
    quick mode replaces it by the same name under :func:`quick_dir` (see :func:`finish_args`).
    ``optional_out``: the script writes ``--out`` only when given one (it prints its results),
    except in quick mode, which writes the file ``out`` names under :func:`quick_dir`."""
    ap.add_argument(
        "--quick",
        action="store_true",
        help="a check of the script itself: seconds on a tiny synthetic corpus, outputs in a temporary "
        "directory ($HLBL_BENCH_OUT if set), never over results/",
    )
    if threads is not None:
        ap.add_argument("--threads", type=type(threads), default=threads, help=f"threads (default {threads})")
    if data is not None:
        ap.add_argument("--data", default=data, help=f"corpus, as for hlbl train (default {data}; --quick: synthetic)")
    if out is not None:
        default = "none: printed only" if optional_out else out
        ap.add_argument("--out", default=None, help=out_help or f"results file (default {default})")
        ap.set_defaults(_out_default=out, _out_optional=optional_out)
    return ap


def finish_args(args: argparse.Namespace, **quick: object) -> argparse.Namespace:
    """Resolve ``--out`` and, with ``--quick``, apply quick mode: the keyword arguments replace
    the attributes of the same name (the small sizes), ``--data`` becomes the synthetic corpus
    and the default ``--out`` goes under :func:`quick_dir`."""
    default = getattr(args, "_out_default", None)
    if args.quick:
        quick_dir()
        for k, v in quick.items():
            setattr(args, k, v)
        if getattr(args, "data", None) is not None:
            args.data = str(tiny_corpus(quick_dir() / "corpus"))
        if default is not None and args.out is None:
            args.out = str(quick_dir() / Path(default).name)
    elif default is not None and args.out is None and not getattr(args, "_out_optional", False):
        args.out = str(ROOT / default)
    return args


def run_subcommand(ap: argparse.ArgumentParser, args: argparse.Namespace, quick: Callable, names: str) -> None:
    """A script with subcommands: run the one named, or with ``--quick`` and none, ``quick(args)``
    (every subcommand, small)."""
    if args.cmd is None:
        if not args.quick:
            ap.error(f"a subcommand ({names}), or --quick")
        quick(args)
        return
    args.func(args)


def quick_dir() -> Path:
    """Quick mode's output directory: ``$HLBL_BENCH_OUT`` if set, else a fresh temporary one
    (made once per process). It also becomes ``$HLBL_CACHE``'s parent for this process and its
    children, so encoded corpora and cached models stay there."""
    if not _QUICK_DIR:
        given = os.environ.get("HLBL_BENCH_OUT")
        d = Path(given) if given else Path(tempfile.mkdtemp(prefix="hlbl-bench-"))
        d.mkdir(parents=True, exist_ok=True)
        os.environ["HLBL_BENCH_OUT"] = str(d)  # children (and shell scripts) write there too
        os.environ["HLBL_CACHE"] = str(d / "cache")
        _QUICK_DIR.append(d)
        if not given:
            print(f"quick mode: writing under {d}", file=sys.stderr)
    return _QUICK_DIR[0]


def corpus_spec(args: argparse.Namespace, name: str = "ptb") -> str:
    """The corpus to read: ``args.data`` if the script has ``--data``, else ``name``; in quick
    mode the synthetic corpus (:func:`tiny_corpus`)."""
    if getattr(args, "quick", False):
        return str(tiny_corpus(quick_dir() / "corpus"))
    return getattr(args, "data", None) or name


def quick_run(name: str, *flags: str, epochs: int = 1) -> tuple[Path, str]:
    """Quick mode's trained model: ``hlbl train`` on the synthetic corpus (one thread, ``epochs``
    epochs, ``flags`` added) into ``quick_dir()/runs/NAME``, in this process; the run directory
    and what the command printed. A finished run of the same name is reused."""
    import contextlib
    import io

    from hlbl.cli import main as hlbl_main

    run = quick_dir() / "runs" / name
    printed = run / "train-output.txt"
    if (run / "state.json").is_file() and printed.is_file():
        return run, printed.read_text()
    if run.exists():
        import shutil

        shutil.rmtree(run)
    argv = ["train", "--data", str(tiny_corpus(quick_dir() / "corpus")), "--epochs", str(epochs)]
    argv += ["--threads", "1", "--quiet", "--out", str(run), *flags]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = hlbl_main(argv)
    if rc:
        raise SystemExit(f"hlbl {' '.join(argv)} failed ({rc})")
    printed.write_text(buf.getvalue())
    return run, buf.getvalue()


# ---- data -------------------------------------------------------------------------------------


def tiny_corpus(root: Path, n_train: int = 1500, vocab: int = 120, seed: int = 0) -> Path:
    """A small synthetic corpus in ``root`` (train/valid/test.txt, one sentence a line): words
    ``w0 .. w{vocab-1}`` drawn from a Zipf(1) law, with a bigram habit (after word i, word
    ``(3 i + 1) mod vocab`` half the time) so that a model has something to learn. Written once:
    an existing complete corpus is reused as it is."""
    root = Path(root)
    if all((root / f"{s}.txt").is_file() for s in ("train", "valid", "test")):
        return root
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, vocab + 1)
    p /= p.sum()

    def sentences(n: int) -> list[str]:
        out = []
        for _ in range(n):
            w = [int(rng.choice(vocab, p=p))]
            for _ in range(int(rng.integers(3, 12))):
                w.append((3 * w[-1] + 1) % vocab if rng.random() < 0.5 else int(rng.choice(vocab, p=p)))
            out.append(" ".join(f"w{i}" for i in w))
        return out

    root.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("valid", n_train // 10), ("test", n_train // 10)):
        tmp = root / f".{split}.txt.tmp"
        tmp.write_text("\n".join(sentences(n)) + "\n", encoding="utf-8")
        os.replace(tmp, root / f"{split}.txt")
    return root


def zipf_stream(V: int, n_tokens: int, seed: int, s: float = 1.0) -> np.ndarray:
    """(n_tokens,) int32 i.i.d. tokens with P(word r) proportional to 1/(r+1)^s (id 0 most frequent)."""
    p = 1.0 / np.arange(1, V + 1, dtype=np.float64) ** s
    cdf = np.cumsum(p / p.sum())
    u = np.random.default_rng(seed).random(n_tokens)
    return np.minimum(np.searchsorted(cdf, u), V - 1).astype(np.int32)


def zipf_model(V: int, tokens: int, optimizer: str = "momentum"):
    """The scaling benchmarks' set-up: ``tokens`` Zipf(1) tokens over V words (seed 2), an HLBL
    (d = 100, context 5) on a BALANCED tree over the words in frequency order, unigram-initialised,
    the default recipe. Returns (stream, model, cfg, optimizer)."""
    import torch

    from hlbl.config import TrainConfig
    from hlbl.model import LBL, LBLConfig
    from hlbl.optim import make_optimizer
    from hlbl.tree import balanced_tree

    stream = zipf_stream(V, tokens, seed=2)
    model = LBL(LBLConfig(V, dim=100, context=5), balanced_tree(np.arange(V)), torch.Generator().manual_seed(0))
    model.init_unigram(np.bincount(stream, minlength=V).astype(np.float64))
    cfg = TrainConfig(progress=False, optimizer=optimizer)
    return stream, model, cfg, make_optimizer(model, cfg, cfg.lr)


def side_by_side(
    rounds: int, flat: Callable[[int], float], others: dict[str, Callable[[], float]]
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Words/s of several models trained in turn, round robin, and each one's ratio to the flat
    model's in the same round. Each round: ``flat(0)`` (the flat model on the first half of its
    slice, returning words/s), every ``others`` function, ``flat(1)`` (the second half): the flat
    rate is over both halves, a window centred on the others'. Round 0 warms up and is not kept.
    Returns (words/s by name, ratios to flat by name), one value a round."""
    wps: dict[str, list[float]] = {"flat": [], **{n: [] for n in others}}
    ratios: dict[str, list[float]] = {n: [] for n in others}
    for r in range(rounds + 1):
        w1 = flat(0)
        got = {n: fn() for n, fn in others.items()}
        w2 = flat(1)
        got["flat"] = 2 / (1 / w1 + 1 / w2)  # words/s over both halves (equal token counts)
        if r == 0:
            continue
        for n, w in got.items():
            wps[n].append(w)
            if n != "flat":
                ratios[n].append(w / got["flat"])
        print(f"round {r}: " + "  ".join(f"{n} {w:,.0f}" for n, w in got.items()), flush=True)
    return wps, ratios


# ---- clocks -----------------------------------------------------------------------------------


class Clock:
    """Wall and process-CPU seconds of a block: ``with Clock() as c: ...; c.wall, c.cpu``."""

    def __enter__(self) -> Clock:
        self.w, self.c = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        self.wall, self.cpu = time.perf_counter() - self.w, time.process_time() - self.c


def rate(tokens: int, clock: Clock) -> dict:
    """Words/s of a timed block, by wall time and by process CPU time."""
    return {
        "wps": tokens / clock.wall,
        "cpu_wps": tokens / max(clock.cpu, 1e-9),
        "tokens": tokens,
        "wall_s": clock.wall,
    }


def spread(values: list[float]) -> dict:
    """Median and range of the rounds' values."""
    return {"median": float(np.median(values)), "min": float(min(values)), "max": float(max(values)), "n": len(values)}


# ---- results ----------------------------------------------------------------------------------


def write_json(path: str | os.PathLike, obj) -> Path:
    """``obj`` as indented JSON in ``path``, atomically (a stopped run leaves the old file whole)."""
    from hlbl.atomic import write_text

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(obj, indent=1) + "\n")
    return path


def loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def machine() -> dict:
    """What a measurement ran on: CPUs, architecture, load average, and the versions that matter."""
    info = {
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "system": platform.system(),
        "python": platform.python_version(),
        "loadavg": loadavg(),
    }
    for mod in ("numpy", "torch", "numba"):
        m = sys.modules.get(mod)
        if m is not None:
            info[mod] = getattr(m, "__version__", None)
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("corpus", help="write the synthetic corpus into DIR")
    c.add_argument("dir")
    sub.add_parser("quick-dir", help="make (and print) quick mode's output directory")
    args = ap.parse_args(argv)
    if args.cmd == "corpus":
        print(tiny_corpus(Path(args.dir)))
    else:
        print(quick_dir())
    return 0


if __name__ == "__main__":
    sys.exit(main())
