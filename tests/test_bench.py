"""Every benchmark script in bench/ runs in its quick mode: a new or changed script cannot break unseen.

Each script (every ``bench/*.py`` and ``bench/*.sh`` but the shared ``_common`` files, found by
glob, so a new script is tested the day it lands) runs as a user would run it, with ``--quick``, in
a child process with a timeout: it must exit 0, write its output under ``$HLBL_BENCH_OUT`` (a
temporary directory) and leave ``results/`` and ``runs/`` of the repository alone. A script with
no quick mode fails at once (it is not started: at full size it would run for hours).

The scripts run three at a time, started together when the first of these tests asks (each test
then waits for its own): most of their time is interpreter and library start-up, and waiting on
their own children. The pipelines that chain dozens of commands (gutenberg.py's stages, scale.py,
frontier.sh, frontier_kjv.sh, distributed.py's torchrun launches) take minutes even in quick mode,
and are marked slow.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
SCRIPTS = sorted(p.name for p in BENCH.glob("*") if p.suffix in (".py", ".sh") and not p.name.startswith("_"))
# Quick, but each still a pipeline of dozens of commands (minutes on two cores; distributed.py's
# torchrun launches about a CPU-minute): `pytest -m slow`.
SLOW = {"gutenberg.py", "scale.py", "frontier.sh", "frontier_kjv.sh", "distributed.py"}
TIMEOUT_S = 600
SLOW_TIMEOUT_S = 3600  # frontier.sh: about 25 minutes on a loaded 2-core machine
# Children at once: most scripts spend part of their time waiting (on their own children, a server,
# a timed load), so three keep two cores busy.
WORKERS = 3
# What a quick run writes that is not its output: the synthetic corpora and the caches.
NOT_OUTPUT = {"corpus", "corpus-ptb", "cache"}


def command(name: str) -> list[str]:
    if name.endswith(".sh"):
        return ["bash", str(BENCH / name), "--quick"]
    return [sys.executable, str(BENCH / name), "--quick"]


def has_quick_mode(name: str) -> bool:
    """A quick mode the shared set-up gives (bench/_common.py's flags, bench/_common.sh's)."""
    text = (BENCH / name).read_text(encoding="utf-8")
    return "_common.sh" in text if name.endswith(".sh") else "add_common(" in text


def snapshot() -> dict[str, tuple[int, int]]:
    """Every file under the repository's results/ and runs/, with its size and modification time."""
    out = {}
    for top in ("results", "runs"):
        for p in (ROOT / top).rglob("*"):
            if p.is_file():
                st = p.stat()
                out[str(p.relative_to(ROOT))] = (st.st_size, st.st_mtime_ns)
    return out


def warm_kernels() -> None:
    """Compile (or load from numba's cache) the fast engine's kernels once, here, rather than in
    several children at once."""
    import torch

    from hlbl import fast
    from hlbl.config import TrainConfig
    from hlbl.model import LBL, LBLConfig
    from hlbl.optim import make_optimizer
    from hlbl.tree import random_tree

    model = LBL(LBLConfig(20, dim=8, context=2), random_tree(20, 0), torch.Generator().manual_seed(0))
    stream = (np.arange(200) % 20).astype(np.int32)
    cfg = TrainConfig(batch_size=50, progress=False)
    fast.FastEngine(threads=1)(model, make_optimizer(model, cfg, cfg.lr), stream, 0, cfg, 1, False)
    fast.token_log_probs(model, stream, 0)


