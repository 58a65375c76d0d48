"""An LSTM language model with a choice of output layer: full softmax, adaptive softmax, hlbl's
tree softmax on a Huffman tree or on a tree learned for this model, hlbl's hybrid softmax (an exact
softmax over the ``--head`` most frequent words, a learned or Huffman tree over the rest), hlbl's
class softmax over word classes learned for this model (k-means on its hidden states), or a
sampled softmax.

The recipe is PyTorch's word_language_model (2-layer LSTM, bptt 35, batch 20, SGD lr 20, clip
0.25, dropout 0.2), on PTB or any directory of train/valid/test text (``train.txt`` ... or
WikiText's ``wiki.train.tokens`` ...; one ``<eos>`` per line). Evaluation is always exact: every
output layer gives normalised log-probabilities in eval mode. See README.md and docs/layer.md.

    python examples/lstm_lm/lstm_lm.py --data ptb --output tree --epochs 1
    python examples/lstm_lm/lstm_lm.py --data ptb --output learned-tree --generate 20
    python examples/lstm_lm/lstm_lm.py --data ptb --output classes --class-shortlist 2000
    python examples/lstm_lm/lstm_lm.py --output adaptive --epochs 40 --checkpoint ckpt  # again: goes on
    python examples/lstm_lm/lstm_lm.py --quick          # seconds, a synthetic corpus
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from collections import Counter
from functools import partial
from pathlib import Path

import numpy as np
import torch
from torch import nn

import hlbl
from hlbl.atomic import write_text
from hlbl.checkpoint import load_tensors_and_meta, optimizer_tensors, restore_optimizer, save_tensors
from hlbl.output import SampledSoftmax

OUTPUTS = ("full", "adaptive", "tree", "learned-tree", "sampled", "hybrid", "hybrid-huffman", "classes")
# the kinds whose structure the bootstrap learns, and the file of a --checkpoint run that keeps it
STRUCTURE_FILES = {"learned-tree": "tree.npz", "hybrid": "tree.npz", "classes": "classes.json"}
LEARNED = tuple(STRUCTURE_FILES)


# ---- data -------------------------------------------------------------------------------------


def split_file(root: Path, split: str) -> Path:
    for name in (f"{split}.txt", f"wiki.{split}.tokens"):
        if (root / name).is_file():
            return root / name
    raise SystemExit(f"{root}: no {split}.txt or wiki.{split}.tokens")


def read_tokens(path: Path) -> list[str]:
    """Whitespace tokens with ``<eos>`` ending every line (blank lines too, as word_language_model)."""
    out: list[str] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            out.extend(line.split())
            out.append("<eos>")
    return out


class Corpus:
    """Word ids by descending training frequency (ties by first occurrence), so that adaptive
    softmax cutoffs split frequent from rare words."""

    def __init__(self, root: str | Path):
        root = Path(root) if Path(root).is_dir() else hlbl.resolve_corpus(str(root))
        self.root = root.resolve()
        tokens = {s: read_tokens(split_file(root, s)) for s in ("train", "valid", "test")}
        counts = Counter(tokens["train"])
        self.words = [w for w, _ in counts.most_common()]  # most_common keeps first-seen order on ties
        ids = {w: i for i, w in enumerate(self.words)}
        missing = {w for s in ("valid", "test") for w in tokens[s] if w not in ids}
        if missing:
            raise SystemExit(f"{root}: {len(missing)} valid/test words are not in train (e.g. {sorted(missing)[0]!r})")
        self.counts = np.array([counts[w] for w in self.words], dtype=np.float64)
        self.splits = {s: torch.tensor([ids[w] for w in t], dtype=torch.int64) for s, t in tokens.items()}

    def __len__(self) -> int:
        return len(self.words)


def batchify(stream: torch.Tensor, batch_size: int) -> torch.Tensor:
    """(T, batch_size): the stream cut into batch_size columns (the tail dropped)."""
    n = len(stream) // batch_size
    return stream[: n * batch_size].view(batch_size, n).t().contiguous()


# ---- model ------------------------------------------------------------------------------------


class FullSoftmax(nn.Module):
    """The recipe's decoder (Linear, uniform +-0.1 weights, zero bias) with the output layers'
    interface: ``forward(h, y) -> (log P(y), mean NLL)`` and ``log_prob(h)``."""

    def __init__(self, nhid: int, vocab_size: int):
        super().__init__()
        self.decoder = nn.Linear(nhid, vocab_size)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)

    def log_prob(self, h: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.decoder(h), dim=-1)

    def forward(self, h: torch.Tensor, y: torch.Tensor):
        lp = self.log_prob(h).gather(1, y.unsqueeze(1)).squeeze(1)
        return hlbl.output.LayerOutput(lp, -lp.mean())


def class_head(nhid: int, corpus: Corpus, args, classes: hlbl.WordClasses) -> hlbl.ClassSoftmax:
    """The class softmax: two softmaxes, so it starts as the recipe's decoder does, uniform +-0.1
    rows, with biases giving the unigram distribution (``--tree-init`` scaled, unigram, or frozen:
    those biases then fixed) or zero biases (uniform); zero: the layer as built. No gradient
    scaling: a root entry sees its class's share of the tokens, as an adaptive softmax's cluster
    entry does, not the whole batch as a tree's root does."""
    head = hlbl.ClassSoftmax(nhid, classes, member_dim=args.class_dim)
    if args.tree_init in ("scaled", "unigram", "frozen"):
        head.init_unigram(corpus.counts)
    if args.tree_init == "frozen":
        for bias in (head.root_bias, head.word_bias):
            bias.requires_grad_(False)
    if args.tree_init != "zero":
        for weight in (head.root_weight, head.word_weight):
            nn.init.uniform_(weight, -0.1, 0.1)
    return head


