"""The paper's scale and beyond: Gutenberg (50.1M training tokens, a 190k-word vocabulary), end to end.

    python bench/gutenberg.py STAGE [--data gutenberg] [--work runs/gutenberg] [--out results/gutenberg]
    python bench/gutenberg.py --quick     # a check of the script: every stage, in order, on tiny corpora

Stages, each in its own processes, each writing ``OUT/STAGE.json`` (``summary`` joins them):

* ``vocab``: vocabulary + encoding of the train split into a fresh cache, with the default rule
  (``--min-count auto``: 2 here) and with ``--max-vocab 50000``; seconds and peak RSS.
* ``speed``: training words/s of the fast engine on PTB and on Gutenberg with its full default
  vocabulary, the same recipe (RANDOM tree, d = 100, 5 context words, one thread), alternating
  corpora in one process; wall and CPU clocks (the machine is shared: CPU time is steadier).
* ``phases``: where a step's time goes on each corpus (the ``speed`` recipe, one process,
  corpora and block sizes alternating): the steps' milliseconds per minibatch split by phase
  (``hlbl.kernels.PHASES``), the distinct rows a step touches, the fixed cost of a
  ``train_epoch`` call beside its steps, and each block size's time paired with block 32's.
* ``memory``: peak memory of a training process on the train split (50M tokens) and on the train
  split given twice (100M), the same vocabulary and model: ``VmHWM`` (the kernel's peak RSS), and
  the peaks of its two parts sampled every 0.2 s, anonymous memory (the process's own: model,
  optimiser state, buffers) and file pages (mapped files: the libraries, and any pages of the
  memory-mapped encoded split that were read through the mapping; training reads the split
  through its file into a bounded buffer, ``hlbl.data.EpochReader``).
* ``mapped``: RSS after 16,000 random reads of the memory-mapped 100M-token split (run after
  ``memory``), with and without ``MADV_RANDOM``: why training does not read the split through
  the mapping.
* ``kn``: our modified Kneser-Ney 5-gram of the train split, each model in a child process
  (its peak RSS is the child's): the open vocabulary (every train word, KenLM's ``query``
  protocol: one ``</s>`` a line, OOV tokens scored as ``<unk>`` and counted), the default
  vocabulary and the 50k one (the neural models' vocabularies), test and valid perplexity.
* ``hlbl VOCAB`` (``default`` or ``50k``): the CLI pipeline a user runs, each command timed:
  ``hlbl train`` with a RANDOM tree, ``hlbl tree build`` ADAPTIVE(0.4) x2 over the whole
  vocabulary, ``hlbl train`` on that tree, ``hlbl eval`` (test), ``hlbl ngram train`` (binary
  form), ``hlbl eval --interpolate`` (weight tuned on valid), ``hlbl predict``, ``hlbl generate``,
  ``hlbl score``. ``--epochs`` caps training (a full run to early stopping takes hours here).
  ``--long-epochs N`` adds the x2 tree trained from the start with the halving schedule, for at
  most N epochs of 10M positions (``--epoch-tokens``' default: six a pass here);
  ``--two-rate-epochs N`` the same with the paper's two-rate schedule.
* ``frontier``: quality against training time on this corpus (``frontier.md``, ``frontier.json``):
  every trained model of the ``hlbl`` stages and KN5, and beside them the training words/s of the
  flat LBL, NCE and the sampled softmax (k = 25) and of the HLBL trees, measured side by side in
  one process per vocabulary (``bench/frontier.py speed``, ``frontier_speed_VOCAB.json``): at
  190k words a pass of the flat LBL would take days here, so the flat and sampled layers have a
  speed but no trained row.
* ``summary``: ``summary.json`` (one object) and ``table.md`` from the stages' files.

Run directories and models go under ``--work``; the corpus is never copied into the results.

``--quick``: every stage in order (vocab, speed, phases, memory, mapped, hlbl default, kn,
frontier, summary), or the one named, with a few minibatches of each and one round, on two
synthetic corpora (``bench/_common.py``) standing in for Gutenberg and PTB; ``--work`` and
``--out`` in a temporary directory.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _common import ROOT, add_common, finish_args, quick_dir, tiny_corpus, write_json

# KenLM lmplz / query on this corpus and machine (reference figures).
KENLM = {
    "build_s": 66.0,
    "peak_rss_mb": 3.9 * 1024,
    "open_test_ppl": 157.94,
    "open_valid_ppl": 168.29,
    "closed50k_test_ppl": 116.55,
    "closed50k_valid_ppl": 122.02,
    "test_tokens": 2_041_324,
    "test_oov": 15_652,
}
VOCABS = {"default": [], "50k": ["--max-vocab", "50000"]}
# The hlbl stage's trained models: run name, table label, the step that trains it.
HLBL_RUNS = (
    ("random", "HLBL, RANDOM tree", "train_random"),
    ("x2", "HLBL, ADAPTIVE(0.4) x2 tree", "train_x2"),
    ("x2-low", "HLBL, ADAPTIVE(0.4) x2 tree, then on at the final rate from every weight", "train_x2_low"),
    ("x2-long", "HLBL, ADAPTIVE(0.4) x2 tree, epochs of 10M positions, halving schedule", "train_x2_long"),
    ("x2-two-rate", "HLBL, ADAPTIVE(0.4) x2 tree, epochs of 10M positions, two-rate schedule", "train_x2_two_rate"),
)


def run_child(argv: list[str], env: dict | None = None, stdout=None, stderr=None) -> dict:
    """Run ``argv``; its wall and CPU seconds and peak RSS (the child's own, from wait4)."""
    t = time.perf_counter()
    p = subprocess.Popen(argv, env={**os.environ, **(env or {})}, stdout=stdout or subprocess.PIPE, stderr=stderr)
    out = p.stdout.read() if p.stdout is not None else b""
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t
    if p.returncode != 0:
        raise SystemExit(f"{shlex.join(argv)} failed with status {p.returncode}")
    return {
        "wall_s": round(wall, 2),
        "cpu_s": round(ru.ru_utime + ru.ru_stime, 2),
        "peak_rss_mb": round(ru.ru_maxrss / 1024, 1),
        "stdout": out.decode(),
    }


def hlbl(*args: str) -> list[str]:
    return [sys.executable, "-m", "hlbl", *args]


def me(*args: str) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), *args]


# ---------------------------------------------------------------------------------------- vocab


def stage_vocab(args) -> dict:
    rows = {}
    for name, flags in VOCABS.items():
        with tempfile.TemporaryDirectory() as cache:  # a fresh cache: counting and encoding really run
            code = (
                "import json, sys, time\n"
                "from hlbl.data import load_corpus\n"
                "t = time.perf_counter()\n"
                f"c = load_corpus({args.data!r}, max_vocab={50000 if flags else None}, splits=('train',))\n"
                "print(json.dumps({'vocab_size': len(c.vocab), 'train_tokens': len(c['train']), "
                "'seconds': time.perf_counter() - t}))\n"
            )
            r = run_child([sys.executable, "-c", code], env={"HLBL_CACHE": cache})
        info = json.loads(r.pop("stdout").strip().splitlines()[-1])
        rows[name] = {**info, **r}
        print(f"vocab {name}: {info}", file=sys.stderr)
    return {"rows": rows, "note": "train split only; a fresh cache; seconds inside the process (imports excluded)"}


# ---------------------------------------------------------------------------------------- speed