def run(name: str, out: Path) -> subprocess.CompletedProcess:
    """The script's quick run, in a session of its own: at the timeout the whole process group is
    killed (a shell script's current command too, not only the shell)."""
    env = {**os.environ, "HLBL_BENCH_OUT": str(out), "PYTHONUNBUFFERED": "1"}
    env.pop("QUICK", None)
    timeout = SLOW_TIMEOUT_S if name in SLOW else TIMEOUT_S
    proc = subprocess.Popen(
        command(name),
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        stderr += f"\ntimed out after {timeout} s"
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


@pytest.fixture(scope="module")
def quick_runs(request, tmp_path_factory):
    """The quick runs of the selected scripts, started together, WORKERS at a time."""
    names = [
        item.callspec.params["name"]
        for item in request.session.items
        if getattr(item, "originalname", None) == "test_quick_mode" and item.module.__name__ == __name__
    ]
    names = [n for n in names if has_quick_mode(n)]
    before = snapshot()
    warm_kernels()
    outs = {n: tmp_path_factory.mktemp(n.replace(".", "_")) for n in names}
    with ThreadPoolExecutor(WORKERS) as pool:
        # the shell pipelines (several commands each) first, so that none is left to run alone at the end
        futures: dict[str, Future] = {
            n: pool.submit(run, n, outs[n]) for n in sorted(names, key=lambda n: (not n.endswith(".sh"), n))
        }
        yield futures, outs, before
        for f in futures.values():  # (a test stopped early: wait for the children rather than orphan them)
            f.cancel()


def test_scripts_found():
    assert {"throughput.py", "engine_agreement.sh"} <= set(SCRIPTS)


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in SCRIPTS])
def test_quick_mode(name, quick_runs):
    assert has_quick_mode(name), (
        f"bench/{name} has no quick mode: use bench/_common.py's add_common/finish_args "
        "(or source bench/_common.sh) and make --quick run in seconds on tiny data"
    )
    futures, outs, before = quick_runs
    proc = futures[name].result()
    tail = (proc.stdout[-3000:] + "\n--- stderr ---\n" + proc.stderr[-5000:]).strip()
    assert proc.returncode == 0, f"{' '.join(command(name))} exited {proc.returncode}:\n{tail}"
    written = [
        p
        for p in outs[name].rglob("*")
        if p.is_file() and p.stat().st_size and p.relative_to(outs[name]).parts[0] not in NOT_OUTPUT
    ]
    assert written, f"bench/{name} --quick wrote nothing under $HLBL_BENCH_OUT:\n{tail}"
    changed = {k for k, v in snapshot().items() if before.get(k) != v}
    assert not changed, f"a quick run wrote into the repository: {sorted(changed)[:10]}"


def test_lstm_variant_runs_sit_beside_the_default_runs(tmp_path):
    """bench/lstm.py --variant: a learned tree of other settings gets its own keys and run record
    in the same summary, and leaves the default run's keys and record as they were."""
    import json

    env = {**os.environ, "HLBL_BENCH_OUT": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    base = [sys.executable, str(BENCH / "lstm.py"), "--quick", "--no-speed", "--outputs", "learned-tree"]
    rebuild = ["--variant", "rb", "--epochs", "2", "--bootstrap-epochs", "1", "--rebuild-at", "1"]
    for extra in ([], ["--variant", "x2", "--tree-copies", "2"], rebuild):
        proc = subprocess.run(base + extra, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
        assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "lstm" / "summary.json").read_text())
    runs = json.loads((tmp_path / "lstm" / "runs.json").read_text())
    assert summary["bootstrap_epochs"] == 1 and "learned_tree_test_ppl" in summary
    assert summary["learned_tree_x2_settings"] == {
        "tree_policy": "adaptive:0.25",
        "tree_copies": 2,
        "bootstrap_epochs": 1,
    }
    assert summary["learned_tree_x2_test_ppl"] != summary["learned_tree_test_ppl"]  # another tree, another model
    assert sorted(r.get("variant", "") for r in runs) == ["", "rb", "x2"]
    # the tree learned again after epoch 1, within the run: its settings and seconds kept
    assert summary["learned_tree_rb_settings"]["rebuild_at"] == [1] and summary["learned_tree_rb_rebuild_s"] > 0
    # the best hierarchy over the three runs, with the command of the call that trained it
    best = summary["best_hierarchy"]
    ppl = {n: summary[f"{n}_test_ppl"] for n in ("learned_tree", "learned_tree_x2", "learned_tree_rb")}
    assert best["test_ppl"] == min(ppl.values()) and ppl[best["name"]] == best["test_ppl"]
    assert best["command"].startswith("python bench/lstm.py --quick")
    x2 = next(r for r in runs if r.get("variant") == "x2")
    assert x2["tree"]["codes_per_word"] >= 2.0


