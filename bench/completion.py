"""The completion benchmark: sentences with one word blanked and five candidates, built from a
corpus's valid split (for tuning) and test split (for reporting), ranked by KN5, HLBL runs and
their mixtures with :mod:`hlbl.ranking` (the machinery of ``hlbl rank``).

How a question is built (``build``; deterministic under ``--seed``):

* a line of the split with 10 to 40 words (the corpora hold one paragraph a line), drawn at random;
* a position at least 4 words in whose word is alphabetic (``str.isalpha``) and seen 10 to 10,000
  times in the training split (and so in the vocabulary), drawn at random: the answer;
* impostors *proposed by the n-gram model from the left context*: among the vocabulary's
  alphabetic words whose training count is 0.5 to 2 times the answer's (not the answer, nor a
  spelling of it in another case), the 30 likeliest under the n-gram model (KN5) given the 4
  words before the blank; 4 of them drawn at random. A question with fewer than 4 such words is
  skipped. The five candidates are shuffled.

So the impostors are words KN5 itself finds plausible after the left context: KN5 is handicapped
(it proposed them), and a model must use more than the four words before the blank, or the words
after it, to beat it. Questions are written as ``hlbl rank`` input (``QUESTIONS_DIR/valid.jsonl``,
``test.jsonl``), each ``id`` ``"split:line:position"`` (the line's number in the split file).

``score`` ranks them by every model named and reports, per model and split: accuracy; the rate
of picking the most frequent of the five candidates (training counts); accuracy per band of the
answer's training count; accuracy ranking by the candidate's own words only and by the words
after it only. Mixtures of each run with the n-gram model are scored at the weight fitted on the
valid split's perplexity (``hlbl eval --weight auto``'s) and at the weight that ranks the valid
questions best (a grid). The suspects of the valid part: a run reading the line before the
sentence as its context instead of the all-``<eos>`` start.

``loss`` is each model's test loss per band of the target word's training count, the split read
as one stream (``hlbl eval``'s protocol: the n-gram model restarts at each line from ``<s>``).

``all`` runs the three and writes ``--out`` (``results/completion/summary.json``).

    python bench/completion.py all --kn5 kn5.safetensors --run x2=runs/x2 --run random=runs/random \\
        --data gutenberg --max-vocab 50000 --questions 1000

``all --merge`` adds to the existing ``--out`` rather than replacing it: every entry of its runs
not scored in this invocation (their scores, mixtures, suspects, bands, loss columns, ``runs`` and
``passes_valid`` records) is kept, KN5's numbers are this invocation's, and ``best_hlbl`` and
``mixture_accuracy`` are chosen over the old runs and the new (an old best keeps its recorded
command). The summary must hold the same questions: other ``build`` settings, KN5 test or valid
accuracy, or test token counts per band are refused, before a word is written.

    python bench/completion.py all --merge --kn5 kn5.safetensors --run x2-full=runs/x2-full

``--quick``: a synthetic corpus, a KN3 model and a one-epoch run (or the ``--run`` given, trained
on that corpus), a few dozen questions, seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, fields, replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, add_common, finish_args, quick_dir, quick_run, tiny_corpus, write_json  # noqa: E402

BANDS = ((10, 99), (100, 999), (1000, 10000))  # answer's training count: the bands


@dataclass(frozen=True)
class Build:
    """How questions are built (the module doc); ``word_rule`` "alpha" (str.isalpha) or "any"."""

    questions: int = 1000
    seed: int = 0
    min_words: int = 10
    max_words: int = 40
    min_position: int = 4
    min_count: int = 10
    max_count: int = 10000
    band: tuple[float, float] = (0.5, 2.0)
    top: int = 30
    impostors: int = 4
    word_rule: str = "alpha"
    balance: str = "none"  # "count": as many impostors above the answer's count as below, on average


def _word_ok(word: str, rule: str) -> bool:
    return word.isalpha() if rule == "alpha" else word not in ("<eos>", "<unk>")


def split_lines(data, split: str) -> list[str]:
    from hlbl.data.corpus import resolve_corpus

    return (resolve_corpus(data) / f"{split}.txt").read_text(encoding="utf-8").split("\n")


def build_questions(lines: list[str], split: str, vocab, kn, cfg: Build) -> list[dict]:
    """Questions from one split's lines (the module doc), as ``hlbl rank`` JSON objects."""
    rng = np.random.default_rng([cfg.seed, ["valid", "test"].index(split) if split in ("valid", "test") else 2])
    counts = np.asarray(vocab.counts, dtype=np.int64)
    ok = np.asarray([_word_ok(w, cfg.word_rule) for w in vocab.words])
    lower = np.asarray([w.lower() for w in vocab.words])
    kn_ids = kn.vocab_map(vocab.words)  # (V,) the n-gram model's id of each vocabulary word
    order = rng.permutation(len(lines))
    out = []
    for li in order:
        if len(out) >= cfg.questions:
            break
        tokens = lines[li].split()
        if not cfg.min_words <= len(tokens) <= cfg.max_words:
            continue
        ids = vocab.encode(tokens)
        spots = [
            i
            for i in range(cfg.min_position, len(tokens))
            if _word_ok(tokens[i], cfg.word_rule)
            and ids[i] != vocab.unk
            and cfg.min_count <= counts[ids[i]] <= cfg.max_count
        ]
        if not spots:
            continue
        at = int(rng.choice(spots))
        answer = ids[at]
        c = counts[answer]
        pool = np.flatnonzero(ok & (counts >= cfg.band[0] * c) & (counts <= cfg.band[1] * c) & (lower != lower[answer]))
        if len(pool) < cfg.impostors:
            continue
        history = kn_ids[np.asarray(ids[at - cfg.min_position : at])]
        windows = np.empty((len(pool), cfg.min_position + 1), dtype=np.int64)
        windows[:, :-1] = history
        windows[:, -1] = kn_ids[pool]
        lp = kn.score_windows(windows)
        chosen = _impostors(pool, lp, counts[pool] > c, cfg, rng)
        if chosen is None:
            continue
        cands = [vocab.words[int(w)] for w in rng.permutation(np.concatenate([[answer], chosen]))]
        out.append(
            {
                "id": f"{split}:{int(li) + 1}:{at}",
                "sentence": " ".join(tokens[:at] + ["___"] + tokens[at + 1 :]),
                "candidates": cands,
                "answer": tokens[at],
            }
        )
    return out