def _speed_setup(args):
    """Both stages' like-for-like setup: PTB and the corpus, one thread, the same recipe, a RANDOM
    tree each; returns (corpora, cfg, {name: (model, optimizer)})."""
    import torch

    from hlbl import fast
    from hlbl.data import load_corpus
    from hlbl.model import LBL, LBLConfig
    from hlbl.config import TrainConfig
    from hlbl.optim import make_optimizer
    from hlbl.tree import random_tree

    fast.set_numba_threads(1)
    torch.set_num_threads(1)
    corpora = {"ptb": load_corpus(args.ptb), "gutenberg": load_corpus(args.data)}
    cfg = TrainConfig(progress=False)
    models = {}
    for name, c in corpora.items():
        V = len(c.vocab)
        m = LBL(LBLConfig(V, dim=100, context=5, output="tree"), random_tree(V, 0), torch.Generator().manual_seed(0))
        m.init_unigram(c.vocab.counts)
        models[name] = (m, make_optimizer(m, cfg, cfg.lr))
    return corpora, cfg, models


def stage_speed(args) -> dict:
    import numpy as np

    from hlbl import fast
    from hlbl.tree import random_tree

    corpora, cfg, models = _speed_setup(args)
    runs: dict[str, list] = {n: [] for n in corpora}
    batches = args.speed_batches
    engines = {name: fast.FastEngine(threads=1) for name in corpora}  # one a model: its paths built once
    for rnd in range(args.speed_rounds + 1):  # round 0 compiles and warms the caches: not counted
        for name, c in corpora.items():
            m, opt = models[name]
            c0, t0 = time.process_time(), time.perf_counter()
            probe = fast.Probe(max_batches=batches)
            engines[name].train(m, opt, c["train"], c.vocab.eos, cfg, rnd + 1, False, probe)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            words = min(len(c["train"]), batches * cfg.batch_size)
            if rnd:
                runs[name].append({"wps": words / wall, "words_per_cpu_s": words / cpu})
            print(f"speed {name} round {rnd}: {words / wall:,.0f} w/s, {words / cpu:,.0f} w/cpu-s", file=sys.stderr)
    out = {}
    for name in corpora:
        out[name] = {
            "vocab_size": len(corpora[name].vocab),
            "wps_median": statistics.median(r["wps"] for r in runs[name]),
            "words_per_cpu_s_median": statistics.median(r["words_per_cpu_s"] for r in runs[name]),
            "rounds": runs[name],
        }
        depth = float(np.mean(random_tree(len(corpora[name].vocab), 0).leaf_depth))
        out[name]["mean_code_length"] = round(depth, 2)
    return {
        "corpora": out,
        "words_per_round": batches * cfg.batch_size,
        "ratio_wall": out["gutenberg"]["wps_median"] / out["ptb"]["wps_median"],
        "ratio_cpu": out["gutenberg"]["words_per_cpu_s_median"] / out["ptb"]["words_per_cpu_s_median"],
        "recipe": "RANDOM tree, d=100, context 5, batch 1000, momentum, one thread; median of rounds",
    }


def stage_phases(args) -> dict:
    import numpy as np

    from hlbl import fast

    corpora, cfg, models = _speed_setup(args)
    blocks = [int(b) for b in args.blocks.split(",")]
    runs = [(b, name) for b in blocks for name in corpora]
    got: dict = {k: [] for k in runs}
    engines = {name: fast.FastEngine(threads=1) for name in corpora}
    epoch = 0
    for rnd in range(args.phase_rounds + 1):  # round 0 compiles and warms: not counted
        for b, name in runs if rnd % 2 else runs[::-1]:  # each round in the other direction
            m, opt = models[name]
            c = corpora[name]
            epoch += 1
            probe = fast.Probe(max_batches=args.phase_batches, block=b)
            t = time.perf_counter()
            engines[name].train(m, opt, c["train"], c.vocab.eos, cfg, epoch, False, probe)
            wall = time.perf_counter() - t
            st = probe.stats
            if rnd:
                got[b, name].append({**st, "wall_s": wall})
    nb = args.phase_batches
    med = statistics.median
    rows = {}
    for b, name in runs:
        r = got[b, name]
        rows[f"{name}_block{b}"] = {
            "steps_ms_per_batch": med(x["steps_s"] for x in r) * 1000 / nb,
            "phases_ms_per_batch": {p: med(x["phases_s"][p] for x in r) * 1000 / nb for p in r[0]["phases_s"]},
            "rows_per_step": med(x["rows_per_step"] for x in r),
            "call_overhead_s": med(x["wall_s"] - x["steps_s"] for x in r),
        }
    b0 = blocks[0]
    paired = {
        f"{name}_block{b}_over_block{b0}": float(
            np.median([x["steps_s"] / y["steps_s"] for x, y in zip(got[b, name], got[b0, name])])
        )
        for b in blocks[1:]
        for name in corpora
    }
    return {
        "rows": rows,
        "steps_ratio": {
            f"block{b}": rows[f"ptb_block{b}"]["steps_ms_per_batch"] / rows[f"gutenberg_block{b}"]["steps_ms_per_batch"]
            for b in blocks
        },
        "paired_time_ratio": paired,
        "batches_per_run": nb,
        "rounds": args.phase_rounds,
        "note": (
            "medians over rounds; steps_ratio = Gutenberg's words/s over PTB's counting the steps only; "
            "call_overhead_s = a train_epoch call's time beside its steps (ids check, buffers, the final catch-up of every row)"
        ),
    }


# --------------------------------------------------------------------------------------- memory