def test_lstm_step_speed_times_every_layer_side_by_side(tmp_path):
    """bench/lstm.py --step-speed --quick: each layer's seconds per step (the hybrid at two head
    sizes among them) and adaptive / each, written to step_speed.json."""
    import json

    env = {**os.environ, "HLBL_BENCH_OUT": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, str(BENCH / "lstm.py"), "--quick", "--step-speed"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads((tmp_path / "lstm" / "step_speed.json").read_text())
    layers = set(out["s_per_step"])
    assert {"full", "adaptive", "huffman", "learned_tree", "classes_s2000", "classes_s2000_d4"} < layers
    assert len([n for n in layers if n.startswith("hybrid_k")]) == 2
    assert all(out[f"{n}_step_speed_vs_adaptive"] > 0 for n in layers - {"adaptive"})


def test_lstm_on_a_cut_corpus_and_the_family_keys(tmp_path):
    """--max-vocab/--train-tokens: the corpus cut once into the cache (its first lines up to the
    tokens, the vocabulary of those lines, <unk> elsewhere), named in the summary; the summary's
    tree_* and hybrid_* keys come from the runs of those families."""
    import json

    env = {**os.environ, "HLBL_BENCH_OUT": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, str(BENCH / "lstm.py"), "--quick", "--no-speed", "--max-vocab", "30"]
    cmd += ["--train-tokens", "3000", "--outputs", "tree,hybrid-huffman"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "lstm" / "summary.json").read_text())
    cut = tmp_path / "cache" / "data" / "toy-30w-3000t"
    assert summary["data"] == "synthetic" and cut.is_dir()
    train = (cut / "train.txt").read_text().split("\n")[:-1]
    tokens = [w for line in train for w in line.split()]
    assert 3000 <= len(tokens) + len(train) < 3000 + 20  # whole lines, the last one crossing
    assert len(set(tokens)) == 29 and "<unk>" in tokens  # 30 with <eos>
    words = set(tokens)
    for split in ("valid", "test"):
        assert set((cut / f"{split}.txt").read_text().split()) <= words
    assert summary["tree_name"] == "huffman" and summary["tree_test_ppl"] == summary["huffman_test_ppl"]
    assert summary["hybrid_name"] == "hybrid_huffman"
    assert summary["hybrid_tokens_per_s"] == summary["hybrid_huffman_tokens_per_s"]


def test_lstm_classes_runs_have_their_keys_and_settings(tmp_path):
    """bench/lstm.py --outputs classes: the class softmax's figures under classes_* keys, with its
    settings (the number of classes, round(sqrt(V)) by default, the shortlist, the bootstrap)."""
    import json

    env = {**os.environ, "HLBL_BENCH_OUT": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, str(BENCH / "lstm.py"), "--quick", "--no-speed", "--outputs", "classes"]
    proc = subprocess.run(
        cmd + ["--class-shortlist", "5"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "lstm" / "summary.json").read_text())
    assert 1.0 < summary["classes_test_ppl"] < 40 and summary["classes_valid_ppl"] > 1.0
    assert summary["classes_settings"] == {"classes": 8, "class_shortlist": 5, "bootstrap_epochs": 1}
    (run,) = json.loads((tmp_path / "lstm" / "runs.json").read_text())
    assert run["output"] == "classes" and run["classes"]["shortlist"] == 5 and run["bootstrap_output"] == "tree"