def _impostors(pool: np.ndarray, lp: np.ndarray, above: np.ndarray, cfg: Build, rng) -> np.ndarray | None:
    """``cfg.impostors`` words of ``pool`` (word ids, by id) drawn from the ``cfg.top`` likeliest
    by ``lp`` (the n-gram model's log-probabilities after the left context), or None if too few.

    Why ``balance="count"``: the likeliest words of the 0.5-2x band lean to its frequent end (an
    n-gram model's probabilities grow with a word's count), so the answer is seldom the most
    frequent candidate (2-3% of questions, not 20%) and a model's leaning to frequent words is
    punished by the construction itself. Balanced, the likeliest ``top / 2`` of the words at most
    as frequent as the answer and of those more frequent are two pools; k impostors come from the
    first, k drawn uniformly from 0 to ``impostors``, the rest from the second: the answer's place
    by count among the candidates is uniform, and always picking the most frequent is chance."""
    by_lp = np.argsort(-lp, kind="stable")  # ties: the more frequent (lower id) first
    if cfg.balance == "none":
        likeliest = pool[by_lp[: cfg.top]]
        return rng.choice(likeliest, cfg.impostors, replace=False) if len(likeliest) >= cfg.impostors else None
    half = cfg.top // 2
    below, upper = pool[by_lp[~above[by_lp]][:half]], pool[by_lp[above[by_lp]][:half]]
    k = int(rng.integers(0, cfg.impostors + 1))
    if len(below) < k or len(upper) < cfg.impostors - k:
        return None
    return np.concatenate([rng.choice(below, k, replace=False), rng.choice(upper, cfg.impostors - k, replace=False)])


def read_questions_file(path: Path):
    from hlbl.ranking import read_questions

    with open(path, "rb") as f:
        return [q for _, q in read_questions(f)]


def with_previous_line(questions, lines: list[str]):
    """The questions with the line before each sentence as their ``context`` (none for a split's first line)."""
    out = []
    for q in questions:
        line = int(str(q.id).split(":")[1])
        out.append(replace(q, context=lines[line - 2] if line >= 2 else None))
    return out