def _status() -> dict:
    """Fields of /proc/self/status in kB."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem"):
                out[k] = int(v.split()[0])
    return out


def memory_child(args) -> None:
    """One training process: the model of --vocab-from's vocabulary on --corpus's train split."""
    import torch

    from hlbl import fast
    from hlbl.data import Vocab, load_corpus
    from hlbl.model import LBL, LBLConfig
    from hlbl.config import TrainConfig
    from hlbl.optim import make_optimizer
    from hlbl.tree import random_tree

    peaks = {"RssAnon": 0, "RssFile": 0}
    stop = threading.Event()

    def sample():
        while not stop.wait(0.2):
            s = _status()
            for k in peaks:
                peaks[k] = max(peaks[k], s.get(k, 0))

    threading.Thread(target=sample, daemon=True).start()
    fast.set_numba_threads(1)
    torch.set_num_threads(1)
    vocab = Vocab.from_json(json.loads(Path(args.vocab_from).read_text()))
    corpus = load_corpus(args.corpus, vocab=vocab, splits=("train",))
    stream = corpus["train"]
    V = len(vocab)
    cfg = TrainConfig(progress=True)
    model = LBL(LBLConfig(V, dim=100, context=5, output="tree"), random_tree(V, 0), torch.Generator().manual_seed(0))
    model.init_unigram(vocab.counts)
    opt = make_optimizer(model, cfg, cfg.lr)
    before = _status()
    t = time.perf_counter()
    probe = fast.Probe(max_batches=args.batches)
    _, wps = fast.FastEngine(threads=1).train(model, opt, stream, vocab.eos, cfg, 1, True, probe)
    stop.set()
    s = _status()
    params = sum(p.numel() for p in model.parameters())
    print(
        json.dumps(
            {
                "train_tokens": len(stream),
                "vocab_size": V,
                "trained_tokens": min(len(stream), args.batches * cfg.batch_size),
                "seconds": time.perf_counter() - t,
                "wps": wps,
                "params": params,
                # parameters and their momentum buffers, float32
                "model_and_optimizer_mb": 2 * 4 * params / 2**20,
                "encoded_split_mb": 4 * len(stream) / 2**20,
                "vm_hwm_mb": s["VmHWM"] / 1024,
                "peak_anon_mb": max(peaks["RssAnon"], s["RssAnon"]) / 1024,
                "peak_file_mb": max(peaks["RssFile"], s["RssFile"]) / 1024,
                "anon_before_training_mb": before["RssAnon"] / 1024,
            }
        )
    )


def stage_memory(args) -> dict:
    from hlbl.data import load_corpus, resolve_corpus

    src = resolve_corpus(args.data)
    corpus = load_corpus(args.data, splits=("train",))  # the default vocabulary, for both sizes
    work = Path(args.work)
    vocab_path = work / "memory-vocab.json"
    write_json(vocab_path, corpus.vocab.to_json())
    twice = work / "train-twice"  # the train split given twice: 100M tokens (under --work, never in results)
    twice.mkdir(parents=True, exist_ok=True)
    if (
        not (twice / "train.txt").exists()
        or (twice / "train.txt").stat().st_size != 2 * (src / "train.txt").stat().st_size
    ):
        with open(twice / "train.txt.tmp", "wb") as out:
            for _ in range(2):
                with open(src / "train.txt", "rb") as f:
                    while block := f.read(1 << 24):
                        out.write(block)
        os.replace(twice / "train.txt.tmp", twice / "train.txt")
    rows = {}
    for name, spec in (("50m", str(src)), ("100m", str(twice))):
        # Encode first (its own process), so that the training process's figures are training's.
        enc = (
            "import json, sys\nfrom hlbl.data import Vocab, load_corpus\n"
            f"v = Vocab.from_json(json.loads(open({str(vocab_path)!r}).read()))\n"
            f"print(len(load_corpus({spec!r}, vocab=v, splits=('train',))['train']))\n"
        )
        run_child([sys.executable, "-c", enc])
        r = run_child(
            me(
                "_memory_child",
                "--corpus",
                spec,
                "--vocab-from",
                str(vocab_path),
                "--batches",
                str(args.memory_batches),
            )
        )
        info = json.loads(r.pop("stdout").strip().splitlines()[-1])
        rows[name] = {**info, "child_peak_rss_mb": r["peak_rss_mb"], "wall_s": r["wall_s"]}
        print(f"memory {name}: {info}", file=sys.stderr)
    return {
        "rows": rows,
        "ratio_vm_hwm": rows["100m"]["vm_hwm_mb"] / rows["50m"]["vm_hwm_mb"],
        "ratio_anon": rows["100m"]["peak_anon_mb"] / rows["50m"]["peak_anon_mb"],
        "note": (
            f"first {args.memory_batches} minibatches of an epoch (positions from the first two groups of 4M tokens, "
            "read through the file into the engine's buffer); vm_hwm = the kernel's peak RSS of the process"
        ),
    }


def stage_mapped(args) -> dict:
    """Whether random reads of a memory-mapped encoded split can be kept out of RSS: RssFile after
    16,000 random reads (one engine chunk of 16 minibatches), with and without madvise advice."""
    import mmap

    import numpy as np

    from hlbl.data import load_corpus

    corpus = load_corpus(
        str(Path(args.work) / "train-twice"), vocab=load_corpus(args.data, splits=("train",)).vocab, splits=("train",)
    )
    path = Path(corpus["train"].filename)
    del corpus
    rss_file = lambda: _status_file()  # noqa: E731
    rng = np.random.default_rng(0)
    rows = []
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mm:
        a = np.frombuffer(mm, dtype="<i4")
        for advice in ("none", "MADV_RANDOM"):
            mm.madvise(mmap.MADV_DONTNEED)
            if advice == "MADV_RANDOM":
                mm.madvise(mmap.MADV_RANDOM)
            before = rss_file()
            t = time.perf_counter()
            int(a[rng.integers(0, len(a), 16000)].sum())
            rows.append(
                {
                    "advice": advice,
                    "reads": 16000,
                    "seconds": time.perf_counter() - t,
                    "rss_file_mb": (rss_file() - before) / 1024,
                }
            )
        t = time.perf_counter()
        mm.madvise(mmap.MADV_DONTNEED)
        dontneed_s = time.perf_counter() - t
        after = rss_file() - before
        del a
    return {
        "split_mb": path.stat().st_size / 2**20,
        "rows": rows,
        "dontneed_s": dontneed_s,
        "rss_file_mb_after_dontneed": after / 1024,
    }


def _status_file() -> int:
    return _status().get("RssFile", 0)


# ------------------------------------------------------------------------------------------- kn


def kn_child(args) -> None:
    """Build one KN model in this process; print its figures (JSON)."""
    import numpy as np

    from hlbl.data import load_corpus
    from hlbl.ngram import token_log_probs, train_kneser_ney

    from hlbl.ngram import read_arpa

    kw = {"min_count": 1} if args.vocab == "open" else {"max_vocab": 50000} if args.vocab == "50k" else {}
    corpus = load_corpus(args.data, **kw)
    out = {"vocab": args.vocab, "vocab_size": len(corpus.vocab)}
    if args.load:  # built by the hlbl stage's `hlbl ngram train` (its time and memory are recorded there)
        model = read_arpa(args.load)
    else:
        t, c = time.perf_counter(), time.process_time()
        model = train_kneser_ney(corpus["train"], corpus.vocab, args.order)
        out["build_s"] = time.perf_counter() - t
        out["build_cpu_s"] = time.process_time() - c  # steadier than wall time on a shared machine
        out["build_peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out.update(order=model.order, ngrams=model.sizes())
    for split in ("test", "valid"):
        lp = token_log_probs(model, corpus[split], corpus.vocab)
        out[f"{split}_ppl"] = math.exp(-float(np.mean(lp)))
        out[f"{split}_tokens"] = len(lp)
        out[f"{split}_oov"] = corpus.token_counts(split)["oov"]
    print(json.dumps(out))


def stage_kn(args) -> dict:
    work = Path(args.work)
    prev_file = Path(args.out) / "kn.json"  # rows measured by an earlier run of this stage are kept
    rows = json.loads(prev_file.read_text())["rows"] if prev_file.exists() else {}
    for vocab in ("open", "default", "50k"):
        if vocab in rows:
            continue
        argv = me("_kn_child", vocab, "--data", args.data, "--order", "5")
        if vocab != "open":  # the neural models' vocabularies: the hlbl stage built these with the CLI
            if not (work / vocab / "kn5.safetensors").exists():
                continue
            argv += ["--load", str(work / vocab / "kn5.safetensors")]
        r = run_child(argv)
        info = json.loads(r.pop("stdout").strip().splitlines()[-1])
        rows[vocab] = {**info, "process_peak_rss_mb": r["peak_rss_mb"], "process_wall_s": r["wall_s"]}
        print(f"kn {vocab}: {rows[vocab]}", file=sys.stderr)
    o = rows["open"]
    return {
        "rows": rows,
        "kenlm": KENLM,
        "prune": None,
        "vs_kenlm": {
            "time_ratio": o["build_s"] / KENLM["build_s"],
            "memory_ratio": o["process_peak_rss_mb"] / KENLM["peak_rss_mb"],
            "open_test_diff": o["test_ppl"] - KENLM["open_test_ppl"],
            "open_valid_diff": o["valid_ppl"] - KENLM["open_valid_ppl"],
            **(
                {
                    "closed50k_test_diff": rows["50k"]["test_ppl"] - KENLM["closed50k_test_ppl"],
                    "closed50k_valid_diff": rows["50k"]["valid_ppl"] - KENLM["closed50k_valid_ppl"],
                }
                if "50k" in rows
                else {}
            ),
        },
    }


# ----------------------------------------------------------------------------------------- hlbl


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def stage_hlbl(args) -> dict:
    """The CLI pipeline for one vocabulary; each step is skipped when its output exists (resumable)."""
    name = args.vocab
    flags = VOCABS[name]
    work = Path(args.work) / name
    work.mkdir(parents=True, exist_ok=True)
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    # An epoch of these runs is a whole pass (--epoch-tokens 0), as when their rows were made.
    epochs = ["--epochs", str(args.epochs), "--epoch-tokens", "0", "--threads", "1"]
    steps: dict[str, dict] = {}
    prev_file = Path(args.out) / f"hlbl-{name}.json"
    prev = json.loads(prev_file.read_text()).get("steps", {}) if prev_file.exists() else {}

    def step(key: str, argv: list[str], done: Path | None = None, stdout_file: Path | None = None, stdin=None):
        if done is not None and done.exists():  # made by an earlier run of this stage (or by hand, the same command)
            # (the command as this stage now writes it: the same training, flags made explicit)
            steps[key] = {**prev.get(key, {"kept": True}), "command": "hlbl " + shlex.join(argv[3:])}
            print(f"{key}: kept ({done})", file=sys.stderr)
            return steps[key]
        print(f"{key}: {shlex.join(argv[2:])}", file=sys.stderr)
        with open(logs / f"{key}.log", "wb") as err:
            if stdin is not None:
                t = time.perf_counter()
                p = subprocess.run(argv, input=stdin, stdout=subprocess.PIPE, stderr=err, check=True)
                r = {"wall_s": round(time.perf_counter() - t, 2), "stdout": p.stdout.decode()}
            else:
                r = run_child(argv, stderr=err)
        r["command"] = "hlbl " + shlex.join(argv[3:])
        out = r.pop("stdout")
        if stdout_file is not None:
            stdout_file.write_text(out)
        r["stdout_tail"] = out.strip().splitlines()[-3:]
        steps[key] = r
        return r

    random_run, tree_run = work / "random", work / "x2"
    kn = work / "kn5.safetensors"
    step(
        "train_random",
        hlbl("train", "--data", args.data, *flags, "--tree", "random", *epochs, "--out", str(random_run)),
        random_run / "best.safetensors",
    )
    tree = work / "adaptive0.4x2.json"
    step(
        "tree_build",
        hlbl(
            "tree",
            "build",
            "--from",
            str(random_run),
            "--policy",
            "adaptive:0.4",
            "--copies",
            "2",
            "--threads",
            "1",
            "--out",
            str(tree),
        ),
        tree,
    )
    step(
        "train_x2",
        hlbl("train", "--data", args.data, *flags, "--tree", str(tree), *epochs, "--out", str(tree_run)),
        tree_run / "best.safetensors",
    )
    runs = [random_run, tree_run]
    if args.low_lr:  # then the x2 model at the schedule's final rate, every weight kept
        low_run = work / "x2-low"
        low_epochs = args.low_epochs or args.epochs
        argv = hlbl(
            "train", "--data", args.data, *flags, "--tree", str(tree), "--init-from", str(tree_run), "--keep-output",
            "--lr", f"{args.low_lr:g}", "--epochs", str(low_epochs), "--epoch-tokens", "0", "--threads", "1",
            "--out", str(low_run),
        )  # fmt: skip
        done = (low_run / "state.json").exists() and len(_metrics(low_run)) >= low_epochs
        if (low_run / "run.json").exists() and not done:
            # a shorter run of the same command goes on (resume is exact: the same as one longer run)
            r = step("train_x2_low", argv + ["--resume"])
            r["command"] = "hlbl " + shlex.join(argv[3:])
        else:
            step("train_x2_low", argv, low_run / "best.safetensors")
        runs.append(low_run)
    # The x2 tree from the start in epochs of 10M positions (six a pass): the rate halved on small
    # validation gains, and (to compare) the paper's two rates.
    done_flags = {}
    for run_name, schedule, cap, key in (
        ("x2-long", "halve", args.long_epochs, "train_x2_long"),
        ("x2-two-rate", "two-rate", args.two_rate_epochs, "train_x2_two_rate"),
    ):
        if not cap:
            continue
        run = work / run_name
        argv = hlbl(
            "train", "--data", args.data, *flags, "--tree", str(tree), "--lr-schedule", schedule,
            "--epochs", str(cap), "--threads", "1", "--out", str(run),
        )  # fmt: skip
        state = run / "state.json"
        done = state.exists() and (json.loads(state.read_text())["done"] or len(_metrics(run)) >= cap)
        if (run / "run.json").exists() and not done:
            r = step(key, argv + ["--resume"])
            r["command"] = "hlbl " + shlex.join(argv[3:])
        else:
            step(key, argv, run / "best.safetensors")
        done_flags[run_name] = json.loads(state.read_text())["done"]
        runs.append(run)
    if not kn.exists():
        step("kn5", hlbl("ngram", "train", "--data", args.data, *flags, "--order", "5", "--out", str(kn)))
    evals = {}
    for run in runs:
        for key, argv in (
            (f"eval_{run.name}", hlbl("eval", str(run), "--split", "test")),
            (f"mix_{run.name}", hlbl("eval", str(run), "--interpolate", str(kn), "--weight", "auto")),
        ):
            # an evaluation newer than the run's weights (and the KN model) is kept, not run again
            result = logs / f"{key}.json"
            fresh = result.exists() and result.stat().st_mtime > max(
                (run / "best.safetensors").stat().st_mtime, kn.stat().st_mtime
            )
            step(key, argv, result if fresh else None, stdout_file=result)
            evals[key.removeprefix("eval_")] = json.loads(result.read_text().strip().splitlines()[-1])
    contexts = b"It was the best of\nThe old man looked at the\n"
    step("predict", hlbl("predict", str(tree_run), "--k", "5"), stdin=contexts)
    step(
        "generate",
        hlbl("generate", str(tree_run), "--tokens", "40", "--seed", "1", "--prompt", "It was a dark and stormy night"),
    )
    step(
        "score",
        hlbl("score", str(tree_run)),
        stdin=b"It was a dark and stormy night .\nNight stormy a was dark it and .\n",
    )
    return {
        "vocab": name,
        "flags": flags,
        "epochs_cap": args.epochs,
        "stopped_early": done_flags,
        "steps": steps,
        "evals": evals,
        "metrics": {run.name: _metrics(run) for run in runs},
        "tree_stats": json.loads(
            subprocess.run(hlbl("tree", "stats", str(tree_run)), capture_output=True, check=True)
            .stdout.decode()
            .strip()
            .splitlines()[-1]
        ),
    }


# ------------------------------------------------------------------------------------- frontier

SPEED_KINDS = (
    ("flat", "LBL (flat softmax)"),
    ("nce-25", "LBL, NCE k = 25"),
    ("sampled-25", "LBL, sampled softmax k = 25"),
)


def stage_frontier(args) -> dict:
    out, work = Path(args.out), Path(args.work)
    kn = json.loads((out / "kn.json").read_text())["rows"]
    rows = []
    for vocab, flags in VOCABS.items():
        hl_file = out / f"hlbl-{vocab}.json"
        if not hl_file.exists():
            continue
        hl = json.loads(hl_file.read_text())
        speed_file = out / f"frontier_speed_{vocab}.json"
        if not speed_file.exists() or args.remeasure:
            cmd = [sys.executable, str(ROOT / "bench" / "frontier.py"), "speed", "--data", args.data, *flags]
            cmd += ["--trees", "random=random", f"x2={work / vocab / 'adaptive0.4x2.json'}", "--samples", "25"]
            tokens = ["2000", "1000"] if args.quick else ["50000", "4000"]
            cmd += ["--rounds", str(args.speed_rounds), "--tokens", tokens[0], "--flat-tokens", tokens[1]]
            subprocess.run(cmd + ["--out", str(speed_file)], check=True)
        sp = json.loads(speed_file.read_text())
        wps, ratio = sp["words_per_s_median"], sp["ratio_to_flat_median"]
        n_train, k = sp["train_tokens"], kn[vocab]["test_ppl"]

        def add(model, test, valid, passes, hours, key, command):
            w = wps.get(key) if key else None
            rows.append(
                {
                    "vocabulary": vocab,
                    "vocab_size": sp["vocab_size"],
                    "model": model,
                    "test_ppl": test,
                    "valid_ppl": valid,
                    "vs_kn5": None if test is None else test / k - 1,
                    "passes": passes,
                    "train_hours_own_run": hours,
                    "words_per_s": w,
                    "speed_vs_flat": 1.0 if key == "flat" else ratio.get(key) if key else None,
                    "hours_per_pass": None if w is None else n_train / w / 3600,
                    "command": command,
                }
            )

        runs = {r: (label, key) for r, label, key in HLBL_RUNS}
        for run, (label, step) in runs.items():
            if run not in hl["evals"]:
                continue
            m = hl["metrics"][run]
            seen = sum((x.get("parts") and 1 / x["parts"]) or 1 for x in m)  # passes over the split
            hours = sum(x["epoch_minutes"] for x in m) / 60
            if run == "x2-low":  # it goes on from the x2 run
                seen += len(hl["metrics"]["x2"])
                hours += sum(x["epoch_minutes"] for x in hl["metrics"]["x2"]) / 60
            e = hl["evals"][run]
            key = "tree:random" if run == "random" else "tree:x2"
            add(label, e["perplexity"], min(x["valid_ppl"] for x in m), seen, hours, key, hl["steps"][step]["command"])
            mix = hl["evals"].get(f"mix_{run}")
            if mix:
                add(
                    f"{label} + KN5 (w = {mix['weight']:.3f})", mix["perplexity"], None, seen, hours, None,
                    hl["steps"][f"mix_{run}"]["command"],
                )  # fmt: skip
        for cell in grid_cells(out, vocab):  # bench/scale.py grid: d, context, tree, trained to the schedule's end
            name = f"HLBL, d = {cell['dim']}, context {cell['context']}, {cell.get('tree', 'adaptive0.4x2')} tree"
            name += f", {cell['processes']} processes" if cell.get("processes", 1) > 1 else ""
            name += "" if cell.get("stopped_by_schedule") else " (stopped before the schedule's end)"
            hours, passes = cell.get("train_hours"), cell.get("passes")
            add(name, cell["test_ppl"], cell["valid_ppl"], passes, hours, None, cell["command"])
            if cell.get("mixture_test_ppl"):
                add(
                    name + " + KN5 (w auto)",
                    cell["mixture_test_ppl"],
                    None,
                    passes,
                    hours,
                    None,
                    cell["mixture_command"],
                )
        add(
            "KN5",
            k,
            kn[vocab]["valid_ppl"],
            None,
            kn[vocab]["process_wall_s"] / 3600,
            None,
            "hlbl ngram train --order 5",
        )
        for key, label in SPEED_KINDS:
            add(label + " (not trained here)", None, None, None, None, key, "bench/frontier.py speed")
    result = {"rows": rows}
    write_json(out / "frontier.json", result)
    (out / "frontier.md").write_text(frontier_table(rows))
    return result


def grid_cells(out: Path, vocab: str) -> list[dict]:
    """The cells of ``scale_grid.json`` (``bench/scale.py grid``) trained on vocabulary ``vocab``
    (``50k``: their command has ``--max-vocab 50000``), in file order; none without the file."""
    path = out / "scale_grid.json"
    if not path.exists():
        return []
    cells = json.loads(path.read_text())["cells"].values()
    return [c for c in cells if cell_vocab(c) == vocab and c.get("test_ppl")]


def cell_vocab(cell: dict) -> str:
    """The vocabulary (a key of ``VOCABS``, or ``other``) a grid cell was trained on, read from its
    command."""
    command = cell["command"]
    return "50k" if "--max-vocab 50000" in command else "other" if "--max-vocab" in command else "default"


def frontier_table(rows: list[dict]) -> str:
    f = lambda x, fmt: "-" if x is None else format(x, fmt)  # noqa: E731
    lines = [
        "# Gutenberg: quality against training time",
        "",
        "Written by `python bench/gutenberg.py frontier` from `hlbl-VOCAB.json`, `kn.json` and "
        "`frontier_speed_VOCAB.json`. *Passes*: training positions over the 50.9M of the train split. "
        "*Train hours (own run)*: the run's summed epoch times on one thread of the shared 2-core machine "
        "(for the x2 tree without the RANDOM run and the tree build it needs: about 0.25 and 0.07 hours; "
        "for KN5, the whole `hlbl ngram train` process). *Words/s*, *speed vs flat* and *hours a pass*: "
        "training words/s measured side by side in one process per vocabulary (median of rounds, one thread, "
        "momentum SGD, batch 1000, d = 100, context 5; the trees on the fast engine, the others on autograd), each "
        "round on the first 50,000 positions of the split (the flat LBL on 4,000): hours a pass are estimates, "
        "the trained runs' own hours are beside them. "
        "The flat and sampled layers were only timed: at these vocabularies a pass of the flat LBL takes days here. "
        "NCE and the sampled softmax run on the autograd engine, whose momentum SGD reads and writes every row of "
        "the V x d word and output tables each step (dense gradients): at these vocabularies that, not the k = 25 "
        "samples, sets their speed; the fast engine's lazy exact updates are for tree outputs only.",
        "",
        "| vocabulary | model | test ppl | vs KN5 | passes | train hours (own run) | words/s | speed vs flat | hours a pass | command |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        vs = "-" if r["vs_kn5"] is None else f"{100 * r['vs_kn5']:+.1f}%"
        sp = "-" if r["speed_vs_flat"] is None else f"{r['speed_vs_flat']:.1f}x"
        lines.append(
            f"| {r['vocab_size']:,} | {r['model']} | {f(r['test_ppl'], '.2f')} | {vs} | {f(r['passes'], '.2f')} "
            f"| {f(r['train_hours_own_run'], '.2f')} | {f(r['words_per_s'], ',.0f')} | {sp} "
            f"| {f(r['hours_per_pass'], ',.2f')} | `{r['command']}` |"
        )
    return "\n".join(lines) + "\n"


# -------------------------------------------------------------------------------------- summary


def stage_summary(args) -> dict:
    out = Path(args.out)
    load = lambda n: json.loads((out / f"{n}.json").read_text())  # noqa: E731
    vocab, speed, memory, kn = load("vocab"), load("speed"), load("memory"), load("kn")
    hl = {n: load(f"hlbl-{n}") for n in VOCABS if (out / f"hlbl-{n}.json").exists()}
    d = hl.get("default")
    best_tree = kn_test = mix = None
    if d is not None:  # the default vocabulary's runs, and the grid's cells on it (bench/scale.py)
        trained = [r for r, _, _ in HLBL_RUNS if r in d["evals"]]
        cells = grid_cells(out, "default")
        best_tree = min([d["evals"][r]["perplexity"] for r in trained] + [c["test_ppl"] for c in cells])
        kn_test = kn["rows"]["default"]["test_ppl"]
        mixes = [d["evals"][f"mix_{r}"]["perplexity"] for r in trained]
        mix = min(mixes + [c["mixture_test_ppl"] for c in cells if c.get("mixture_test_ppl")])
    summary = {
        "ptb_wps": speed["corpora"]["ptb"]["wps_median"],
        "gutenberg_wps": speed["corpora"]["gutenberg"]["wps_median"],
        "wps_ratio": speed["ratio_wall"],
        "words_per_cpu_s_ratio": speed["ratio_cpu"],
        "vocab_size": vocab["rows"]["default"]["vocab_size"],
        "vocab_encode_s": vocab["rows"]["default"]["seconds"],
        "tree_build_s": d["steps"]["tree_build"]["wall_s"] if d else None,
        "tree_build_cpu_s": d["steps"]["tree_build"].get("cpu_s") if d else None,
        "kn_order": 5,
        "kn_prune": kn["prune"],
        "kn_build_s": kn["rows"]["open"]["build_s"],
        "kn_build_cpu_s": kn["rows"]["open"].get("build_cpu_s"),
        "kn_peak_rss_mb": kn["rows"]["open"]["process_peak_rss_mb"],
        "kn_open_vocab_test_ppl": kn["rows"]["open"]["test_ppl"],
        "kn_open_vocab_valid_ppl": kn["rows"]["open"]["valid_ppl"],
        "kn_closed50k_test_ppl": kn["rows"].get("50k", {}).get("test_ppl"),
        "kn_test_ppl": kn_test,
        "best_tree_test_ppl": best_tree,
        "mixture_test_ppl": mix,
        "test_tokens": kn["rows"]["open"]["test_tokens"],
        "peak_rss_mb_50m": memory["rows"]["50m"]["vm_hwm_mb"],
        "peak_rss_mb_100m": memory["rows"]["100m"]["vm_hwm_mb"],
        "peak_anon_mb_50m": memory["rows"]["50m"]["peak_anon_mb"],
        "peak_anon_mb_100m": memory["rows"]["100m"]["peak_anon_mb"],
        "hlbl_epochs": d["epochs_cap"] if d else None,
        "machine": f"{os.cpu_count()}-core {platform.machine()}, shared",
    }
    targets = {
        "wps_ratio_ge_0.7": summary["wps_ratio"] >= 0.7,
        "vocab_encode_lt_120s": summary["vocab_encode_s"] < 120,
        "tree_build_lt_300s": summary["tree_build_s"] is not None and summary["tree_build_s"] < 300,
        "kn_time_within_5x_lmplz": summary["kn_build_s"] <= 5 * KENLM["build_s"],
        "kn_memory_within_3x_lmplz": summary["kn_peak_rss_mb"] <= 3 * KENLM["peak_rss_mb"],
        "kn_open_ppl_within_0.05": abs(summary["kn_open_vocab_test_ppl"] - KENLM["open_test_ppl"]) <= 0.05,
        "kn_closed50k_ppl_within_0.05": None  # None: not measured yet
        if summary["kn_closed50k_test_ppl"] is None
        else abs(summary["kn_closed50k_test_ppl"] - KENLM["closed50k_test_ppl"]) <= 0.05,
        "best_tree_below_kn5": best_tree is not None and best_tree < kn_test,
        "mixture_15pct_below_kn5": mix is not None and mix <= 0.85 * kn_test,
        "peak_rss_100m_within_10pct": summary["peak_rss_mb_100m"] <= 1.1 * summary["peak_rss_mb_50m"],
        "peak_anon_100m_within_10pct": summary["peak_anon_mb_100m"] <= 1.1 * summary["peak_anon_mb_50m"],
    }
    summary["targets_met"] = targets
    summary.update(scale_keys(out, hl, kn))
    write_json(out / "summary.json", summary)
    (out / "table.md").write_text(table(summary, kn, hl, vocab) + scale_table(out) + "\n")
    return summary


def scale_keys(out: Path, hl: dict, kn: dict) -> dict:
    """The figures of ``bench/scale.py``'s files (where written): the best tree with its command,
    the 50k-word bests against KN5, the paper's regime, and words/s at d = 300 over d = 100."""
    load = lambda n: json.loads((out / f"{n}.json").read_text()) if (out / f"{n}.json").exists() else None  # noqa: E731
    dims, grid, paper = load("scale_dims"), load("scale_grid"), load("paper_regime")
    rows = [  # (vocabulary, name, test perplexity, command) of every trained tree model
        (v, r, h["evals"][r]["perplexity"], h["steps"][f"train_{r.replace('-', '_')}"]["command"])
        for v, h in hl.items()
        for r, _, _ in HLBL_RUNS
        if r in h["evals"] and f"train_{r.replace('-', '_')}" in h["steps"]
    ]
    rows += [(cell_vocab(c), f"d{c['dim']} context {c['context']} {c.get('tree', 'adaptive0.4x2')}", c["test_ppl"], c["command"]) for c in (grid or {}).get("cells", {}).values()]  # fmt: skip
    mixes = [
        hl["50k"]["evals"][f"mix_{r}"]["perplexity"]
        for r, _, _ in HLBL_RUNS
        if f"mix_{r}" in hl.get("50k", {}).get("evals", {})
    ]
    mixes += [c["mixture_test_ppl"] for c in grid_cells(out, "50k") if c.get("mixture_test_ppl")]
    best = min(rows, key=lambda x: x[2]) if rows else None
    fifty = [x[2] for x in rows if x[0] == "50k"]
    regime = None
    if paper is not None:
        trees = {
            r["tree"]: r["test_perplexity"]
            for r in paper["rows"].values()
            if r["model"] == "HLBL" and r["test_perplexity"]
        }
        regime = {
            "train_tokens": paper["train_tokens"],
            "vocab_size": paper["vocab_size"],
            "kn5_test_ppl": paper["rows"].get("KN5", {}).get("test_perplexity"),
            "x4_test_ppl": paper["rows"].get("T7", {}).get("test_perplexity"),
            "mixture_test_ppl": paper["mixture_test_ppl"],
            "trees": trees,
            "command": paper["command"],
        }
    return {
        "best_tree": {"vocab": best[0], "name": best[1], "test_ppl": best[2], "command": best[3]} if best else None,
        "kn_50k_test_ppl": kn["rows"].get("50k", {}).get("test_ppl"),
        "best_50k_test_ppl": min(fifty) if fifty else None,
        "mixture_50k_test_ppl": min(mixes) if mixes else None,
        "paper_regime": regime,
        "wps_d300_over_d100": dims["wps_d300_over_d100"] if dims else None,
    }