def test_completion_questions_follow_the_construction_and_the_summary_has_its_keys(tmp_path):
    """bench/completion.py --quick: the same questions twice (seeded); every question a blank at
    least 4 words in, five distinct candidates, the impostors within 0.5-2x the answer's training
    count and among the n-gram model's 30 likeliest such words after the 4 words before the blank."""
    import json

    env = {**os.environ, "HLBL_BENCH_OUT": str(tmp_path)}
    cmd = [sys.executable, str(BENCH / "completion.py"), "--quick"]
    for _ in range(2):
        done = subprocess.run(cmd + ["--rebuild"], env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
        assert done.returncode == 0, done.stderr[-2000:]
        first = (tmp_path / "questions" / "test.jsonl").read_text()
        if _ == 0:
            kept = first
    assert first == kept and first.count("\n") == 40
    summary = json.loads((tmp_path / "summary.json").read_text())
    keys = ("questions", "kn5_accuracy", "kn5_most_frequent_rate", "best_hlbl", "mixture_accuracy", "by_band")
    assert set(keys) | {"loss_by_band"} <= set(summary)
    assert set(summary["best_hlbl"]) == {"name", "command", "accuracy", "most_frequent_rate"}
    # where the answer stands among its candidates by training count: the construction's own bias
    kn5 = summary["test"]["kn5"]
    assert sum(kn5["answer_count_rank"]) == 40 and len(kn5["answer_count_rank"]) == 5
    assert kn5["always_most_frequent_accuracy"] == kn5["answer_count_rank"][0] / 40
    assert 0 <= kn5["most_frequent_rate_word_only"] <= 1 and 0 <= kn5["most_frequent_rate_after_only"] <= 1

    sys.path.insert(0, str(BENCH))
    from completion import split_lines

    from hlbl.data import load_corpus
    from hlbl.ngram import read_arpa

    vocab = load_corpus(tmp_path / "corpus", splits=("train",)).vocab
    kn = read_arpa(tmp_path / "kn3.arpa")
    ids = kn.vocab_map(vocab.words)
    lines = split_lines(tmp_path / "corpus", "test")
    for line in first.splitlines():
        q = json.loads(line)
        tokens = q["sentence"].split()
        at = tokens.index("___")
        assert at >= 4 and len(set(q["candidates"])) == 5 and q["answer"] in q["candidates"]
        assert lines[int(q["id"].split(":")[1]) - 1].split()[at] == q["answer"]
        c = vocab.counts[vocab.index[q["answer"]]]
        band = [w for w, n in zip(vocab.words, vocab.counts) if 0.5 * c <= n <= 2 * c and w != q["answer"]]
        band = [w for w in band if w not in ("<eos>", "<unk>")]
        hist = ids[vocab.encode(tokens[at - 4 : at])]
        lp = kn.score_windows(np.asarray([[*hist, ids[vocab.index[w]]] for w in band]))
        top = {band[i] for i in np.argsort(-lp, kind="stable")[:30]}
        assert set(q["candidates"]) - {q["answer"]} <= top


def test_completion_balanced_questions_draw_impostors_on_both_sides_of_the_answers_count(tmp_path):
    """bench/completion.py build --balance count: k impostors among the 15 likeliest words at most
    as frequent as the answer, the others among the 15 likeliest more frequent ones, k varying, so
    the answer's place by count varies; questions of other settings are not reused silently."""
    import json

    env = {**os.environ, "HLBL_BENCH_OUT": str(tmp_path)}
    cmd = [sys.executable, str(BENCH / "completion.py"), "build", "--quick"]
    done = subprocess.run(cmd + ["--balance", "count"], env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((tmp_path / "questions" / "build.json").read_text())["balance"] == "count"
    sys.path.insert(0, str(BENCH))
    from hlbl.data import load_corpus
    from hlbl.ngram import read_arpa

    vocab = load_corpus(tmp_path / "corpus", splits=("train",)).vocab
    kn = read_arpa(tmp_path / "kn3.arpa")
    ids = kn.vocab_map(vocab.words)
    places = set()
    for line in (tmp_path / "questions" / "test.jsonl").read_text().splitlines():
        q = json.loads(line)
        tokens = q["sentence"].split()
        at = tokens.index("___")
        c = vocab.counts[vocab.index[q["answer"]]]
        band = [w for w, n in zip(vocab.words, vocab.counts) if 0.5 * c <= n <= 2 * c and w != q["answer"]]
        band = [w for w in band if w not in ("<eos>", "<unk>")]
        hist = ids[vocab.encode(tokens[at - 4 : at])]
        lp = kn.score_windows(np.asarray([[*hist, ids[vocab.index[w]]] for w in band]))
        for side in (True, False):
            words = [
                band[i] for i in np.argsort(-lp, kind="stable") if (vocab.counts[vocab.index[band[i]]] > c) == side
            ]
            chosen = {w for w in q["candidates"] if w != q["answer"] and (vocab.counts[vocab.index[w]] > c) == side}
            assert chosen <= set(words[:15])
        places.add(sum(vocab.counts[vocab.index[w]] > c for w in q["candidates"]))
    assert len(places) >= 3  # the answer's place by count is drawn, not fixed
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert again.returncode != 0 and "questions built with balance = 'count', not None" in again.stderr


def test_completion_merge_keeps_the_earlier_runs_and_refuses_other_questions(tmp_path):
    """bench/completion.py all --merge: the runs of the existing summary not scored again keep every
    entry, the best run is chosen over old and new (an old best with its recorded command), a run
    scored again replaces its entries, and a summary of other questions is refused in one line."""
    import json

    env = {**os.environ, "HLBL_BENCH_OUT": str(tmp_path)}
    cmd = [sys.executable, str(BENCH / "completion.py"), "all", "--quick"]
    path = tmp_path / "summary.json"

    def complete(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(cmd + list(extra), env=env, capture_output=True, text=True, timeout=TIMEOUT_S)

    def edit(change) -> dict:
        s = json.loads(path.read_text())
        change(s)
        path.write_text(json.dumps(s))
        return s

    done = complete()  # the run "quick"
    assert done.returncode == 0, done.stderr[-2000:]
    run = tmp_path / "runs" / "completion"

    def old_is_best(s):  # so that only a choice over old and new runs picks it
        s["valid"]["quick"]["accuracy"] = 1.0
        s["runs"]["quick"]["command"] = "hlbl train (as recorded)"

    first = edit(old_is_best)
    done = complete("--merge", "--run", f"other={run}")
    assert done.returncode == 0, done.stderr[-2000:]
    s = json.loads(path.read_text())
    for name in ("quick", "other"):
        assert {name, f"{name}+kn5"} <= set(s["test"]) & set(s["valid"]) & set(s["by_band"])
        assert any(k.startswith(f"{name}+kn5 (weight") for k in s["test"])
        assert f"{name}: previous line as context" in s["suspects_valid"]
        assert f"{name}+kn5: weight by valid accuracy" in s["suspects_valid"]
        assert name in s["runs"] and name in s["passes_valid"]
        for band, row in s["loss_by_band"].items():
            assert name in row and (band == "all" or f"{name}/kn5 perplexity ratio" in row)
    for k, v in first["test"].items():
        assert s["test"][k] == v  # the old run's measured numbers, and KN5's (the same questions)
    assert s["valid"]["quick"]["accuracy"] == 1.0
    assert s["loss_by_band"]["all"]["quick"] == first["loss_by_band"]["all"]["quick"]
    assert s["best_hlbl"]["name"] == "quick" and s["best_hlbl"]["command"] == "hlbl train (as recorded)"
    assert s["mixture_accuracy"] == s["test"]["quick+kn5"]["accuracy"]

    def other_is_worst(s):
        s["valid"]["other"]["accuracy"] = -1.0

    merged = edit(other_is_worst)
    done = complete("--merge", "--run", f"quick={run}")  # "quick" scored again: its entries replaced
    assert done.returncode == 0, done.stderr[-2000:]
    s = json.loads(path.read_text())
    assert list(s["runs"]) == ["other", "quick"] and s["valid"]["other"]["accuracy"] == -1.0
    assert s["test"]["other+kn5"] == merged["test"]["other+kn5"] and s["runs"]["other"] == merged["runs"]["other"]
    assert s["valid"]["quick"]["accuracy"] < 1.0 and s["best_hlbl"]["name"] == "quick"
    assert s["best_hlbl"]["command"] == s["runs"]["quick"]["command"] != "hlbl train (as recorded)"

    kept = path.read_text()
    for change, said in (
        (lambda s: s.update(kn5_accuracy=s["kn5_accuracy"] + 0.025), "kn5 test accuracy"),
        (lambda s: s["build"].update(seed=1), "build seed 1 there, 0 here"),
    ):
        path.write_text(kept)
        edit(change)
        before = path.read_text()
        done = complete("--merge", "--run", f"third={run}")
        assert done.returncode != 0 and said in done.stderr.strip().splitlines()[-1], done.stderr[-2000:]
        assert done.stderr.strip().splitlines()[-1].startswith("--merge:")
        assert path.read_text() == before  # nothing written