def metrics(rankings, vocab) -> dict:
    """Accuracy, the most-frequent-candidate rate (also when ranking by the candidate's own words
    or by the words after it alone), accuracy per answer band, the word-only and after-only
    accuracies, the always-most-frequent baseline, and how often the answer is the candidates'
    most frequent, second most frequent, ... (``answer_count_rank``: the questions' own bias)."""
    from hlbl.ranking import best_first, summarize

    index, counts = vocab.index, vocab.counts

    def count(word: str) -> int:
        return int(counts[index[word]]) if word in index else 0

    picks_frequent, frequent_right, by_band = 0, 0, {f"{lo}-{hi}": [0, 0] for lo, hi in BANDS}
    part_frequent = {"word": 0, "after": 0}
    answer_rank = np.zeros(max((len(r.question.candidates) for r in rankings), default=0), dtype=int)
    for r in rankings:
        q = r.question
        c = [count(w) for w in q.candidates]
        top = int(np.argmax(c))  # ties: the earlier candidate
        picks_frequent += r.best == top
        frequent_right += top == q.answer
        answer_rank[best_first(c).index(q.answer)] += 1
        for part in part_frequent:
            part_frequent[part] += best_first([getattr(s, part) for s in r.scores])[0] == top
        a = c[q.answer]
        for lo, hi in BANDS:
            if lo <= a <= hi:
                by_band[f"{lo}-{hi}"][0] += 1
                by_band[f"{lo}-{hi}"][1] += bool(r.correct)
    s = summarize(rankings)
    n = len(rankings)
    return {
        "questions": n,
        "accuracy": s["accuracy"],
        "most_frequent_rate": picks_frequent / n,
        "accuracy_word_only": s["accuracy_word_only"],
        "accuracy_after_only": s["accuracy_after_only"],
        "by_band": {b: {"questions": q, "accuracy": (k / q if q else None)} for b, (q, k) in by_band.items()},
        "always_most_frequent_accuracy": frequent_right / n,
        "most_frequent_rate_word_only": part_frequent["word"] / n,
        "most_frequent_rate_after_only": part_frequent["after"] / n,
        "answer_count_rank": [int(k) for k in answer_rank],
    }


def _named(specs: list[str]) -> dict[str, Path]:
    out = {}
    for spec in specs or []:
        name, sep, path = spec.partition("=")
        if not sep:
            raise SystemExit(f"--run takes NAME=DIR, got {spec!r}")
        out[name] = Path(path)
    return out


def shown(path) -> str:
    """A path as results show it: relative to the repository, or from its ``runs/`` folder on
    (runs live in a ``runs/`` folder by convention), else its name."""
    p = Path(path).resolve()
    try:
        return p.relative_to(ROOT).as_posix()
    except ValueError:
        parts = p.parts
        return "/".join(parts[parts.index("runs") :]) if "runs" in parts else p.name


def _command(run: Path) -> str:
    """The command that made a run, from its record (``hlbl.run.Run``: the flags a user gives)."""
    from hlbl.cli.common import FLAGS
    from hlbl.config import TrainConfig
    from hlbl.run import Run

    rec = Run.open(run).record
    tree = rec.options.tree
    tree = shown(tree) if tree and ("/" in str(tree) or str(tree).endswith(".json")) else tree
    cmd = f"hlbl train --data {rec.corpus.spec} --max-vocab {rec.text.max_vocab} --tree {tree} "
    cmd += f"--dim {rec.model.dim} --context {rec.model.context} --threads 1"
    # every training setting the run changed, as its flag (not sync_every: one process has no rounds)
    for f in fields(TrainConfig):
        value = getattr(rec.train, f.name)
        if f.name in FLAGS and f.name not in ("progress", "sync_every") and value != f.default:
            cmd += f" {FLAGS[f.name]} {int(value) if f.name == 'time_budget' else value}"
    return cmd + f" --out {shown(run)}"


def _budget(run: Path) -> dict:
    """What a run was given and reached: epochs, passes, training minutes, best valid perplexity."""
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    last = lines[-1]
    passes = sum(1 / x.get("parts", 1) for x in lines)  # an epoch is 1/parts of a pass
    return {
        "command": _command(run),
        "epochs": len(lines),
        "passes": round(passes, 2),
        "training_minutes": round(sum(x.get("epoch_minutes", 0.0) for x in lines), 1),
        "best_valid_perplexity": min(x["valid_ppl"] for x in lines),
        "last_lr": last.get("lr"),
    }


# ---- stages ---------------------------------------------------------------------------------