def scale_table(out: Path) -> str:
    """Markdown for ``bench/scale.py``'s files: the d x context cells, words/s against d and
    context, and the paper's regime (empty where none is written)."""
    load = lambda n: json.loads((out / f"{n}.json").read_text()) if (out / f"{n}.json").exists() else None  # noqa: E731
    dims, grid, paper = load("scale_dims"), load("scale_grid"), load("paper_regime")
    lines = []
    if grid:
        lines += ["", "## Feature size and context (`bench/scale.py grid`)", "",
                  "| words | d | context | tree | test ppl | valid ppl | + KN5 | epochs (passes) | stopped by | hours | words/s | peak RSS | command |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for c in grid["cells"].values():
            mix = f"{c['mixture_test_ppl']:.2f}" if c.get("mixture_test_ppl") else "-"
            how = "the schedule" if c["stopped_by_schedule"] else "time (not converged)"
            rss = f"{c['peak_rss_mb']} MB" if c["peak_rss_mb"] else "-"
            lines.append(
                f"| {c['vocab_size']:,} | {c['dim']} | {c['context']} | {c.get('tree', 'adaptive0.4x2')} | {c['test_ppl']:.2f} | {c['valid_ppl']:.2f} | {mix} | {c['epochs']} "
                f"({c['passes']}) | {how} | {c['train_hours']} | {c['words_per_sec']:,} | {rss} | `{c['command']}` |"
            )
    if dims:
        lines += ["", f"Training words/s on the same tree, {dims['positions']:,} positions a run, the cells "
                  f"alternating (`{dims['command']}`); d = 300 over d = 100 (5 words): **{dims['wps_d300_over_d100']}**.", "",
                  "| round | " + " | ".join(dims["rounds"][0]) + " |", "|---|" + "---|" * len(dims["rounds"][0])]  # fmt: skip
        for i, r in enumerate(dims["rounds"], 1):
            cells = " | ".join(
                f"{v['words_per_sec']:,} ({v['words_per_sec_times_d'] / 1e6:.2f}M x d)" for v in r.values()
            )
            lines.append(f"| {i} | {cells} |")
    if paper:
        lines += ["", f"## The paper's regime: {paper['train_tokens']:,} training tokens, {paper['vocab_size']:,} words",
                  "", f"`{paper['command']}`; the mixture: `{paper['mixture_command']}`.", "",
                  "| row | model | tree | test ppl | valid ppl | epochs | words/s |", "|---|---|---|---|---|---|---|"]  # fmt: skip
        for name, r in paper["rows"].items():
            if r["test_perplexity"] is not None:
                wps = f"{r['words_per_sec']:,.0f}" if r["words_per_sec"] else "-"
                lines.append(f"| {name} | {r['model']} | {r['tree']} | {r['test_perplexity']:.2f} | "
                             f"{r['valid_perplexity']:.2f} | {r['epochs'] or '-'} | {wps} |")  # fmt: skip
        if paper["mixture_test_ppl"]:
            lines.append(
                f"| T7 + KN5 | mixture (w = {paper['mixture_weight']:.3f}) | | {paper['mixture_test_ppl']:.2f} | | | |"
            )
    return "\n".join(lines)


def table(s: dict, kn: dict, hl: dict, vocab: dict) -> str:
    lines = [
        "# Gutenberg: test perplexity (2,041,324 test tokens: every word and one `<eos>` a line)",
        "",
        "Written by `python bench/gutenberg.py summary` from the stages' files in this directory; one run per row, "
        "seed 0, d = 100, 5 context words, the default recipe, one thread, on a shared 2-core machine. "
        "The RANDOM, x2 and x2-low rows were trained when an epoch was a whole pass (50.9M positions; now "
        "`--epoch-tokens 0`) and with the earlier order of long epochs (one bijection over the whole split, no "
        "groups of blocks; docs/scale.md), so a rerun of their commands takes other minibatches and epochs of "
        "10M positions; their first epoch never reached the schedule's final rate. The rows in epochs of 10M "
        "positions (six a pass; the default `--epoch-tokens`) were trained as their commands say, from the start "
        "on the same x2 tree file.",
        "",
        "| vocabulary | model | test ppl | valid ppl | epochs | words/s | command |",
        "|---|---|---|---|---|---|---|",
    ]
    knr = kn["rows"]
    for name, v in (("open", None), *((n, hl[n]) for n in hl)):
        if name not in knr:
            continue
        size = f"{knr[name]['vocab_size']:,}"
        if v is None:
            lines.append(
                f"| all {size} train types (KenLM's protocol) | KN5 | {knr['open']['test_ppl']:.2f} | {knr['open']['valid_ppl']:.2f} "
                f"| - | - | `python bench/gutenberg.py kn` (our estimator; lmplz: {KENLM['open_test_ppl']} / {KENLM['open_valid_ppl']}) |"
            )
            continue
        label = f"{size} ({'default: seen twice' if name == 'default' else '--max-vocab 50000'})"
        m = v["metrics"]
        for run, model, key in HLBL_RUNS:
            if run not in v["evals"]:
                continue
            e = v["evals"][run]
            valid = min(x["valid_ppl"] for x in m[run])
            cmd = v["steps"][key]["command"]
            epochs = f"{len(m[run])} (cap {v['epochs_cap']}, not converged)"
            if run == "x2-low":
                epochs = f"{len(m['x2'])} + {len(m[run])} at the final rate (not converged)"
            if run in ("x2-long", "x2-two-rate"):
                last = m[run][-1]
                epochs = (
                    f"{len(m[run])} of {last['parts']} a pass ({len(m[run]) / last['parts']:.1f} passes"
                    f"{', stopped early' if v.get('stopped_early', {}).get(run) else ', cap reached'}; lr {m[run][0]['lr']:g} to {last['lr']:g})"
                )
            lines.append(
                f"| {label} | {model} | {e['perplexity']:.2f} | {valid:.2f} | {epochs} "
                f"| {statistics.mean(x['words_per_sec'] for x in m[run]):,.0f} | `{cmd}` |"
            )
        ref = f" (lmplz: {KENLM['closed50k_test_ppl']} / {KENLM['closed50k_valid_ppl']})" if name == "50k" else ""
        lines.append(
            f"| {label} | KN5 | {knr[name]['test_ppl']:.2f} | {knr[name]['valid_ppl']:.2f} | - | - | `{v['steps'].get('kn5', {}).get('command', 'hlbl ngram train --data gutenberg --order 5 --out kn5.safetensors')}`{ref} |"
        )
        for run, model, _ in HLBL_RUNS:
            if f"mix_{run}" not in v["evals"]:
                continue
            model = model.removeprefix("HLBL, ")
            mix = v["evals"][f"mix_{run}"]
            lines.append(
                f"| {label} | HLBL {model} + KN5, mixed per token (w = {mix.get('weight', float('nan')):.3f}) | {mix['perplexity']:.2f} | - | - | - | `{v['steps'][f'mix_{run}']['command']}` |"
            )
    o = knr["open"]
    t = s["targets_met"]
    yes = lambda k: "not measured" if t[k] is None else "met" if t[k] else "**missed**"  # noqa: E731
    lines += [
        "",
        "## Costs (every figure is in [`summary.json`](summary.json))",
        "",
        "| step | measured | target | |",
        "|---|---|---|---|",
        f"| vocabulary + encoding of the train split (default rule) | {s['vocab_encode_s']:.0f} s | < 120 s | {yes('vocab_encode_lt_120s')} |",
        f"| learned ADAPTIVE(0.4) x2 tree over all {s['vocab_size']:,} words (`hlbl tree build`, features included) | "
        + (f"{s['tree_build_s']:.0f} s wall" if s["tree_build_s"] is not None else "-")
        + (f", {s['tree_build_cpu_s']:.0f} s CPU" if s.get("tree_build_cpu_s") is not None else "")
        + f" | < 300 s | {yes('tree_build_lt_300s')} |",
        f"| training words/s, Gutenberg ({s['vocab_size']:,} words) / PTB (10,000), same run | {s['gutenberg_wps']:,.0f} / {s['ptb_wps']:,.0f} = "
        f"{s['wps_ratio']:.2f} (per CPU-second: {s['words_per_cpu_s_ratio']:.2f}) | >= 0.7 | {yes('wps_ratio_ge_0.7')} |",
        f"| KN5 of the train split, unpruned, open vocabulary: estimation time | {o['build_s']:.0f} s wall, "
        f"{o.get('build_cpu_s', float('nan')):.0f} s CPU (lmplz {KENLM['build_s']:.0f} s, x{o['build_s'] / KENLM['build_s']:.1f}) "
        f"| <= 5x | {yes('kn_time_within_5x_lmplz')} |",
        f"| the same: peak RSS of the process | {o['process_peak_rss_mb'] / 1024:.2f} GiB (lmplz {KENLM['peak_rss_mb'] / 1024:.1f} GB, "
        f"x{o['process_peak_rss_mb'] / KENLM['peak_rss_mb']:.1f}) | <= 3x | {yes('kn_memory_within_3x_lmplz')} |",
        f"| the same: test / valid perplexity, KenLM's protocol | {o['test_ppl']:.3f} / {o['valid_ppl']:.3f} "
        f"(lmplz {KENLM['open_test_ppl']} / {KENLM['open_valid_ppl']}) | within 0.05 | {yes('kn_open_ppl_within_0.05')} |",
        "| KN5 with the closed 50k vocabulary: test perplexity | "
        + (
            f"{s['kn_closed50k_test_ppl']:.3f} (lmplz {KENLM['closed50k_test_ppl']})"
            if s["kn_closed50k_test_ppl"] is not None
            else "-"
        )
        + f" | within 0.05 | {yes('kn_closed50k_ppl_within_0.05')} |",
        f"| peak RSS of training, 50M / 100M tokens (VmHWM) | {s['peak_rss_mb_50m']:,.0f} / {s['peak_rss_mb_100m']:,.0f} MB | within 10% | {yes('peak_rss_100m_within_10pct')} |",
        f"| the same, anonymous memory only (model, optimiser, buffers) | {s['peak_anon_mb_50m']:,.0f} / {s['peak_anon_mb_100m']:,.0f} MB | within 10% | {yes('peak_anon_100m_within_10pct')} |",
        "| best HLBL tree vs KN5, same vocabulary (test ppl) | "
        + (f"{s['best_tree_test_ppl']:.2f} vs {s['kn_test_ppl']:.2f}" if s["best_tree_test_ppl"] else "-")
        + f" | below | {yes('best_tree_below_kn5')} |",
        "| HLBL + KN5 mixture vs KN5 (test ppl) | "
        + (
            f"{s['mixture_test_ppl']:.2f} vs {s['kn_test_ppl']:.2f} ({100 * (1 - s['mixture_test_ppl'] / s['kn_test_ppl']):.1f}% below)"
            if s["mixture_test_ppl"]
            else "-"
        )
        + f" | >= 15% below | {yes('mixture_15pct_below_kn5')} |",
        "",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "stage",
        nargs="?",
        choices=[
            "vocab",
            "speed",
            "phases",
            "memory",
            "mapped",
            "kn",
            "hlbl",
            "frontier",
            "summary",
            "_memory_child",
            "_kn_child",
        ],  # fmt: skip
    )
    ap.add_argument(
        "vocab", nargs="?", default="default", help="hlbl stage: default or 50k; _kn_child: open, default, 50k"
    )
    add_common(ap, data="gutenberg")
    ap.add_argument("--ptb", default="ptb", help="the reference corpus of speed and phases (default ptb)")
    ap.add_argument("--work", default="runs/gutenberg", help="run directories and models (commands record it as given)")
    ap.add_argument("--out", default="results/gutenberg")
    ap.add_argument("--epochs", type=int, default=1, help="hlbl: epoch cap of each training")
    ap.add_argument(
        "--low-lr",
        type=float,
        default=0.0,
        help="hlbl: then train the x2 model at this rate from every weight of it (0: not)",
    )
    ap.add_argument("--low-epochs", type=int, default=0, help="hlbl: epochs at --low-lr (default: --epochs)")
    ap.add_argument(
        "--long-epochs",
        type=int,
        default=0,
        help="hlbl: also train the x2 tree from the start with the halving schedule, this many epochs of "
        "10M positions at most (0: not)",
    )
    ap.add_argument("--two-rate-epochs", type=int, default=0, help="hlbl: the same with the two-rate schedule (0: not)")
    ap.add_argument("--speed-batches", type=int, default=1000)
    ap.add_argument("--speed-rounds", type=int, default=3)
    ap.add_argument("--remeasure", action="store_true", help="frontier: measure the speeds again")
    ap.add_argument("--memory-batches", type=int, default=5000)
    ap.add_argument("--phase-batches", type=int, default=200)
    ap.add_argument("--phase-rounds", type=int, default=10)
    ap.add_argument("--blocks", default="32,16,64", help="phases: block sizes (the first is the reference)")
    ap.add_argument("--corpus")
    ap.add_argument("--vocab-from")
    ap.add_argument("--batches", type=int, default=5000)
    ap.add_argument("--order", type=int, default=5)
    ap.add_argument("--load")
    args = ap.parse_args(argv)
    if args.quick and args.stage not in ("_memory_child", "_kn_child"):
        finish_args(
            args, speed_batches=2, speed_rounds=1, memory_batches=2, phase_batches=2, phase_rounds=1, blocks="32,16",
            epochs=1, long_epochs=0, two_rate_epochs=0, low_lr=0.0, work=str(quick_dir() / "work"),
            out=str(quick_dir() / "gutenberg"), ptb=str(tiny_corpus(quick_dir() / "corpus-ptb", 800, 60, seed=1)),
        )  # fmt: skip
        if args.stage is None:
            for stage in ("vocab", "speed", "phases", "memory", "mapped", "hlbl", "kn", "frontier", "summary"):
                print(f"--- {stage}", file=sys.stderr, flush=True)
                run_stage(args, stage)
            return 0
    elif args.stage is None:
        ap.error("a stage, or --quick")
    if args.stage == "_memory_child":
        memory_child(args)
        return 0
    if args.stage == "_kn_child":
        kn_child(args)
        return 0
    run_stage(args, args.stage)
    return 0


def run_stage(args, stage: str) -> None:
    """Run one stage; write its file (OUT/STAGE.json; the summary and frontier stages write their own)."""
    fn = {
        "vocab": stage_vocab,
        "speed": stage_speed,
        "phases": stage_phases,
        "memory": stage_memory,
        "mapped": stage_mapped,
        "kn": stage_kn,
        "hlbl": stage_hlbl,
        "frontier": stage_frontier,
        "summary": stage_summary,
    }[stage]
    t = time.perf_counter()
    result = fn(args)
    if stage not in ("summary", "frontier"):
        result["stage_wall_s"] = time.perf_counter() - t
        write_json(Path(args.out) / (f"hlbl-{args.vocab}.json" if stage == "hlbl" else f"{stage}.json"), result)
    print(json.dumps(result if stage == "summary" else {"stage": stage, "written": True}))


if __name__ == "__main__":
    sys.exit(main())