def make_head(kind: str, nhid: int, corpus: Corpus, args, structure=None) -> nn.Module:
    """The output layer ``kind``; ``structure``: the learned tree (learned-tree, hybrid) or word
    classes (classes) it is built on."""
    V, tree = len(corpus), structure
    if kind == "full":
        return FullSoftmax(nhid, V)
    if kind == "classes":
        return class_head(nhid, corpus, args, structure)
    if kind == "adaptive":
        cutoffs = [c for c in args.cutoffs if c < V - 1] or [max(1, V // 2)]
        return nn.AdaptiveLogSoftmaxWithLoss(nhid, V, cutoffs, div_value=4.0)
    if kind == "sampled":
        head = SampledSoftmax(nhid, V, samples=args.samples, init_std=0.1, generator=torch.Generator().manual_seed(1))
        head.init_unigram(corpus.counts)  # the noise distribution (and unigram biases)
        return head
    if kind in ("hybrid", "hybrid-huffman"):  # the tail tree: learned (``tree``) or Huffman (None)
        head = hlbl.HybridSoftmax.from_counts(nhid, corpus.counts, head=min(args.head, V - 2), tail_tree=tree)
        tree_layer = head.tail
    else:
        head = tree_layer = hlbl.TreeSoftmax(nhid, tree if tree is not None else hlbl.huffman_tree(corpus.counts))
    if args.tree_init in ("scaled", "unigram", "frozen"):  # zero node vectors, biases giving the unigram distribution
        head.init_unigram(corpus.counts)
    if args.tree_init == "frozen":  # the unigram biases kept fixed
        tree_layer.bias.requires_grad_(False)
    if args.tree_init == "scaled":  # no node learns faster than the softmax's busiest row (docs/layer.md)
        head.scale_node_gradients(corpus.counts)
    elif args.tree_init == "uniform":  # as the recipe's decoder: uniform +-0.1 node vectors, zero biases
        nn.init.uniform_(tree_layer.weight, -0.1, 0.1)
    if head is not tree_layer:  # the hybrid's flat head: the recipe decoder's uniform +-0.1 rows
        nn.init.uniform_(head.weight, -0.1, 0.1)
    return head


class LSTMLM(nn.Module):
    def __init__(self, vocab_size: int, head: nn.Module, emsize: int, nhid: int, nlayers: int, dropout: float):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(vocab_size, emsize)
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        self.rnn = nn.LSTM(emsize, nhid, nlayers, dropout=dropout if nlayers > 1 else 0.0)
        self.head = head
        self.nhid = nhid

    def hidden(self, x: torch.Tensor, state):
        """(T, B) word ids -> hidden vectors (T, B, nhid), the new LSTM state."""
        out, state = self.rnn(self.drop(self.encoder(x)), state)
        return self.drop(out), state

    def forward(self, x: torch.Tensor, y: torch.Tensor, state):
        h, state = self.hidden(x, state)
        return self.head(h.reshape(-1, self.nhid), y.reshape(-1)), state


def detach(state):
    return tuple(s.detach() for s in state) if state is not None else None


# ---- training and evaluation ------------------------------------------------------------------


def grad_norm(params) -> float:
    grads = [p.grad for p in params if p.grad is not None]
    return float(torch.norm(torch.stack([g.norm() for g in grads]))) if grads else 0.0


def make_optimizer(model: LSTMLM, args) -> torch.optim.Optimizer:
    """``--optimizer``: plain SGD (the recipe) or Adam, over the trainable parameters; one per run,
    so Adam's moments carry over from epoch to epoch."""
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.Adam(params, lr=args.lr) if args.optimizer == "adam" else torch.optim.SGD(params, lr=args.lr)


def progress_line(name: str, epoch: int, batch: int, batches: int, lr: float, ms: float, loss: float) -> str:
    """word_language_model's line within an epoch: batches done, lr, ms per batch and the mean
    training loss (and its exp) over the last ``--log-interval`` batches."""
    ppl = math.exp(loss) if loss < 700 else math.inf  # a diverging run: no OverflowError
    return (
        f"| {name} | epoch {epoch:3d} | {batch:5d}/{batches:5d} batches | lr {lr:.4g} | ms/batch {ms:7.2f} "
        f"| loss {loss:5.2f} | ppl {ppl:8.2f}"
    )


def train_epoch(
    model: LSTMLM,
    data: torch.Tensor,
    args,
    lr: float,
    opt: torch.optim.Optimizer | None = None,
    log=None,
    epoch: int = 1,
    name: str = "train",
) -> dict:
    """One epoch of the recipe at learning rate ``lr``: truncated BPTT, the optimiser (a fresh
    one of ``--optimizer`` when ``opt`` is None), clipping of the total gradient norm. Returns the
    seconds and the median gradient norms of the encoder and the output layer (before clipping),
    whose ratio shows whether clipping starves the encoder. With ``log``, a :func:`progress_line`
    every ``--log-interval`` batches (an epoch on PTB takes minutes on a CPU)."""
    model.train()
    enc = [p for n, p in model.named_parameters() if not n.startswith("head.")]
    opt = make_optimizer(model, args) if opt is None else opt
    for group in opt.param_groups:
        group["lr"] = lr
    state, norms, losses, tokens = None, [], [], 0
    steps = range(0, data.size(0) - 1, args.bptt)
    batches = min(len(steps), args.max_steps) if args.max_steps else len(steps)
    interval = args.log_interval if log is not None else 0
    t0 = t_logged = time.perf_counter()
    for step, i in enumerate(steps):
        if args.max_steps and step >= args.max_steps:
            break
        x, y = data[i : i + args.bptt], data[i + 1 : i + 1 + args.bptt]
        x = x[: len(y)]
        state = detach(state)
        opt.zero_grad(set_to_none=True)
        out, state = model(x, y, state)
        out.loss.backward()
        if step % args.log_every == 0:
            norms.append((grad_norm(enc), grad_norm(model.head.parameters())))
        nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        losses.append(out.loss.item())
        tokens += y.numel()
        if interval and (step + 1) % interval == 0:
            now = time.perf_counter()
            ms = 1e3 * (now - t_logged) / interval
            log(progress_line(name, epoch, step + 1, batches, lr, ms, float(np.mean(losses[-interval:]))))
            t_logged = now
    seconds = time.perf_counter() - t0
    n = np.array(norms)
    return {
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "train_loss": float(np.mean(losses[-50:])),
        "encoder_grad_norm": float(np.median(n[:, 0])),
        "head_grad_norm": float(np.median(n[:, 1])),
        "head_over_encoder": float(np.median(n[:, 1] / np.maximum(n[:, 0], 1e-12))),
    }


@torch.no_grad()
def evaluate(model: LSTMLM, data: torch.Tensor, bptt: int) -> float:
    """Exact perplexity: every output layer gives normalised log P(y) in eval mode."""
    model.eval()
    state, total, count = None, 0.0, 0
    for i in range(0, data.size(0) - 1, bptt):
        x, y = data[i : i + bptt], data[i + 1 : i + 1 + bptt]
        out, state = model(x[: len(y)], y, state)
        total -= float(out.output.double().sum())
        count += y.numel()
    return math.exp(total / count)


@torch.no_grad()
def band_losses(model: LSTMLM, data: torch.Tensor, bptt: int, counts: np.ndarray, edges) -> list[dict]:
    """Exact loss per frequency band of the next word: words of ranks ``[lo, hi)`` between
    consecutive ``edges`` (with 0 and V; ids are ranks, :class:`Corpus` orders words by training
    count), e.g. (2000, 5000): the adaptive softmax's and the hybrid's head, then two bands of the
    tail. Per band: its ranks and training counts, its tokens and their share, the mean NLL (nats),
    its share of the total NLL, and the band's perplexity (exp of the mean NLL)."""
    model.eval()
    V = len(counts)
    edges = sorted({0, V, *(int(e) for e in edges if 0 < e < V)})
    band_of = torch.bucketize(torch.arange(V), torch.tensor(edges[1:-1]), right=True)  # (V,) word -> band
    nll = torch.zeros(len(edges) - 1, dtype=torch.float64)
    tokens = torch.zeros(len(edges) - 1, dtype=torch.float64)
    state = None
    for i in range(0, data.size(0) - 1, bptt):
        x, y = data[i : i + bptt], data[i + 1 : i + 1 + bptt]
        out, state = model(x[: len(y)], y, state)
        band = band_of[y.reshape(-1).cpu()]
        nll.index_add_(0, band, -out.output.detach().double().cpu())
        tokens.index_add_(0, band, torch.ones(len(band), dtype=torch.float64))
    rows = []
    for j, (lo, hi) in enumerate(zip(edges[:-1], edges[1:])):
        n = float(tokens[j])
        rows.append(
            {
                "ranks": [lo, hi],
                "train_counts": [float(counts[hi - 1]), float(counts[lo])],
                "tokens": int(n),
                "token_share": n / float(tokens.sum()),
                "mean_nll": float(nll[j]) / n if n else None,
                "nll_share": float(nll[j] / nll.sum()),
                "ppl": math.exp(float(nll[j]) / n) if n else None,
            }
        )
    return rows


@torch.no_grad()
def generate(model: LSTMLM, corpus: Corpus, n: int, seed: int, temperature: float = 1.0) -> str:
    """``n`` words sampled from the model (the tree: ancestral sampling down the tree)."""
    model.eval()
    g = torch.Generator().manual_seed(seed)
    word = torch.tensor([[corpus.words.index("<eos>")]], device=next(model.parameters()).device)
    state, out = None, []
    for _ in range(n):
        h, state = model.hidden(word, state)
        h = h.reshape(-1, model.nhid)
        if hasattr(model.head, "sample"):
            w = model.head.sample(h, g, temperature)
        else:
            probs = torch.softmax(model.head.log_prob(h) / temperature, -1).cpu()  # g is a CPU generator
            w = torch.multinomial(probs, 1, generator=g)[:, 0]
        out.append(corpus.words[int(w)])
        word = w.view(1, 1).to(word.device)
    return " ".join(out)


def hidden_pairs(model: LSTMLM, data: torch.Tensor, bptt: int):
    """(hidden (T*B, nhid), next words (T*B,)) over ``data``, the model in eval mode: what
    :func:`hlbl.hidden_features` averages into each word's feature vector."""
    model.eval()
    state = None
    with torch.no_grad():
        for i in range(0, data.size(0) - 1, bptt):
            x, y = data[i : i + bptt], data[i + 1 : i + 1 + bptt]
            h, state = model.hidden(x[: len(y)], state)
            yield h.reshape(-1, model.nhid), y.reshape(-1)


def bootstrap_features(corpus: Corpus, train: torch.Tensor, args, log, kind: str) -> tuple[np.ndarray, dict]:
    """The bootstrap's first half, shared by every learned structure: a model with a Huffman tree
    (a hybrid softmax with a Huffman tail for ``kind`` hybrid; a full softmax for
    ``--tree-features embedding``) trained ``--bootstrap-epochs``, and its word features (V, d):
    the mean hidden state before each word, or the output embedding. With ``--bootstrap-from DIR``
    the model is instead the one trained in a checkpoint directory (another round of the bootstrap:
    features from a model trained to the end). Returns the features and what the model was."""
    if args.bootstrap_from:
        boot, boot_kind = trained_model(Path(args.bootstrap_from), corpus, args)
    else:
        boot_kind = "full" if args.tree_features == "embedding" else "hybrid-huffman" if kind == "hybrid" else "tree"
        torch.manual_seed(args.seed)
        boot = build_model(corpus, boot_kind, args)
        opt = make_optimizer(boot, args)
        for epoch in range(args.bootstrap_epochs):
            train_epoch(boot, train, args, args.lr, opt, log, epoch + 1, f"{kind} bootstrap ({boot_kind})")
    if args.tree_features == "embedding":
        X = hlbl.embedding_features(boot.head.decoder.weight)  # (V, nhid): the vector each word is scored by
    else:
        X, _ = hlbl.hidden_features(hidden_pairs(boot, train, args.bptt), len(corpus))
    info = {"bootstrap_output": boot_kind}
    if args.bootstrap_from:
        info["bootstrap_from"] = str(args.bootstrap_from)
    return X, info


def learn_tree(
    corpus: Corpus, train: torch.Tensor, args, log, kind: str = "learned-tree"
) -> tuple[hlbl.WordTree, dict]:
    """The bootstrap of a learned tree: the word features of :func:`bootstrap_features`, a tree
    learned from them (for the hybrid: over its tail words, from their features)."""
    t0 = time.perf_counter()
    X, info = bootstrap_features(corpus, train, args, log, kind)
    tree, stats = structure_from_features(X, corpus, args, kind)
    info |= {"bootstrap_s": time.perf_counter() - t0, "tree": stats}
    log(f"learned tree from {args.tree_features} features: {json.dumps(info['tree'])}")
    return tree, info


def structure_from_features(X: np.ndarray, corpus: Corpus, args, kind: str) -> tuple:
    """A learned kind's structure from word features ``X`` (V, d), and its stats: the tree of
    ``--tree-policy`` and ``--tree-copies`` (the hybrid's over its tail words, from their rows of
    ``X``), or ``--classes`` word classes by k-means with the ``--class-shortlist`` under the root."""
    if kind == "classes":
        C, S = num_classes(args, len(corpus)), args.class_shortlist
        classes = hlbl.kmeans_classes(X, C, seed=args.seed, counts=corpus.counts, shortlist=S)
        return classes, classes.stats(corpus.counts)
    counts = corpus.counts
    if kind == "hybrid":  # the tail tree's word i is tail word i
        tail = hlbl.hybrid_split(corpus.counts, min(args.head, len(corpus) - 2))[1]
        X, counts = X[tail], counts[tail]
    tree = hlbl.learn_tree(X, args.tree_policy, copies=args.tree_copies, seed=args.seed)
    return tree, tree.stats(counts)


def num_classes(args, vocab_size: int) -> int:
    """``--classes``, by default round(sqrt(V)): the usual size of a class-factored softmax, about
    2 sqrt(V) scores a token."""
    return args.classes if args.classes is not None else max(1, round(math.sqrt(vocab_size)))


def check_classes(args, vocab_size: int) -> None:
    """``--classes`` and ``--class-shortlist`` against the vocabulary, before any bootstrap trains:
    every class keeps a word and the root has two entries (what :func:`hlbl.kmeans_classes` asks)."""
    C, S, V = num_classes(args, vocab_size), args.class_shortlist, vocab_size
    if not (0 <= S <= V - 1 and 1 <= C <= V - S and S + C >= 2):
        raise SystemExit(
            f"--classes {C} --class-shortlist {S}: a vocabulary of {V} words takes a shortlist of 0..{V - 1} "
            f"and 1..{V} - shortlist classes, at least two root entries in all"
        )


def learn_classes(corpus: Corpus, train: torch.Tensor, args, log) -> tuple[hlbl.WordClasses, dict]:
    """The bootstrap of learned word classes: the word features of :func:`bootstrap_features`
    (a Huffman-tree model's hidden states), then k-means on them into ``--classes`` classes, the
    ``--class-shortlist`` most frequent words directly under the root (:func:`hlbl.kmeans_classes`)."""
    t0 = time.perf_counter()
    check_classes(args, len(corpus))
    X, info = bootstrap_features(corpus, train, args, log, "classes")
    classes, stats = structure_from_features(X, corpus, args, "classes")
    info |= {"bootstrap_s": time.perf_counter() - t0, "classes": stats}
    log(f"learned classes from {args.tree_features} features: {json.dumps(info['classes'])}")
    return classes, info


def structure_words(kind: str, vocab_size: int, head: int) -> int:
    """The words a learned kind's structure covers: the hybrid's tail tree those outside its head."""
    return vocab_size - min(head, vocab_size - 2) if kind == "hybrid" else vocab_size


def load_structure(path: Path, kind: str, words: int, name: str | None = None):
    """The learned tree (``tree.npz``) or word classes (``classes.json``; or the file ``name``)
    of a ``kind`` run saved in the run directory ``path``, over ``words`` words
    (:func:`structure_words`); a missing, damaged or foreign file, or one of another vocabulary,
    is a one-line error."""
    file = path / (name or STRUCTURE_FILES[kind])
    try:
        structure = (hlbl.WordClasses if kind == "classes" else hlbl.WordTree).load(file)
    except (hlbl.HlblError, OSError, ValueError) as e:
        msg = str(e).splitlines()[0]  # hlbl's errors name the file already
        raise SystemExit(msg if str(file) in msg else f"{file}: {msg}") from None
    if structure.num_words != words:
        what = "word classes" if kind == "classes" else "a tree"
        raise SystemExit(f"{file}: {what} over {structure.num_words} words, not this run's {words}")
    return structure


def trained_model(path: Path, corpus: Corpus, args) -> tuple[LSTMLM, str]:
    """The model of the best validation epoch saved in a ``--checkpoint`` run directory
    (``DIR/KIND``), and its kind; a directory of another model shape or corpus is a one-line error."""
    try:
        recipe = json.loads((path / "recipe.json").read_text())
        kind = recipe["output"]
    except (OSError, ValueError, KeyError) as e:
        raise SystemExit(f"{path}: not a run directory of this example's --checkpoint ({e})") from None
    want = {k: getattr(args, k) for k in ("emsize", "nhid", "nlayers")} | {"data": str(corpus.root)}
    if kind.startswith("hybrid"):  # the run's own head size
        args = argparse.Namespace(**{**vars(args), "head": recipe.get("head", args.head)})
    for k, v in want.items():
        if recipe.get(k) != v:
            raise SystemExit(f"{path}: a model with {k} = {recipe.get(k)!r}, not {v!r}")
    # hidden states come from any output layer's model; an output embedding only from a full softmax
    if kind not in OUTPUTS or (args.tree_features == "embedding" and kind != "full"):
        raise SystemExit(f"{path}: a model with a {kind} output; --tree-features embedding takes a full softmax model")
    try:
        tensors, meta = load_tensors_and_meta(path / "checkpoint.safetensors", CHECKPOINT_FORMAT)
        rebuilds = json.loads(meta["progress"]).get("rebuilds") or []
    except (OSError, ValueError, KeyError, hlbl.HlblError) as e:
        raise SystemExit(f"{path}: cannot load its model ({str(e).splitlines()[0]})") from None
    words = structure_words(kind, len(corpus), args.head)
    # a run of --rebuild-at saved its model on the structure of its last rebuild
    name = Checkpoint.rebuilt_name(kind, rebuilds[-1]["epoch"]) if rebuilds and kind in LEARNED else None
    structure = load_structure(path, kind, words, name) if kind in LEARNED else None
    try:
        model = build_model(corpus, "tree" if kind == "learned-tree" else kind, args, structure)
        model.load_state_dict(_part(tensors, "best.") or _part(tensors, "model."))
    except (OSError, ValueError, RuntimeError, hlbl.HlblError) as e:
        raise SystemExit(f"{path}: cannot load its model ({str(e).splitlines()[0]})") from None
    return model, kind


def build_model(corpus: Corpus, kind: str, args, structure=None) -> LSTMLM:
    """The model on ``--device`` (every output layer's buffers, the tree's included, move with it);
    ``structure``: a learned kind's tree or word classes."""
    head = make_head(kind, args.nhid, corpus, args, structure)
    return LSTMLM(len(corpus), head, args.emsize, args.nhid, args.nlayers, args.dropout).to(args.device)


def learned_structure(corpus: Corpus, kind: str, train: torch.Tensor, args, ckpt, log) -> tuple:
    """A learned kind's tree or word classes and its bootstrap's figures: the ones ``ckpt`` saved,
    else learned now (and saved there); written also to ``--save-tree`` or ``--save-classes``."""
    structure, info = ckpt.structure() if ckpt else (None, {})
    if structure is None:
        learn = learn_classes if kind == "classes" else partial(learn_tree, kind=kind)
        structure, info = learn(corpus, train, args, log)
        if ckpt:
            ckpt.save_structure(structure, info)
    save_copy(kind, structure, args)
    return structure, info


def save_copy(kind: str, structure, args) -> None:
    """A learned structure written to ``--save-tree`` or ``--save-classes`` when given."""
    if kind == "classes" and args.save_classes:
        structure.save(args.save_classes)  # JSON; hlbl.WordClasses.load reads it back
    elif kind != "classes" and args.save_tree:
        structure.save(args.save_tree)  # .json or .npz; hlbl.WordTree.load reads it back


def rebuild_head(
    model: LSTMLM, corpus: Corpus, kind: str, train: torch.Tensor, args, progress: dict, ckpt, log
) -> tuple:
    """``--rebuild-at``: the learned tree (or classes) learned again, within the run, from the
    mean hidden state before each word of ``model`` as trained so far (the bootstrap's features,
    from this model instead of a separate one), and a fresh output layer on it. What carries over
    is everything below the output layer: the embedding and the LSTM. The node vectors of the
    old tree do not (its nodes split other word sets); the new layer starts as a fresh one does
    (``--tree-init``; a tree's default: zero node vectors and unigram biases, so the LSTM sees no
    gradient from it until its nodes have learned). The best validation figure starts again too: the run tests
    the best epoch of its last structure. Returns the optimiser over the new parameters (plain
    SGD has no state; Adam's moments restart) and the structure."""
    t0 = time.perf_counter()
    X, _ = hlbl.hidden_features(hidden_pairs(model, train, args.bptt), len(corpus))
    structure, stats = structure_from_features(X, corpus, args, kind)
    model.head = make_head("tree" if kind == "learned-tree" else kind, args.nhid, corpus, args, structure)
    model.head.to(args.device)
    epoch = len(progress["epochs"])
    if ckpt:  # before the checkpoint that holds a model on it (a run stopped in between rebuilds again)
        ckpt.save_rebuilt(structure, epoch)
    progress["rebuilds"].append({"epoch": epoch, "seconds": time.perf_counter() - t0, "structure": stats})
    progress["best"] = math.inf
    log(f"{kind}: structure learned again after epoch {epoch} from this model's hidden states: {json.dumps(stats)}")
    return structure, make_optimizer(model, args)


def run(corpus: Corpus, kind: str, args, log=print) -> dict:
    """Train ``kind`` for ``args.epochs`` (lr divided by 4 after an epoch without a validation
    gain, as the recipe; stopped early once it falls below ``--stop-lr``), test the model of the
    best validation epoch exactly; the result as a dict. A learned kind's structure is learned
    again from the model's own hidden states after each epoch of ``--rebuild-at``
    (:func:`rebuild_head`). With ``--checkpoint`` the run goes on from the last epoch saved there."""
    batches = {
        s: batchify(corpus.splits[s], args.batch_size if s == "train" else 10).to(args.device) for s in corpus.splits
    }
    if kind == "classes":
        check_classes(args, len(corpus))  # before the checkpoint's recipe is written
    ckpt = Checkpoint(args.checkpoint, kind, args, corpus) if args.checkpoint else None
    structure, info = (
        learned_structure(corpus, kind, batches["train"], args, ckpt, log) if kind in LEARNED else (None, {})
    )
    saved = ckpt.read() if ckpt else None
    progress = saved[1] if saved else {"lr": args.lr, "best": math.inf, "epochs": []}
    progress.setdefault("rebuilds", [])
    if progress["rebuilds"]:  # the model was saved on the structure of its last rebuild
        structure = ckpt.rebuilt_structure(progress["rebuilds"][-1]["epoch"])
    torch.manual_seed(args.seed)
    model = build_model(corpus, "tree" if kind == "learned-tree" else kind, args, structure)
    opt = make_optimizer(model, args)
    best_state = None
    if saved:
        best_state = ckpt.restore(saved, model, opt)
        log(f"{kind}: resumed from {ckpt.dir} after epoch {len(progress['epochs'])} (lr {progress['lr']:.4g})")
    # an epoch without a validation gain divides lr by 4; the schedule has run out below --stop-lr
    while len(progress["epochs"]) < args.epochs and progress["lr"] >= args.stop_lr:
        done = len(progress["epochs"])
        if kind in LEARNED and done in args.rebuild_at and done not in [r["epoch"] for r in progress["rebuilds"]]:
            structure, opt = rebuild_head(model, corpus, kind, batches["train"], args, progress, ckpt, log)
            best_state = None
            save_copy(kind, structure, args)  # the structure the tested model will have
        epoch = done + 1
        stats = train_epoch(model, batches["train"], args, progress["lr"], opt, log, epoch, kind)
        stats["valid_ppl"] = evaluate(model, batches["valid"], args.bptt)
        stats["lr"] = progress["lr"]
        log(f"{kind} epoch {epoch}: " + ", ".join(f"{k} {v:.4g}" for k, v in stats.items()))
        progress["epochs"].append(stats)
        if stats["valid_ppl"] < progress["best"]:
            progress["best"] = stats["valid_ppl"]
            best_state = {k: v.clone() for k, v in model.state_dict().items()}
        else:
            progress["lr"] /= 4.0
        if ckpt:
            ckpt.save(model, opt, best_state, progress)
    epochs = progress["epochs"]
    if best_state is not None:  # the recipe tests the model of the best validation epoch
        model.load_state_dict(best_state)
    valid = [e["valid_ppl"] for e in epochs]
    result = {
        "output": kind,
        "valid_ppl": min(valid),
        "best_epoch": 1 + valid.index(min(valid)),
        "test_ppl": evaluate(model, batches["test"], args.bptt),
        "s_per_epoch": float(np.mean([e["seconds"] for e in epochs])),
        "tokens_per_s": float(np.mean([e["tokens_per_s"] for e in epochs])),
        "epochs": epochs,
        **info,
    }
    if progress["rebuilds"]:
        result["rebuilds"] = progress["rebuilds"]
    result["test_bands"] = band_losses(model, batches["test"], args.bptt, corpus.counts, args.bands)
    if args.generate:
        result["sample"] = generate(model, corpus, args.generate, args.seed)
    return result


def bands_of(corpus: Corpus, dirs: list[Path], args) -> list[dict]:
    """``--bands-of``: the test loss per band (:func:`band_losses`) of the best model of each
    ``--checkpoint`` run directory (``DIR/KIND``), with its test perplexity."""
    test = batchify(corpus.splits["test"], 10).to(args.device)
    out = []
    for path in dirs:
        model, kind = trained_model(path, corpus, args)
        out.append(
            {
                "output": kind,
                "run": str(path),
                "test_ppl": evaluate(model, test, args.bptt),
                "test_bands": band_losses(model, test, args.bptt, corpus.counts, args.bands),
            }
        )
    return out


# ---- checkpoints ------------------------------------------------------------------------------

CHECKPOINT_FORMAT = "hlbl-lstm-lm-checkpoint"  # hlbl.checkpoint adds the version and a checksum
RECIPE = ("emsize", "nhid", "nlayers", "dropout", "bptt", "batch_size", "optimizer", "lr", "clip", "cutoffs",
          "samples", "tree_init", "tree_features", "tree_policy", "tree_copies", "bootstrap_epochs", "bootstrap_from",
          "seed", "max_steps")  # fmt: skip


class Checkpoint:
    """``--checkpoint DIR``: one directory per output layer, ``DIR/KIND/``, so that a long run
    survives being stopped. ``recipe.json`` (written first) names the settings the run was started
    with; ``tree.npz`` (learned trees) or ``classes.json`` (learned word classes) is written once
    the bootstrap ends; ``checkpoint.safetensors``
    is replaced, atomically, after every epoch and holds everything the next epoch depends on: the
    model, its best validation epoch's weights, the optimiser's state, the random generator (the
    dropout masks) and, in its metadata, the epochs so far. Started again with the same ``DIR`` and
    settings, a run goes on after its last whole epoch, bit for bit as if it had not stopped (same
    device and threads); ``--epochs`` may grow. Another recipe, or a damaged file, is a one-line
    error."""

    def __init__(self, root: Path, kind: str, args, corpus: Corpus):
        self.dir, self.kind = Path(root) / kind, kind
        self.recipe = {k: getattr(args, k) for k in RECIPE} | {"output": kind, "data": str(corpus.root)}
        if kind.startswith("hybrid"):  # only there: older run directories have no such key
            self.recipe["head"] = args.head
        if args.rebuild_at and kind in LEARNED:  # likewise
            self.recipe["rebuild_at"] = list(args.rebuild_at)
        if kind == "classes":  # the number resolved (its default depends on the corpus)
            self.recipe |= {"classes": num_classes(args, len(corpus)), "class_shortlist": args.class_shortlist}
            self.recipe |= {"class_dim": args.class_dim} if args.class_dim is not None else {}
        self.words = structure_words(kind, len(corpus), args.head) if kind in LEARNED else None
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / "recipe.json"
        if not path.exists():
            write_text(path, json.dumps(self.recipe, indent=1) + "\n")
        else:
            try:
                before = json.loads(path.read_text())
            except (OSError, ValueError) as e:
                raise SystemExit(f"{path}: not a checkpoint recipe ({e})") from None
            changed = sorted(k for k in self.recipe.keys() | before.keys() if before.get(k) != self.recipe.get(k))
            if changed:
                k = changed[0]
                raise SystemExit(
                    f"{self.dir} holds a run with {k} = {before.get(k)!r}, not {self.recipe.get(k)!r}: "
                    "give another --checkpoint directory, or the same settings to resume"
                )

    def structure(self) -> tuple[hlbl.WordTree | hlbl.WordClasses | None, dict]:
        """The learned tree or word classes and its bootstrap's figures, once saved (else None, {})."""
        info = self.dir / "bootstrap.json"
        if not info.exists():  # written after the structure: the commit point of the pair
            return None, {}
        structure = load_structure(self.dir, self.kind, self.words)
        try:
            return structure, json.loads(info.read_text())
        except (OSError, ValueError) as e:
            raise SystemExit(f"{info}: {e}") from None

    def save_structure(self, structure: hlbl.WordTree | hlbl.WordClasses, info: dict) -> None:
        structure.save(self.dir / STRUCTURE_FILES[self.kind])  # atomic, as bootstrap.json after it
        write_text(self.dir / "bootstrap.json", json.dumps(info, indent=1) + "\n")

    def save(self, model: nn.Module, opt: torch.optim.Optimizer, best_state: dict | None, progress: dict) -> None:
        """The state after a whole epoch (``progress``: the epochs' figures, the lr, the best)."""
        tensors = {f"model.{k}": v for k, v in model.state_dict().items()}
        tensors |= {f"best.{k}": v for k, v in (best_state or {}).items()}
        opt_tensors, opt_meta = optimizer_tensors(opt)  # hlbl's own split of an optimiser state
        tensors |= {f"optim.{k}": v for k, v in opt_tensors.items()}
        tensors["rng.cpu"] = torch.get_rng_state()
        if torch.cuda.is_available() and any(t.is_cuda for t in tensors.values()):
            tensors["rng.cuda"] = torch.cuda.get_rng_state()
        meta = {"progress": json.dumps(progress), "optim": json.dumps(opt_meta)}
        save_tensors(
            self.dir / "checkpoint.safetensors", tensors, kind=CHECKPOINT_FORMAT, meta=meta
        )  # atomic, checksummed

    @staticmethod
    def rebuilt_name(kind: str, epoch: int) -> str:
        """``tree-eN.npz`` or ``classes-eN.json``: the structure learned again after epoch N."""
        return STRUCTURE_FILES[kind].replace(".", f"-e{epoch}.", 1)

    def rebuilt_file(self, epoch: int) -> Path:
        return self.dir / self.rebuilt_name(self.kind, epoch)

    def save_rebuilt(self, structure: hlbl.WordTree | hlbl.WordClasses, epoch: int) -> None:
        """The structure learned again after ``epoch`` (``--rebuild-at``), as ``tree-eN.npz`` or
        ``classes-eN.json``; never replaced, so an older checkpoint still finds its own."""
        structure.save(self.rebuilt_file(epoch))

    def rebuilt_structure(self, epoch: int) -> hlbl.WordTree | hlbl.WordClasses:
        file = self.rebuilt_file(epoch)
        return load_structure(file.parent, self.kind, self.words, file.name)

    def read(self) -> tuple[dict[str, torch.Tensor], dict, dict] | None:
        """The last saved epoch: ``(tensors, progress, optimiser metadata)``, or None when no
        epoch was saved yet; :meth:`restore` puts it into a model built on the right structure."""
        path = self.dir / "checkpoint.safetensors"
        if not path.exists():
            return None
        try:
            tensors, meta = load_tensors_and_meta(path, CHECKPOINT_FORMAT)  # format, version and checksum checked
            return tensors, json.loads(meta["progress"]), json.loads(meta["optim"])
        except (OSError, ValueError, KeyError, hlbl.HlblError) as e:
            raise SystemExit(f"{path}: cannot resume from it ({str(e).splitlines()[0]})") from None

    def restore(self, saved: tuple, model: nn.Module, opt: torch.optim.Optimizer) -> dict | None:
        """Restore :meth:`read`'s epoch into ``model`` and ``opt`` (and the random generator);
        returns the best weights (None when none were saved)."""
        tensors, _, optim = saved
        try:
            model.load_state_dict(_part(tensors, "model."))
            restore_optimizer(opt, _part(tensors, "optim."), optim)
        except (ValueError, KeyError, RuntimeError, hlbl.HlblError) as e:
            path = self.dir / "checkpoint.safetensors"
            raise SystemExit(f"{path}: cannot resume from it ({str(e).splitlines()[0]})") from None
        torch.set_rng_state(tensors["rng.cpu"])
        if "rng.cuda" in tensors and torch.cuda.is_available():
            torch.cuda.set_rng_state(tensors["rng.cuda"])
        best = _part(tensors, "best.")
        return {k: v.to(next(model.parameters()).device) for k, v in best.items()} or None


def _part(tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The tensors of a checkpoint saved under ``prefix`` (``model.``, ``best.``, ``optim.``), prefix removed."""
    return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}


def synthetic_corpus(root: Path, seed: int = 0) -> Path:
    """A small corpus with structure (a toy grammar over ~60 words) for --quick."""
    rng = np.random.default_rng(seed)
    nouns, verbs, adjs = [f"n{i}" for i in range(25)], [f"v{i}" for i in range(15)], [f"a{i}" for i in range(15)]

    def sentence():
        return " ".join(["the", rng.choice(adjs), rng.choice(nouns), rng.choice(verbs), "a", rng.choice(nouns)])

    root.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", 1500), ("valid", 100), ("test", 100)):
        (root / f"{split}.txt").write_text("\n".join(sentence() for _ in range(n)) + "\n", encoding="utf-8")
    return root


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="ptb", help="ptb, or a directory of train/valid/test text")
    p.add_argument("--output", default="tree", help=f"comma-separated: {', '.join(OUTPUTS)}")
    p.add_argument("--emsize", type=int, default=200)
    p.add_argument("--nhid", type=int, default=200)
    p.add_argument("--nlayers", type=int, default=2)
    p.add_argument("--dropout", type=float, default=0.2)
    p.add_argument("--bptt", type=int, default=35)
    p.add_argument("--batch-size", type=int, default=20)
    p.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd", help="sgd: the recipe's plain SGD")
    p.add_argument("--lr", type=float, help="learning rate (default 20 for sgd, 0.001 for adam)")
    p.add_argument("--clip", type=float, default=0.25)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument(
        "--stop-lr", type=float, default=0.0, help="stop once the annealed learning rate falls below this (0: never)"
    )
    p.add_argument("--max-steps", type=int, default=0, help="stop each epoch after this many steps (0: none)")
    p.add_argument("--cutoffs", type=lambda s: [int(c) for c in s.split(",")], default=[2000, 5000])
    p.add_argument("--samples", type=int, default=100, help="noise words of the sampled softmax")
    p.add_argument("--head", type=int, default=2000, help="hybrid: the most frequent words in its flat softmax")
    p.add_argument(
        "--tree-init",
        choices=("scaled", "unigram", "frozen", "uniform", "zero"),
        default="scaled",
        help="scaled: unigram biases and per-node gradient scaling (the recipe that trains well); unigram: "
        "unigram biases only; frozen: unigram biases kept fixed; uniform: +-0.1 node vectors; zero: the layer as "
        "constructed",
    )
    p.add_argument("--tree-features", choices=("hidden", "embedding"), default="hidden")
    p.add_argument("--tree-policy", default="adaptive:0.25")
    p.add_argument("--tree-copies", type=int, default=1)
    p.add_argument("--bootstrap-epochs", type=int, default=1)
    p.add_argument(
        "--bootstrap-from",
        help="learn the tree from the model of this --checkpoint run directory (DIR/KIND) instead of training one",
    )
    p.add_argument(
        "--rebuild-at",
        type=lambda s: sorted({int(c) for c in s.split(",") if c}),
        default=[],
        metavar="EPOCHS",
        help="learned-tree, hybrid, classes: learn the structure again from the model's own hidden states after "
        "these epochs (comma-separated, e.g. 2,4), within one run; the output layer starts afresh on it",
    )
    p.add_argument("--save-tree", type=Path, help="write the learned tree here (.json or .npz)")
    p.add_argument(
        "--classes", type=int, help="classes: the number of word classes (default round(sqrt(V)), 100 on PTB)"
    )
    p.add_argument(
        "--class-shortlist",
        type=int,
        default=0,
        help="classes: the most frequent words directly under the root (2000: the adaptive softmax's head)",
    )
    p.add_argument(
        "--class-dim",
        type=int,
        help="classes: the class members' vector size, reading a learned projection of the hidden state "
        "(default: the hidden size, no projection; nhid / 4 as the adaptive softmax's second cluster)",
    )
    p.add_argument("--save-classes", type=Path, help="classes: write the learned word classes here (JSON)")
    p.add_argument("--generate", type=int, default=0, help="sample this many words after training")
    p.add_argument(
        "--bands",
        type=lambda s: [int(c) for c in s.split(",")],
        default=[2000, 5000],
        help="rank edges of the frequency bands of the test loss per band (the head, then the tail's bands)",
    )
    p.add_argument(
        "--bands-of",
        type=lambda s: [Path(c) for c in s.split(",")],
        help="only the test loss per band of these --checkpoint run directories (DIR/KIND, comma-separated)",
    )
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, ... (auto: cuda when there is one)")
    p.add_argument("--seed", type=int, default=1111)
    p.add_argument("--log-every", type=int, default=20, help="gradient norms every this many steps")
    p.add_argument(
        "--log-interval",
        type=int,
        help="print progress (batches, lr, ms/batch, loss, ppl) every this many batches of an epoch, on stderr "
        "(default 200; 20 with --quick; 0: only at each epoch's end)",
    )
    p.add_argument("--json", type=Path, help="write the results here")
    p.add_argument(
        "--checkpoint", type=Path, help="save every epoch under this directory; started again, a run goes on there"
    )
    p.add_argument("--quick", action="store_true", help="every output on a synthetic corpus, a tiny model")
    return p


def parse_args(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        args.device = torch.device(args.device)
    except RuntimeError as e:
        p.error(f"--device: {e}")
    if args.device.type == "cuda" and not torch.cuda.is_available():
        p.error(f"--device {args.device}: this PyTorch sees no CUDA device")
    if args.lr is None:
        args.lr = 0.001 if args.optimizer == "adam" else 20.0
    if args.epochs < 1 or args.stop_lr > args.lr:
        p.error(f"--epochs {args.epochs} --lr {args.lr} --stop-lr {args.stop_lr}: train at least one epoch")
    args.output = args.output.split(",")
    bad = [k for k in args.output if k not in OUTPUTS]
    if bad:
        p.error(f"unknown output {bad[0]!r}; choose from {', '.join(OUTPUTS)}")
    if args.log_interval is None:
        args.log_interval = 20 if args.quick else 200
    if args.log_interval < 0:
        p.error(f"--log-interval must be 0 or more, got {args.log_interval}")
    if any(e < 1 for e in args.rebuild_at):
        p.error(f"--rebuild-at {','.join(map(str, args.rebuild_at))}: epochs count from 1")
    if args.class_dim is not None and not 1 <= args.class_dim <= args.nhid:
        p.error(f"--class-dim {args.class_dim}: choose 1..{args.nhid} (--nhid)")
    if (args.classes is not None and args.classes < 1) or args.class_shortlist < 0:
        p.error(
            f"--classes {args.classes} --class-shortlist {args.class_shortlist}: at least 1 class, a shortlist >= 0"
        )
    if args.quick:
        args.emsize, args.nhid, args.nlayers, args.bptt, args.log_every = 16, 16, 1, 10, 5
        args.output, args.generate, args.cutoffs, args.samples, args.head = list(OUTPUTS), 8, [10, 30], 10, 10
        args.bands = [10, 30]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.rebuild_at and not set(args.output) & set(LEARNED):
        raise SystemExit(f"--rebuild-at relearns a learned structure: give an --output of {', '.join(LEARNED)}")
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        data = synthetic_corpus(Path(tmp) / "toy") if args.quick else args.data
        corpus = Corpus(data)
        if args.bands_of:
            results = bands_of(corpus, args.bands_of, args)
            print(json.dumps(results, indent=1))
            if args.json:
                args.json.write_text(json.dumps(results, indent=1))
            return 0
        results = [run(corpus, kind, args, log=lambda m: print(m, file=sys.stderr)) for kind in args.output]
    for r in results:
        print(
            f"{r['output']:>12}: valid {r['valid_ppl']:.1f} test {r['test_ppl']:.1f} ({r['s_per_epoch']:.1f} s/epoch)"
        )
        if "sample" in r:
            print(f"{'':>12}  {r['sample']}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