class Models:
    """The vocabulary (the first run's), the n-gram model (read once) and the runs, loaded lazily."""

    def __init__(self, args):
        from hlbl.data import Vocab
        from hlbl.ngram.cache import NgramFile

        self.args = args
        self.paths = _named(args.run)
        self._runs = None
        if self.paths:  # the runs' vocabulary (they share one), read without their weights
            first = next(iter(self.paths.values()))
            self.vocab = Vocab.from_json(json.loads((first / "vocab.json").read_text(encoding="utf-8")))
        else:
            from hlbl.data import load_corpus

            self.vocab = load_corpus(args.data, args.max_vocab, splits=("train",)).vocab
        self.ngram_file = NgramFile(args.kn5)

    @property
    def runs(self) -> dict:
        """name -> the run's model (best weights), loaded when first asked."""
        if self._runs is None:
            from hlbl.run import load_model

            self._runs = {}
            for name, path in self.paths.items():
                model, vocab, _ = load_model(path, device="cpu")
                if list(vocab.words) != list(self.vocab.words):
                    raise SystemExit(f"{path}: its vocabulary differs from the first run's")
                model.eval()
                self._runs[name] = model
        return self._runs

    @property
    def kn(self):
        return self.ngram_file.model

    def mixture(self, name: str):
        """The run ``name`` with the n-gram model, its weight fitted on the valid split's perplexity."""
        from hlbl.data import load_corpus
        from hlbl.mixture import Component, Mixture

        run = Component(name, "run", self.paths[name], self.runs[name], "best")
        ngram = Component(str(self.args.kn5), "ngram", Path(self.args.kn5), self.ngram_file)
        mix = Mixture([run, ngram], self.vocab)
        mix.fit(load_corpus(self.args.data, vocab=self.vocab, splits=("valid",)))
        return mix


def stage_build(args, models: Models) -> dict[str, Path]:
    """The questions of each split in ``--questions-dir``: built, or those already there when
    they were built with these settings (its ``build.json``; a directory without one is taken as
    built with the default construction)."""
    cfg = Build(**{k: getattr(args, k) for k in ("questions", "seed")}, **args.build_overrides)
    settings, record = build_settings(args), Path(args.questions_dir) / "build.json"
    before = (
        json.loads(record.read_text()) if record.is_file() else {k: v for k, v in settings.items() if k != "balance"}
    )
    if not args.rebuild and before != settings and any(Path(args.questions_dir).glob("*.jsonl")):
        key = sorted(k for k in before.keys() | settings.keys() if before.get(k) != settings.get(k))[0]
        raise SystemExit(
            f"{args.questions_dir}: questions built with {key} = {before.get(key)!r}, not {settings.get(key)!r}; "
            "give another --questions-dir, or --rebuild"
        )
    out = {}
    for split in ("valid", "test"):
        path = Path(args.questions_dir) / f"{split}.jsonl"
        out[split] = path
        if path.is_file() and not args.rebuild:
            continue
        qs = build_questions(split_lines(args.data, split), split, models.vocab, models.kn, cfg)
        path.parent.mkdir(parents=True, exist_ok=True)
        from hlbl.atomic import write_text

        write_text(path, "".join(json.dumps(q, ensure_ascii=False) + "\n" for q in qs))
        print(f"{split}: {len(qs)} questions -> {path}", file=sys.stderr)
        write_text(record, json.dumps(settings, indent=1) + "\n")
    return out


def _mixed_scorer(parts, questions, weight: float, vocab):
    """A scorer mixing two components' token scores of exactly these questions' sentences,
    computed once (``parts``): the weight grid without scoring again."""
    from hlbl.ngram.mixture import interpolate_many
    from hlbl.ranking import Scorer
    from hlbl.scoring import TokenScores

    a, b = parts
    mixed = interpolate_many(np.stack([a.log_probs, b.log_probs]), np.asarray([weight, 1.0 - weight]))
    return Scorer(vocab, lambda s, c: TokenScores(mixed, a.lengths, a.oov))


