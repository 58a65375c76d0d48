"""One command for the paper's Tables 1 and 3 on a corpus: ``hlbl reproduce --data ptb --out DIR``.

Steps (each writes its outputs atomically plus a JSON result; a rerun skips finished steps and
resumes an interrupted training from its last epoch checkpoint)::

    T1   HLBL on a RANDOM tree                      work/runs/T1,  work/results/T1.json
    feat mean r_hat of every word under T1          work/features.npz
    T2..T7 trees from the features                  work/trees/T{k}.json (+ .build.json)
         BALANCED, ADAPTIVE, ADAPTIVE(0.25), ADAPTIVE(0.4), ADAPTIVE(0.4) x2, ADAPTIVE(0.4) x4
    KN5  interpolated modified Kneser-Ney (hlbl.ngram)
    T2..T7 HLBL trained on each tree                work/runs/T{k}, work/results/T{k}.json
    flat the non-hierarchical LBL, same recipe, epochs capped by --flat-epochs

After every step ``table1.md``, ``table3.md``, ``results.json`` and ``perplexity_vs_time.png``
in ``--out`` are rewritten from the results so far; rows not finished are listed as missing.
Every HLBL run uses the same recipe (:class:`hlbl.train.TrainConfig` defaults, ``--epochs``
cap, the seed); trees T2..T7 all come from the same features; tree seeds derive from ``--seed``.

``--quick`` is a smoke test: a few thousand training tokens, 16-d vectors, 2 epochs (1 flat).
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import subprocess
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from . import atomic
from . import checkpoint as ckpt
from . import run as hrun
from .data import Corpus, DataError, corpus_record, load_corpus, resolve_corpus
from .evaluate import evaluate
from .model import LBL, LBLConfig
from .config import TREES, ReproConfig, TrainConfig
from .engine import choose_engine, train_epoch
from .run import fit
from .tree import WordTree, build_tree
from .treebuild import BuildReport, build_tree_from_features, tree_label, word_features

logger = logging.getLogger(__name__)

# The paper's numbers (APNews, 18k words), for the side-by-side columns.
PAPER_TABLE1 = {
    "T1": (14.2, 1.0, 17963),
    "T2": (14.3, 1.0, 17963),
    "T3": (16.1, 1.0, 17963),
    "T4": (24.2, 1.3, 22995),
    "T5": (29.0, 1.7, 30296),
    "T6": (69.1, 3.4, 61014),
    "T7": (143.2, 6.8, 121980),
}
PAPER_TABLE3 = {
    "T1": 151.2,
    "T2": 131.3,
    "T3": 127.0,
    "T4": 124.4,
    "T5": 123.3,
    "T6": 115.7,
    "T7": 112.1,
    "flat": 117.0,
    "KN5": 123.2,
}


def git_commit() -> str:
    """Short hash of HEAD of the source checkout, '+dirty' if src/ has uncommitted changes."""
    here = Path(__file__).resolve().parent
    try:
        h = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "."], cwd=here, timeout=10).returncode
        return (h or "unknown") + ("+dirty" if h and dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _engine_name(model: LBL, cfg: TrainConfig) -> str:
    """Which training step implementation ``fit`` used for this model ("fast" or "torch")."""
    return "torch" if choose_engine(model, cfg) is train_epoch else "fast"


class Reproduction:
    """The pipeline's state: paths, corpus, and the results gathered so far."""

    def __init__(self, cfg: ReproConfig, log: Callable[[str], None] | None = None):
        self.cfg = cfg
        # Not under OUT: the work directory holds ~300 MB of checkpoints, OUT the tables to keep. A
        # smoke test keeps away from both a real run's work and the committed tables.
        name = Path(str(cfg.data)).resolve().name + ("-quick" if cfg.quick else "")  # (".": the directory's name)
        self.work = Path(cfg.work) if cfg.work else Path("runs") / f"reproduce-{name}"
        self.out = Path(cfg.out) if cfg.out else (self.work / "tables" if cfg.quick else Path("results") / name)
        self.log = log or logger.info
        self.corpus: Corpus = load_corpus(cfg.data, max_vocab=cfg.max_vocab)  # first: bad --data creates nothing
        if "KN5" not in cfg.skip:  # before hours of training, not after
            from .ngram.kneser_ney import check_vocab

            check_vocab(self.corpus.vocab)
        self._claim_work_dir()
        for d in (self.out, self.work / "runs", self.work / "results", self.work / "trees"):
            d.mkdir(parents=True, exist_ok=True)
        self.V = len(self.corpus.vocab)
        self.counts = self.corpus.vocab.counts_array()
        self.train_stream = (
            self.corpus["train"][: cfg.max_train_tokens] if cfg.max_train_tokens else self.corpus["train"]
        )

    def _claim_work_dir(self) -> None:
        """Finished steps in the work directory are reused by name, so it must hold this
        reproduction's: same corpus and vocabulary, sizes, seed and token limits (the epoch caps
        may differ: a larger cap continues a run). ``work/config.json`` records them."""
        c = self.cfg
        words = "\n".join(self.corpus.vocab.words).encode()
        identity = {
            "data": str(resolve_corpus(c.data).resolve()),
            "vocab_sha256": hashlib.sha256(words).hexdigest(),
            "dim": c.dim,
            "context": c.context,
            "seed": c.seed,
            "max_train_tokens": c.max_train_tokens,
            "max_eval_tokens": c.max_eval_tokens,
            "em_iters": c.em_iters,
            "kn_order": c.kn_order,
        }
        path = self.work / "config.json"
        if path.is_file():
            try:
                old = json.loads(path.read_text())
            except json.JSONDecodeError:
                old = {}
            differ = [k for k in identity if old.get(k) != identity[k]]
            if differ:
                raise DataError(
                    f"{self.work} holds a reproduction with another {', '.join(differ)}; "
                    "choose another work directory, or delete it to start over"
                )
            return
        if self.work.is_dir() and any(self.work.iterdir()):  # config.json is the first file a reproduction writes
            raise DataError(
                f"{self.work} is not empty and holds no reproduction (no config.json); choose another work directory"
            )
        self.work.mkdir(parents=True, exist_ok=True)
        atomic.write_text(path, json.dumps(identity, indent=1))

    def eval_stream(self, split: str) -> np.ndarray:
        s = self.corpus[split]
        return s[: self.cfg.max_eval_tokens] if self.cfg.max_eval_tokens else s

    # ---- paths ------------------------------------------------------------------------------

    def result_path(self, name: str) -> Path:
        return self.work / "results" / f"{name}.json"

    def tree_path(self, name: str) -> Path:
        return self.work / "trees" / f"{name}.json"

    def result(self, name: str) -> dict | None:
        p = self.result_path(name)
        return json.loads(p.read_text()) if p.is_file() else None

    # ---- steps ------------------------------------------------------------------------------

    def train_config(self, epochs: int) -> TrainConfig:
        return TrainConfig(
            max_epochs=epochs, seed=self.cfg.seed, max_train_tokens=self.cfg.max_train_tokens, progress=False
        )

    def train(self, name: str, tree: WordTree | None, label: str, epochs: int) -> dict:
        """Train (or resume, or skip) one model; evaluate its best weights on valid and test."""
        done = self.result(name)
        if done is not None and (done["stopped_early"] or done["epoch_cap"] >= epochs):
            return done
        # (A run that hit a smaller cap is continued from its last checkpoint: resuming is
        # exact, so this equals having trained with the larger cap from the start.)
        run = self.work / "runs" / name
        if hrun.Run(run).has_record():
            self.log(f"[{name}] resuming {run}")
            hrun.Run.resume(run, self.corpus, log=self.log, max_epochs=epochs, progress=False)
            model = hrun.Run.open(run).model("best")  # (what fit leaves in a model it trains)
        else:
            if run.exists():  # a start that died before its first files: begin again
                shutil.rmtree(run)
            output = "flat" if tree is None else "tree"
            mcfg = LBLConfig(self.V, dim=self.cfg.dim, context=self.cfg.context, output=output)
            model = LBL(mcfg, tree, torch.Generator().manual_seed(self.cfg.seed))
            model.init_unigram(self.counts)
            self.log(f"[{name}] training {label} ({output} output, {model.num_parameters():,} parameters)")
            fit(
                model,
                self.corpus,
                self.train_config(epochs),
                run,
                corpus_spec=corpus_record(self.cfg.data),
                log=self.log,
            )
        finished = hrun.Run.open(run)
        state = finished.state().to_json()
        metrics = finished.metrics()  # (checked: a damaged log is one line, not a traceback)
        pad = self.corpus.vocab.eos
        ev = {s: evaluate(model, self.eval_stream(s), pad) for s in ("valid", "test")}
        res = {
            "name": name,
            "model": "LBL" if tree is None else "HLBL",
            "tree": label,
            "test_perplexity": ev["test"]["perplexity"],
            "valid_perplexity": ev["valid"]["perplexity"],
            "epochs": state["epoch"],
            "stopped_early": bool(state["done"]),
            "epoch_cap": epochs,
            "minutes_per_epoch": float(np.mean([m["epoch_minutes"] for m in metrics])),
            # From the same wall time, so that the two columns agree (a mean of the engines' own
            # rates would leave out what an epoch also spends, e.g. loading numba's kernels).
            "words_per_sec": len(self.train_stream) * len(metrics) / (60 * sum(m["epoch_minutes"] for m in metrics)),
            "train_minutes": state["elapsed"] / 60,
            "engine": _engine_name(model, self.train_config(epochs)),
            "parameters": model.num_parameters(),
        }
        if tree is not None:
            res["tree_stats"] = tree.stats(self.counts)
        ckpt.write_json(self.result_path(name), res)
        self.log(f"[{name}] test perplexity {res['test_perplexity']:.2f}, valid {res['valid_perplexity']:.2f}")
        return res

    def features(self) -> np.ndarray:
        """The word features of T1's best weights. If T1 has changed since they were computed (a
        larger --epochs continued it), the learned trees and their runs are stale too: all go."""
        path = self.work / "features.npz"
        best = self.work / "runs" / "T1" / "best.safetensors"
        digest = hashlib.sha256(best.read_bytes()).hexdigest()
        if path.is_file():
            with np.load(path, allow_pickle=False) as z:
                if "t1_sha256" in z.files and str(z["t1_sha256"]) == digest:
                    return z["X"]
            self.log(
                "[features] T1 has trained on since its features were computed: rebuilding them, the "
                "learned trees and their runs"
            )
            for name, _, _ in TREES[1:]:
                for p in (
                    self.tree_path(name),
                    self.tree_path(name).with_suffix(".build.json"),
                    self.result_path(name),
                ):
                    p.unlink(missing_ok=True)
                shutil.rmtree(self.work / "runs" / name, ignore_errors=True)
        model = hrun.Run.open(self.work / "runs" / "T1").model("best")
        t0 = time.perf_counter()
        X, n = word_features(model, self.train_stream, self.corpus.vocab.eos)
        with atomic.atomic_path(path) as tmp, open(tmp, "wb") as f:
            np.savez(f, X=X, n=n, t1_sha256=np.array(digest))
        self.log(f"[features] {X.shape} in {time.perf_counter() - t0:.1f}s; {int((n == 0).sum())} words never a target")
        return X

    def tree(self, name: str, policy: str, copies: int, X: np.ndarray | None) -> WordTree:
        path = self.tree_path(name)
        if path.is_file():
            return WordTree.load(path)
        t0 = time.perf_counter()
        rep = BuildReport()
        if policy == "random":
            tree = build_tree("random", self.V, self.counts, self.cfg.seed)  # what `hlbl train` builds
        else:
            # Different trees get different seeds (T6's copies are not T5 again).
            seed = self.cfg.seed * 100 + int(name[1:])
            tree = build_tree_from_features(X, policy, seed, copies, self.cfg.em_iters, report=rep)
        info = {
            "name": name,
            "rule": tree_label(policy, copies) if policy != "random" else "RANDOM",
            "seconds": time.perf_counter() - t0,
            "report": rep.to_json(),
            "stats": tree.stats(self.counts),
        }
        ckpt.write_json(path.with_suffix(".build.json"), info)
        tree.save(path)  # last: its presence marks the step done
        self.log(
            f"[{name}] {info['rule']}: {info['stats']['internal_nodes']:,} nodes, "
            f"{info['stats']['codes_per_word']:.2f} codes/word, built in {info['seconds']:.1f}s"
        )
        return tree

    def kn(self) -> dict | None:
        """KN5 of the training prefix, scored; the model is kept as ``kn5.safetensors`` in the work
        directory, so that a table's run can be mixed with it (``hlbl eval --interpolate``)."""
        done, path = self.result("KN5"), self.work / "kn5.safetensors"
        if done is not None and path.exists():
            return done
        from .ngram import token_log_probs, train_kneser_ney
        from .ngram.binary import write_binary
        from .ngram.protocol import make_protocol
        from .evaluate import perplexity_report

        t0 = time.perf_counter()
        lm = train_kneser_ney(self.train_stream, self.corpus.vocab, self.cfg.kn_order)
        train_s = time.perf_counter() - t0
        lm.protocol = make_protocol(self.corpus.text)  # how load_corpus read the text
        write_binary(lm, path)
        ev = {
            s: perplexity_report(token_log_probs(lm, self.eval_stream(s), self.corpus.vocab)) for s in ("valid", "test")
        }
        res = {
            "name": "KN5",
            "model": f"KN{self.cfg.kn_order}",
            "tree": "-",
            "test_perplexity": ev["test"]["perplexity"],
            "valid_perplexity": ev["valid"]["perplexity"],
            "train_minutes": train_s / 60,
            "minutes_per_epoch": None,
            "words_per_sec": None,
        }
        ckpt.write_json(self.result_path("KN5"), res)
        self.log(f"[KN5] test perplexity {res['test_perplexity']:.2f}")
        return res

    # ---- reports ----------------------------------------------------------------------------

    def header(self, what: str) -> str:
        return (
            f"# {what}\n\nProduced by `{self.cfg.command or 'hlbl reproduce'}` at commit `{git_commit()}`.\n"
            f"Corpus `{self.cfg.data}`: {self.V:,} words, {len(self.train_stream):,} training tokens"
            + (f", valid/test cut to {self.cfg.max_eval_tokens:,} tokens" if self.cfg.max_eval_tokens else "")
            + ".\n"
            + (
                f"`--quick` smoke test: {self.cfg.dim}-d vectors, at most {self.cfg.epochs} epochs "
                f"({self.cfg.flat_epochs} flat), whatever the options above say.\n"
                if self.cfg.quick
                else ""
            )
            + "\n"
        )

    def write_table1(self) -> None:
        rows = [
            "| tree | rule | mean code length | codes/word | internal nodes | max depth | build s "
            "| paper: code length | codes/word | internal nodes |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        missing = []
        for name, policy, copies in TREES:
            p = self.tree_path(name).with_suffix(".build.json")
            if not p.is_file():
                missing.append(name)
                continue
            b = json.loads(p.read_text())
            s = b["stats"]
            pl, pc, pn = PAPER_TABLE1[name]
            rows.append(
                f"| {name} | {b['rule']} | {s['mean_code_length']:.1f} | {s['codes_per_word']:.2f} "
                f"| {s['internal_nodes']:,} | {s['max_depth']} | {b['seconds']:.1f} | {pl} | {pc} | {pn:,} |"
            )
        text = (
            self.header("Table 1: tree statistics")
            + "\n".join(rows)
            + "\n\n"
            + (
                "Definitions (`WordTree.stats(counts)`, the paper's): mean code length = the sum of the lengths "
                "of all of a word's codes, averaged over the training unigram distribution; codes/word likewise. "
                "Internal nodes = leaves - 1. The paper's columns are for APNews (17,964 words).\n"
            )
        )
        if missing:
            text += f"\nMissing (skipped, or not built yet): {', '.join(missing)}.\n"
        atomic.write_text(self.out / "table1.md", text)

    def rows(self) -> list[dict]:
        out = []
        for name, policy, copies in TREES:
            r = self.result(name)
            out.append(
                r
                or {
                    "name": name,
                    "model": "HLBL",
                    "tree": "RANDOM" if policy == "random" else tree_label(policy, copies),
                }
            )
        for name, model in (("flat", "LBL"), ("KN5", f"KN{self.cfg.kn_order}")):
            out.append(self.result(name) or {"name": name, "model": model, "tree": "-"})
        return out

    def write_table3(self) -> None:
        def num(x, fmt):
            return "-" if x is None else format(x, fmt)

        lines = [
            "| model | tree | test perplexity | valid perplexity | minutes per epoch | words/s "
            "| epochs | paper: test perplexity |",
            "|---|---|---|---|---|---|---|---|",
        ]
        missing = []
        for r in self.rows():
            if "test_perplexity" not in r:
                missing.append(f"{r['model']} {r['tree']}" if r["tree"] != "-" else r["model"])
                continue
            ep = r.get("epochs")
            ep_cell = "-" if ep is None else f"{ep}" + ("" if r.get("stopped_early") else f" (cap {r['epoch_cap']})")
            lines.append(
                f"| {r['model']} | {r['tree']} | {r['test_perplexity']:.1f} | {r['valid_perplexity']:.1f} "
                f"| {num(r.get('minutes_per_epoch'), '.3g')} | {num(r.get('words_per_sec'), ',.0f')} "
                f"| {ep_cell} | {PAPER_TABLE3.get(r['name'], '-')} |"
            )
        text = (
            self.header("Table 3: test perplexity and training speed")
            + "\n".join(lines)
            + "\n\n"
            + (
                "One run per row (seed %d), %d-d features, context %d. Minutes per epoch is the mean over the run's "
                "epochs (training only, not validation) and words/s the training tokens over that time, measured on a shared machine: compare them within "
                "this table only. 'cap N' = stopped by the epoch cap, not by early stopping. The paper's column is "
                "APNews, not comparable in absolute terms.\n" % (self.cfg.seed, self.cfg.dim, self.cfg.context)
            )
        )
        if missing:
            text += f"\nMissing rows (not finished or skipped): {', '.join(missing)}.\n"
        atomic.write_text(self.out / "table3.md", text)
        ckpt.write_json(
            self.out / "results.json", {"config": asdict(self.cfg), "commit": git_commit(), "rows": self.rows()}
        )

    def write_plot(self) -> None:
        try:
            import matplotlib
        except ImportError:  # the plot extra is optional: the tables are the results
            if not getattr(self, "_said_no_plot", False):
                self.log("matplotlib is not installed (pip install 'hlbl[plot]'): perplexity_vs_time.png skipped")
                self._said_no_plot = True
            return

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker  # noqa: F401  (FuncFormatter below)

        fig, ax = plt.subplots(figsize=(7, 4.5))
        kn = []
        for r in self.rows():
            if "test_perplexity" not in r:
                continue
            if r["model"].startswith("KN"):
                kn.append(r)  # no training time on this axis: a horizontal line
                continue
            x = max(r["train_minutes"], 1e-3)
            ax.scatter([x], [r["test_perplexity"]], color="tab:red" if r["model"] == "LBL" else "tab:blue")
            ax.annotate(
                r["tree"] if r["model"] == "HLBL" else "flat LBL",
                (x, r["test_perplexity"]),
                textcoords="offset points",
                xytext=(4, 3),
                fontsize=8,
            )
        for r in kn:
            ax.axhline(
                r["test_perplexity"], color="gray", ls="--", lw=1, label=f"{r['model']} (no training time shown)"
            )
        if kn:
            ax.legend(fontsize=8)
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.margins(x=0.15)
        ax.set_xlabel("training time incl. validation passes (minutes, log scale)")
        ax.set_ylabel("test perplexity")
        ax.set_title(f"{self.cfg.data}: perplexity vs training time")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        with atomic.atomic_path(self.out / "perplexity_vs_time.png") as tmp:
            fig.savefig(tmp, dpi=120, format="png")
        plt.close(fig)

    def report(self) -> None:
        self.write_table1()
        self.write_table3()
        self.write_plot()

    # ---- the whole pipeline -----------------------------------------------------------------

    def run(self) -> dict:
        cfg = self.cfg
        if cfg.threads:
            from .fast import set_cpu_threads  # lazily: numba

            set_cpu_threads(cfg.threads)
        t1 = self.tree("T1", "random", 1, None)
        self.train("T1", t1, "RANDOM", cfg.epochs)  # always: the features come from it
        steps = [(name, pol, k) for name, pol, k in TREES[1:] if name not in cfg.skip]
        X = self.features() if steps else None
        trees = {name: self.tree(name, pol, k, X) for name, pol, k in steps}  # a skipped step builds nothing
        self.report()
        if "KN5" not in cfg.skip:
            self.kn()
            self.report()
        for name, pol, k in steps:
            self.train(name, trees[name], tree_label(pol, k), cfg.epochs)
            self.report()
        if "flat" not in cfg.skip and cfg.flat_epochs > 0:
            self.train("flat", None, "-", cfg.flat_epochs)
            self.report()
        return {"out": str(self.out), "rows": self.rows()}


def reproduce(cfg: ReproConfig, log: Callable[[str], None] | None = None) -> dict:
    """Run (or resume) the whole pipeline; returns the rows of Table 3. Progress lines go to ``log``
    (default: the ``hlbl.reproduce`` logger at INFO level)."""
    return Reproduction(cfg, log).run()