def stage_score(args, models: Models, files: dict[str, Path]) -> dict:
    from hlbl.ranking import Scorer, rank

    qs = {split: read_questions_file(path) for split, path in files.items()}
    scorers = {"kn5": Scorer.ngram(models.kn, "kn5")}
    for name, model in models.runs.items():
        scorers[name] = Scorer.run(model, models.vocab, "cpu", name)
    result = {split: {} for split in qs}
    for name, scorer in scorers.items():
        for split in qs:
            result[split][name] = metrics(rank(scorer, qs[split]), models.vocab)
            print(f"{split} {name}: {result[split][name]['accuracy']:.3f}", file=sys.stderr)
    suspects = {}
    valid_lines = split_lines(args.data, "valid")
    grid = [round(x, 2) for x in np.linspace(0.1, 0.9, 9)]
    for name in models.runs:
        run_scorer, kn_scorer = scorers[name], scorers["kn5"]
        with_prev = with_previous_line(qs["valid"], valid_lines)
        suspects[f"{name}: previous line as context"] = metrics(rank(run_scorer, with_prev), models.vocab)
        mix = models.mixture(name)
        w = float(mix.weights[0])
        for split in qs:
            result[split][f"{name}+kn5"] = {"weight": w, **metrics(rank(Scorer.mixture(mix), qs[split]), models.vocab)}
        sents = {s: [x for q in qs[s] for x in q.sentences()] for s in qs}
        parts = {s: (run_scorer.token_scores(sents[s], None), kn_scorer.token_scores(sents[s], None)) for s in qs}
        sweep = {
            str(g): metrics(
                rank(_mixed_scorer(parts["valid"], qs["valid"], g, models.vocab), qs["valid"]), models.vocab
            )["accuracy"]
            for g in grid
        }
        best_w = float(max(grid, key=lambda g: (sweep[str(g)], -abs(g - w))))
        suspects[f"{name}+kn5: weight by valid accuracy"] = {"valid_accuracy_by_weight": sweep, "chosen": best_w}
        tuned = _mixed_scorer(parts["test"], qs["test"], best_w, models.vocab)
        result["test"][f"{name}+kn5 (weight {best_w} from valid questions)"] = {
            "weight": best_w,
            **metrics(rank(tuned, qs["test"]), models.vocab),
        }
    return {"valid": result["valid"], "test": result["test"], "suspects_valid": suspects}


def stage_passes(args, models: Models) -> dict:
    """The valid questions ranked by the weights after each epoch of the runs ``--passes`` names
    (their checkpoints), beside the epoch's valid perplexity: accuracy against training."""
    from hlbl.checkpoint import load_weights
    from hlbl.ranking import Scorer, rank

    qs = read_questions_file(Path(args.questions_dir) / "valid.jsonl")
    out = {}
    for spec in args.passes or []:
        name, _, where = spec.partition("=")
        model = models.runs[name]
        run = models.paths[name]
        saved = Path(where) if where else run / "checkpoints"  # a run keeps only its newest checkpoint
        lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
        ppl = {m.get("epoch"): m.get("valid_ppl") for m in lines}
        rows = []
        for ckpt in sorted(saved.glob("epoch-*")):
            epoch = int(ckpt.name.split("-")[1])
            load_weights(ckpt / "last.safetensors", model, vocab=models.vocab)
            m = metrics(rank(Scorer.run(model, models.vocab, "cpu"), qs), models.vocab)
            rows.append(
                {"epoch": epoch, "valid_ppl": ppl.get(epoch), **{k: m[k] for k in ("accuracy", "most_frequent_rate")}}
            )
            print(f"{name} epoch {epoch}: {rows[-1]}", file=sys.stderr)
        load_weights(run / "best.safetensors", model, vocab=models.vocab)  # as the other stages read it
        out[name] = rows
    return out


def _band_of(word: str, count: int) -> str:
    if word in ("<eos>", "<unk>"):
        return word
    for lo, hi in ((1, 9), (10, 99), (100, 999), (1000, 9999)):
        if lo <= count <= hi:
            return f"{lo}-{hi}"
    return "10000+"


def stage_loss(args, models: Models) -> dict:
    """Test loss (mean natural-log NLL a token) per band of the target's training count, each
    run beside the n-gram model, the split as one stream."""
    from hlbl.data import load_corpus
    from hlbl.evaluate import token_log_probs
    from hlbl.ngram.model import LN10

    vocab = models.vocab
    stream = load_corpus(args.data, vocab=vocab, splits=("test",))["test"]
    bands = np.asarray([_band_of(w, c) for w, c in zip(vocab.words, vocab.counts)])[stream]
    lps = {"kn5": models.ngram_file.stream_log10(stream, vocab.words, vocab.eos)[0] * LN10}
    for name, model in models.runs.items():
        lps[name] = token_log_probs(model, stream, vocab.eos)
    out = {}
    for band in ["<eos>", "<unk>", "1-9", "10-99", "100-999", "1000-9999", "10000+"]:
        m = bands == band
        if not m.any():
            continue
        row = {"tokens": int(m.sum())}
        row.update({name: float(-lp[m].mean()) for name, lp in lps.items()})
        for name in models.runs:
            row[f"{name}/kn5 perplexity ratio"] = math.exp(row[name] - row["kn5"])
        out[band] = row
    out["all"] = {"tokens": len(stream), **{name: float(-lp.mean()) for name, lp in lps.items()}}
    return out


def out_runs_command(args, models: Models, name: str) -> str:
    given = dict(spec.partition("=")[::2] for spec in args.command or [])
    return given.get(name) or _command(models.paths[name])


def _with_best(out: dict) -> dict:
    """``out`` with ``best_hlbl`` (the run of the best valid accuracy, its command as ``runs``
    records it) and ``mixture_accuracy`` (that run's mixture with KN5) after the KN5 numbers."""
    test, valid, runs = out["test"], out["valid"], out["runs"]
    best = max(runs, key=lambda n: valid[n]["accuracy"]) if runs else None  # chosen on valid
    chosen = {}
    if best is not None:
        chosen["best_hlbl"] = {
            "name": best,
            "command": runs[best]["command"],
            "accuracy": test[best]["accuracy"],
            "most_frequent_rate": test[best]["most_frequent_rate"],
        }
        chosen["mixture_accuracy"] = test[f"{best}+kn5"]["accuracy"]
    res = {}
    for k, v in out.items():
        if k not in ("best_hlbl", "mixture_accuracy"):
            res[k] = v
        if k == "kn5_most_frequent_rate":
            res.update(chosen)
    return res


def summary(args, models: Models, scores: dict, loss: dict, files: dict[str, Path]) -> dict:
    test, valid = scores["test"], scores["valid"]
    out = {
        "questions": test["kn5"]["questions"],
        "valid_questions": valid["kn5"]["questions"],
        "kn5_accuracy": test["kn5"]["accuracy"],
        "kn5_most_frequent_rate": test["kn5"]["most_frequent_rate"],
    }
    out["by_band"] = {name: {b: v["accuracy"] for b, v in m["by_band"].items()} for name, m in test.items()}
    out["loss_by_band"] = loss
    out["build"] = build_settings(args)
    out["n_gram_model"] = shown(args.kn5)
    out["runs"] = {name: _budget(path) for name, path in models.paths.items()}
    for name in out["runs"]:  # given where run.json cannot say it (a resumed run)
        out["runs"][name]["command"] = out_runs_command(args, models, name)
    for name in out["runs"]:  # hlbl eval's number: the test split as one stream
        out["runs"][name]["test_perplexity"] = math.exp(loss["all"][name])
    out["kn5_test_perplexity"] = math.exp(loss["all"]["kn5"])
    out["test"], out["valid"], out["suspects_valid"] = test, valid, scores["suspects_valid"]
    return _with_best(out)


def build_settings(args) -> dict:
    """The ``build`` settings of this invocation, as a summary holds them (JSON: the band a list)."""
    out = json.loads(json.dumps(Build(questions=args.questions, seed=args.seed, **args.build_overrides).__dict__))
    if out["balance"] == "none":  # the construction summaries were first written with
        del out["balance"]
    return out


# ---- --merge: the models of an earlier summary kept beside this invocation's ------------------


def read_merged(args) -> dict:
    """The summary ``--merge`` adds to (``--out``), refused at once if built with other settings."""
    path = Path(args.out)
    if not path.is_file():
        raise SystemExit(f"--merge: no summary at {path} to merge into")
    old = json.loads(path.read_text(encoding="utf-8"))
    diff = _differences(old, {"build": build_settings(args)})
    if diff:
        raise SystemExit(f"--merge: {path} holds other questions: {'; '.join(diff)}")
    return old


def _differences(old: dict, new: dict) -> list[str]:
    """What says two summaries rank other questions: the build settings, and where ``new`` holds
    scores, KN5's test and valid accuracy and the test tokens per band; as ``WHAT X there, Y here``."""
    ob, nb = old.get("build") or {}, new["build"]
    out = [f"build {k} {ob.get(k)} there, {nb.get(k)} here" for k in {**ob, **nb} if ob.get(k) != nb.get(k)]
    if "test" not in new:  # the settings only (read_merged, before scoring)
        return out
    checks = {
        "kn5 test accuracy": lambda s: s.get("kn5_accuracy"),
        "test.kn5 accuracy": lambda s: s.get("test", {}).get("kn5", {}).get("accuracy"),
        "valid.kn5 accuracy": lambda s: s.get("valid", {}).get("kn5", {}).get("accuracy"),
        "loss_by_band tokens": lambda s: {b: r.get("tokens") for b, r in (s.get("loss_by_band") or {}).items()},
    }
    return out + [f"{what} {get(old)} there, {get(new)} here" for what, get in checks.items() if get(old) != get(new)]


def _owner(key: str, names) -> str | None:
    """The run an entry belongs to: ``NAME``, ``NAME+kn5...``, ``NAME: ...``, ``NAME/kn5 ...``
    (the longest such name, as one run's name may begin another's); None for KN5's and totals."""
    hits = [n for n in names if key == n or key.startswith((f"{n}+kn5", f"{n}: ", f"{n}/kn5 "))]
    return max(hits, key=len) if hits else None


def _carry(old: dict, new: dict, carried: set, names) -> dict:
    """A section of the summary: this invocation's own entries (KN5's first), with the carried
    runs' entries from the earlier summary after KN5's."""
    kept = {k: v for k, v in old.items() if _owner(k, names) in carried}
    head = {k: v for k, v in new.items() if _owner(k, names) is None}
    return {**head, **kept, **{k: v for k, v in new.items() if k not in head}}


def merge_summary(old: dict, new: dict, where: str = "the summary") -> dict:
    """``new`` (this invocation's summary) with every entry of the runs of ``old`` not scored
    again; the best run chosen over them all. Refused if the two ranked other questions."""
    diff = _differences(old, new)
    if diff:
        raise SystemExit(f"--merge: {where} holds other questions: {'; '.join(diff)}")
    old_runs = old.get("runs") or {}
    carried = set(old_runs) - set(new["runs"])
    names = set(old_runs) | set(new["runs"])
    out = dict(new)
    for part in ("test", "valid", "suspects_valid", "by_band"):
        out[part] = _carry(old.get(part) or {}, new[part], carried, names)
    out["loss_by_band"] = {
        band: _carry((old.get("loss_by_band") or {}).get(band, {}), row, carried, names)
        for band, row in new["loss_by_band"].items()
    }
    out["runs"] = {**{n: r for n, r in old_runs.items() if n in carried}, **new["runs"]}
    old_passes = old.get("passes_valid") or {}
    out["passes_valid"] = {**{n: r for n, r in old_passes.items() if n in carried}, **(new.get("passes_valid") or {})}
    return _with_best(out)


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def table(summary: dict) -> str:
    """Markdown tables of a summary (docs/completion.md's): the test part per model, the test loss
    per band, the valid suspects and the valid accuracy after each epoch."""
    lines = [
        "| model (test, {} questions) | accuracy | picks the most frequent | own word only | words after only | "
        "picks the most frequent by own word / words after | "
        "answer seen 10-99 | 100-999 | 1000-10000 |".format(summary["questions"]),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, m in summary["test"].items():
        b = m["by_band"]
        parts = [_pct(m.get(f"most_frequent_rate_{part}_only")) for part in ("word", "after")]
        lines.append(
            f"| {name} | {_pct(m['accuracy'])} | {_pct(m['most_frequent_rate'])} | {_pct(m['accuracy_word_only'])} | "
            f"{_pct(m['accuracy_after_only'])} | {' / '.join(parts)} | "
            + " | ".join(f"{_pct(v['accuracy'])} ({v['questions']})" for v in b.values())
            + " |"
        )
    runs = list(summary["runs"])
    lines += [
        "",
        "| target's training count | tokens | KN5 loss | " + " | ".join(f"{r} loss | {r}/KN5 ppl" for r in runs) + " |",
    ]
    lines.append("|---" * (3 + 2 * len(runs)) + "|")
    for band, row in summary["loss_by_band"].items():
        cells = [
            f"{row[r]:.3f} | {row.get(f'{r}/kn5 perplexity ratio', math.exp(row[r] - row['kn5'])):.2f}" for r in runs
        ]
        shown_band = f"`{band}`" if band.startswith("<") else band  # markdown would read <eos> as a tag
        lines.append(f"| {shown_band} | {row['tokens']:,} | {row['kn5']:.3f} | " + " | ".join(cells) + " |")
    lines += ["", "| suspect (valid questions) | accuracy | picks the most frequent |", "|---|---|---|"]
    for name, m in summary["valid"].items():
        lines.append(f"| {name} (as is) | {_pct(m['accuracy'])} | {_pct(m['most_frequent_rate'])} |")
    for name, m in summary["suspects_valid"].items():
        if "accuracy" in m:
            lines.append(f"| {name} | {_pct(m['accuracy'])} | {_pct(m['most_frequent_rate'])} |")
        else:
            sweep = ", ".join(f"{w}: {_pct(a)}" for w, a in m["valid_accuracy_by_weight"].items())
            lines.append(f"| {name} | {sweep} (chosen {m['chosen']}) | |")
    for name, rows in (summary.get("passes_valid") or {}).items():
        lines += ["", f"| {name}: after epoch | valid perplexity | valid accuracy | picks the most frequent |"]
        lines.append("|---|---|---|---|")
        for r in rows:
            ppl = "-" if r["valid_ppl"] is None else f"{r['valid_ppl']:.1f}"
            lines.append(f"| {r['epoch']} | {ppl} | {_pct(r['accuracy'])} | {_pct(r['most_frequent_rate'])} |")
    return "\n".join(lines)


def quick_setup(args) -> None:
    """Quick mode: the synthetic corpus, a KN3 model and a one-epoch run of it (or the ``--run``
    given), 40 questions a split."""
    from hlbl.cli import main as hlbl_main

    corpus = tiny_corpus(quick_dir() / "corpus")
    args.data = str(corpus)
    args.max_vocab = None
    kn = quick_dir() / "kn3.arpa"
    if not kn.is_file() and hlbl_main(["ngram", "train", "--data", str(corpus), "--order", "3", "--out", str(kn)]):
        raise SystemExit("hlbl ngram train failed")
    args.kn5 = str(kn)
    if not args.run:  # runs given must be trained on the synthetic corpus (tests/test_bench.py's merge)
        run, _ = quick_run("completion", "--dim", "16", "--context", "3")
        args.run = [f"quick={run}"]
    args.passes = [args.run[0].partition("=")[0]]
    args.questions = 40
    args.questions_dir = str(quick_dir() / "questions")
    args.build_overrides |= {"min_words": 6, "word_rule": "any"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("stage", nargs="?", default="all", choices=("build", "score", "loss", "passes", "all", "table"))
    ap.add_argument("--kn5", help="the n-gram model that proposes impostors (and is scored)")
    ap.add_argument("--run", action="append", help="NAME=DIR: an HLBL run to score (repeatable)")
    ap.add_argument("--max-vocab", type=int, default=50000, help="the vocabulary (when no run gives it)")
    ap.add_argument("--questions", type=int, default=1000, help="questions a split")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--questions-dir", default=str(ROOT / "runs" / "completion"), help="where the questions go")
    ap.add_argument("--rebuild", action="store_true", help="build the questions again even if present")
    ap.add_argument(
        "--balance",
        choices=("none", "count"),
        default="none",
        help="count: impostors drawn as often above the answer's training count as below (see _impostors); "
        "give another --questions-dir and --out",
    )
    ap.add_argument(
        "--command",
        action="append",
        help="NAME=TEXT: the commands that made a run, where its run.json cannot say them (a resumed run)",
    )
    ap.add_argument(
        "--passes",
        action="append",
        help="NAME[=DIR] of a --run whose epoch checkpoints (DIR/epoch-*/last.safetensors, default the run's "
        "checkpoints/) are ranked on valid",
    )
    ap.add_argument(
        "--merge",
        action="store_true",
        help="all: keep the runs of the existing --out summary not scored here (the same questions, or refused)",
    )
    add_common(ap, data="gutenberg", out="results/completion/summary.json")
    args = finish_args(ap.parse_args(argv))
    args.build_overrides = {} if args.balance == "none" else {"balance": args.balance}
    if args.stage == "table":  # the tables of an existing summary (--out), as markdown
        print(table(json.loads(Path(args.out).read_text())))
        return 0
    if args.quick:
        quick_setup(args)
    if not args.kn5:
        ap.error("--kn5 is required")
    if args.merge and args.stage != "all":
        ap.error("--merge goes with the all stage")
    earlier = read_merged(args) if args.merge else None  # before the work: a wrong --out fails at once
    models = Models(args)
    files = stage_build(args, models)
    if args.stage == "build":
        return 0
    scores = stage_score(args, models, files) if args.stage in ("score", "all") else None
    loss = stage_loss(args, models) if args.stage in ("loss", "all") else None
    passes = stage_passes(args, models) if args.stage in ("passes", "all") else None
    if args.stage == "passes":
        print(json.dumps(passes, indent=1))
    elif args.stage == "all":
        result = {**summary(args, models, scores, loss, files), "passes_valid": passes}
        if earlier is not None:
            result = merge_summary(earlier, result, args.out)
        write_json(args.out, result)
        print(table(json.loads(Path(args.out).read_text())))
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        print(json.dumps(scores if scores is not None else loss, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
