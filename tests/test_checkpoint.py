import json

import numpy as np
import pytest
import torch

from conftest import multi_code_tree, tiny_corpus, toy_record
from hlbl import checkpoint as ckpt
from hlbl import run as hrun
from hlbl.data import load_corpus
from hlbl.model import LBL, LBLConfig
from hlbl.config import TrainConfig
from hlbl.run import fit


@pytest.fixture
def run(tmp_path):
    corpus = load_corpus(tiny_corpus(tmp_path / "corpus"))
    V = len(corpus.vocab)
    from hlbl.tree import huffman_tree

    model = LBL(LBLConfig(V, dim=8, context=3), huffman_tree(corpus.vocab.counts), torch.Generator().manual_seed(0))
    model.init_unigram(corpus.vocab.counts)
    fit(model, corpus, TrainConfig(batch_size=64, max_epochs=2, progress=False), tmp_path / "run", log=lambda *a: None)
    return model, corpus, tmp_path / "run"


def test_save_load_gives_identical_log_probs_and_tree(run):
    model, corpus, run_dir = run
    loaded, vocab, info = hrun.load_model(run_dir)
    assert vocab == corpus.vocab
    assert np.array_equal(loaded.tree.children, model.tree.children)
    ctx = torch.randint(0, len(vocab), (20, 3))
    assert torch.equal(loaded.log_prob(ctx), model.log_prob(ctx))
    assert info.model.dim == 8


def test_files_are_safetensors_and_json(run):
    _, _, run_dir = run
    names = sorted(p.name for p in run_dir.iterdir())
    assert names == [
        "best.safetensors",
        "checkpoints",
        "last.safetensors",
        "metrics.jsonl",
        "run.json",
        "state.json",
        "tree.json",
        "vocab.json",
    ]
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["epoch-000002"]  # the older one removed
    assert sorted(p.name for p in (run_dir / "checkpoints" / "epoch-000002").iterdir()) == [
        "best.safetensors",
        "last.safetensors",
        "metrics.jsonl",
        "optimizer.safetensors",
        "state.json",
    ]
    assert not list(run_dir.rglob("*.tmp"))
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["epoch"] for x in lines] == [1, 2]
    assert {"train_loss", "valid_ppl", "words_per_sec", "lr", "elapsed_s"} <= set(lines[0])


def test_truncated_checkpoint_gives_a_clear_error(run):
    _, _, run_dir = run
    data = (run_dir / "best.safetensors").read_bytes()
    (run_dir / "best.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ckpt.CheckpointError, match="damaged or truncated"):
        hrun.load_model(run_dir)


def test_foreign_files_are_refused(run, tmp_path):
    _, _, run_dir = run
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(2)}, str(run_dir / "best.safetensors"))
    with pytest.raises(ckpt.CheckpointError, match="not an hlbl checkpoint"):
        hrun.load_model(run_dir)
    (run_dir / "run.json").write_text('{"format": "something-else"}')
    with pytest.raises(ckpt.CheckpointError, match="not an hlbl run"):
        hrun.load_model(run_dir)
    (run_dir / "run.json").write_text('{"format": ')
    with pytest.raises(ckpt.CheckpointError, match="damaged"):
        hrun.load_model(run_dir)
    with pytest.raises(ckpt.CheckpointError, match="not a run directory"):
        hrun.load_model(tmp_path / "nothing")


def test_every_json_file_names_its_format_and_version(run):
    _, _, run_dir = run
    formats = {
        name: json.loads((run_dir / name).read_text()) for name in ("run.json", "vocab.json", "state.json", "tree.json")
    }
    assert {k: (v["format"], v["version"]) for k, v in formats.items()} == {
        "run.json": ("hlbl-run", 2),
        "vocab.json": ("hlbl-vocab", 1),
        "state.json": ("hlbl-train-state", 1),
        "tree.json": ("hlbl-word-tree", 1),
    }


def test_foreign_or_damaged_vocab_and_state_are_refused(run):
    model, corpus, run_dir = run
    vocab = json.loads((run_dir / "vocab.json").read_text())
    (run_dir / "vocab.json").write_text(json.dumps({**vocab, "format": "something-else"}))
    with pytest.raises(ckpt.CheckpointError, match="vocab.json: not an hlbl vocabulary"):
        hrun.load_model(run_dir)
    (run_dir / "vocab.json").write_text(json.dumps({**vocab, "version": 99}))
    with pytest.raises(ckpt.CheckpointError, match="version 99"):
        hrun.load_model(run_dir)
    (run_dir / "vocab.json").write_text(json.dumps({**vocab, "words": 5}))
    with pytest.raises(ckpt.CheckpointError, match="vocab.json: malformed vocabulary"):
        hrun.load_model(run_dir)
    (run_dir / "vocab.json").write_text(json.dumps({"words": vocab["words"], "counts": vocab["counts"]}))
    with pytest.raises(ckpt.CheckpointError, match="vocab.json: not an hlbl vocabulary"):
        hrun.load_model(run_dir)
    (run_dir / "vocab.json").write_text(json.dumps(vocab))
    assert hrun.load_model(run_dir)[1] == corpus.vocab

    state_path = run_dir / "checkpoints" / "epoch-000002" / "state.json"  # what a resume reads
    state = json.loads(state_path.read_text())
    del state["optimizer"]
    state_path.write_text(json.dumps(state))
    with pytest.raises(ckpt.CheckpointError, match="damaged training state"):
        fit(
            model,
            corpus,
            TrainConfig(batch_size=64, max_epochs=3, progress=False),
            run_dir,
            resume=True,
            log=lambda *a: None,
        )
    (run_dir / "state.json").write_text(json.dumps({**state, "format": "hlbl-run"}))
    with pytest.raises(ckpt.CheckpointError, match="not an hlbl training state"):
        ckpt.read_state(run_dir / "state.json")


def test_shape_mismatch_is_reported(tmp_path):
    m = LBL(LBLConfig(6, dim=4), multi_code_tree())
    ckpt.save_weights(tmp_path / "w.safetensors", m)
    other = LBL(LBLConfig(6, dim=5), multi_code_tree())
    with pytest.raises(ckpt.CheckpointError, match="shape"):
        ckpt.load_weights(tmp_path / "w.safetensors", other)


def test_an_inconsistent_run_directory_is_refused(run):
    model, corpus, run_dir = run
    from hlbl.tree import random_tree

    V = len(corpus.vocab)
    random_tree(V, seed=123).save(run_dir / "tree.json")  # same size, another tree
    with pytest.raises(ckpt.CheckpointError, match="another word tree"):
        hrun.load_model(run_dir)
    random_tree(V + 1, seed=0).save(run_dir / "tree.json")
    with pytest.raises(ckpt.CheckpointError, match="tree has"):
        hrun.load_model(run_dir)
    model.tree.save(run_dir / "tree.json")
    vocab = json.loads((run_dir / "vocab.json").read_text())
    short = {
        **vocab,
        "words": vocab["words"][:3] + vocab["words"][4:],
        "counts": vocab["counts"][:3] + vocab["counts"][4:],
    }
    (run_dir / "vocab.json").write_text(json.dumps(short))
    with pytest.raises(ckpt.CheckpointError, match="words, the model"):
        hrun.load_model(run_dir)
    (run_dir / "vocab.json").write_text(json.dumps(vocab))
    info = json.loads((run_dir / "run.json").read_text())
    info["model"]["output"] = "mystery"
    (run_dir / "run.json").write_text(json.dumps(info))
    with pytest.raises(ckpt.CheckpointError):
        hrun.load_model(run_dir)


def test_files_get_the_permissions_of_a_plain_open(run):
    import os

    _, _, run_dir = run
    mask = os.umask(0)
    os.umask(mask)
    for name in (
        "run.json",
        "vocab.json",
        "tree.json",
        "state.json",
        "best.safetensors",
        "checkpoints/epoch-000002/optimizer.safetensors",
        "checkpoints/epoch-000002/state.json",
    ):
        assert (run_dir / name).stat().st_mode & 0o777 == 0o666 & ~mask, name


def test_non_finite_weights_are_refused(run):
    _, _, run_dir = run
    state = ckpt.load_tensors(run_dir / "best.safetensors")
    name = next(k for k, v in state.items() if v.is_floating_point())
    state[name].view(-1)[0] = float("nan")
    ckpt.save_tensors(run_dir / "best.safetensors", state)
    with pytest.raises(ckpt.CheckpointError, match="NaN or infinite"):
        hrun.load_model(run_dir)


def test_weights_of_another_dtype_are_refused(run):
    # float64 1e300 is finite, and would load as float32 inf through a silent cast.
    _, _, run_dir = run
    state = ckpt.load_tensors(run_dir / "best.safetensors")
    name = next(k for k, v in state.items() if v.is_floating_point())
    state[name] = state[name].double()
    state[name].view(-1)[0] = 1e300
    ckpt.save_tensors(run_dir / "best.safetensors", state)
    with pytest.raises(ckpt.CheckpointError, match="float64, the model's torch.float32"):
        hrun.load_model(run_dir)


@pytest.mark.parametrize("optimizer_state", [{}, None, {"scalars": [1], "param_groups": []}])
def test_a_damaged_optimizer_state_is_a_checkpoint_error(run, optimizer_state):
    model, corpus, run_dir = run
    path = run_dir / "checkpoints" / "epoch-000002" / "state.json"
    state = json.loads(path.read_text())
    state["optimizer"] = optimizer_state
    path.write_text(json.dumps(state))
    with pytest.raises(ckpt.CheckpointError):
        fit(
            model,
            corpus,
            TrainConfig(batch_size=64, max_epochs=3, progress=False),
            run_dir,
            resume=True,
            log=lambda *a: None,
        )


def test_a_deeply_nested_json_file_is_a_checkpoint_error(run):
    _, _, run_dir = run
    (run_dir / "run.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ckpt.CheckpointError, match="damaged"):
        hrun.load_model(run_dir)


def test_a_flipped_data_byte_is_detected(run):
    _, _, run_dir = run
    path = run_dir / "best.safetensors"
    data = bytearray(path.read_bytes())
    data[-100] ^= 0x01  # in the tensor data, past the JSON header: a number changes slightly
    path.write_bytes(bytes(data))
    with pytest.raises(ckpt.CheckpointError, match="checksum"):
        hrun.load_model(run_dir)


@pytest.mark.parametrize("variant", ["tree", "multi_code_full_context", "flat", "adaptive"])
def test_a_model_saved_from_memory_loads_with_identical_log_probs(tmp_path, variant):
    from hlbl.data import Vocab

    tree = multi_code_tree() if variant not in ("flat", "adaptive") else None
    V = 6
    vocab = Vocab(("<eos>", "<unk>", "a", "b", "c", "d"), (3, 0, 2, 2, 1, 1))
    config = LBLConfig(
        V,
        dim=5,
        context=2,
        output=variant if tree is None else "tree",
        full_context=variant == "multi_code_full_context",
    )
    model = LBL(config, tree, torch.Generator().manual_seed(3))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    run_dir = tmp_path / "run"
    hrun.save_run_files(run_dir, model, vocab, toy_record(model.config))
    ckpt.save_weights(run_dir / "best.safetensors", model)
    loaded, _, _ = hrun.load_model(run_dir)
    ctx = torch.randint(0, V, (30, 2), generator=torch.Generator().manual_seed(1))
    assert torch.equal(loaded.log_prob(ctx), model.log_prob(ctx))


@pytest.mark.parametrize("field,value", [("dim", 8.0), ("context", "3"), ("vocab_size", True), ("full_context", 1)])
def test_model_config_with_wrong_types_is_refused(run, field, value):
    """A hand-edited run.json ("dim": 8.0) is a clear error, not a traceback from torch.empty."""
    _, _, run_dir = run
    info = json.loads((run_dir / "run.json").read_text())
    info["model"][field] = value
    (run_dir / "run.json").write_text(json.dumps(info))
    with pytest.raises(ckpt.CheckpointError, match=f"run.json: .*{field}"):
        hrun.load_model(run_dir)


def test_a_fixed_seed_gives_byte_identical_checkpoint_files(run, tmp_path):
    # safetensors orders its metadata from a hash map that changes between saves; we sort it.
    model, corpus, run_dir = run
    again = LBL(model.config, model.tree, torch.Generator().manual_seed(0))
    again.init_unigram(corpus.vocab.counts)
    fit(
        again, corpus, TrainConfig(batch_size=64, max_epochs=2, progress=False), tmp_path / "again", log=lambda *a: None
    )
    for name in (
        "best.safetensors",
        "last.safetensors",
        "checkpoints/epoch-000002/optimizer.safetensors",
        "tree.json",
        "vocab.json",
    ):
        assert (run_dir / name).read_bytes() == (tmp_path / "again" / name).read_bytes(), name
    for i in range(4):  # several saves in one process, each with a freshly seeded hash map
        ckpt.save_weights(tmp_path / f"w{i}.safetensors", model, epoch=2)
    files = {(tmp_path / f"w{i}.safetensors").read_bytes() for i in range(4)}
    assert len(files) == 1
    data = files.pop()
    header = json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")])
    assert list(header["__metadata__"]) == sorted(header["__metadata__"])


def test_files_read_in_many_pieces_load_exactly(tmp_path, monkeypatch):
    # Pieces of 40 bytes: every tensor below spans several, and rows never straddle two.
    monkeypatch.setattr(ckpt, "PIECE_BYTES", 40)
    g = torch.Generator().manual_seed(0)
    tensors = {
        "matrix": torch.randn(37, 3, generator=g),
        "vector": torch.randn(101, generator=g, dtype=torch.float64),
        "scalar": torch.tensor(2.5),
        "empty": torch.empty(0, 4),
        "ids": torch.arange(-50, 50),
        "half": torch.randn(9, 5, generator=g).to(torch.bfloat16),
        "wide": torch.randn(2, 50, generator=g),  # a row wider than a piece: one row a piece
    }
    ckpt.save_tensors(tmp_path / "t.safetensors", tensors)
    loaded, meta = ckpt.load_tensors_and_meta(tmp_path / "t.safetensors")
    assert sorted(loaded) == sorted(tensors)
    for k, v in tensors.items():
        assert loaded[k].dtype == v.dtype and torch.equal(loaded[k], v), k


def test_load_weights_in_pieces_gives_identical_log_probs(run, monkeypatch):
    model, corpus, run_dir = run
    monkeypatch.setattr(ckpt, "PIECE_BYTES", 100)
    fresh = LBL(model.config, model.tree, torch.Generator().manual_seed(5))
    ckpt.load_weights(run_dir / "best.safetensors", fresh, vocab=corpus.vocab)
    ctx = torch.randint(0, len(corpus.vocab), (20, 3))
    assert torch.equal(fresh.log_prob(ctx), hrun.load_model(run_dir)[0].log_prob(ctx))


def test_a_damaged_file_leaves_the_model_as_it_was(run):
    # The checks read the whole file before any weight is copied: a damaged last tensor must not
    # leave the model half loaded.
    model, corpus, run_dir = run
    path = run_dir / "best.safetensors"
    data = bytearray(path.read_bytes())
    data[-4] ^= 0x01  # the last bytes of the data: read last
    path.write_bytes(bytes(data))
    fresh = LBL(model.config, model.tree, torch.Generator().manual_seed(5))
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    with pytest.raises(ckpt.CheckpointError, match="checksum"):
        ckpt.load_weights(path, fresh, vocab=corpus.vocab)
    assert all(torch.equal(v, before[k]) for k, v in fresh.state_dict().items())


def test_nan_weights_are_refused_by_every_tensor_loader(tmp_path):
    """load_weights refused them already; the generic loader (optimizer state, example
    checkpoints) does too, so no path hands NaN to top-k or predictions."""
    import torch

    from hlbl.checkpoint import load_tensors, load_tensors_and_meta, save_tensors
    from hlbl.errors import CheckpointError

    path = tmp_path / "w.safetensors"
    save_tensors(path, {"a": torch.tensor([1.0, float("nan")]), "b": torch.zeros(2, dtype=torch.int64)})
    for load in (load_tensors, load_tensors_and_meta):
        with pytest.raises(CheckpointError, match="tensor a holds NaN or infinite values"):
            load(path)
    save_tensors(path, {"a": torch.tensor([1.0, 2.0]), "b": torch.zeros(2, dtype=torch.int64)})
    assert load_tensors(path)["a"].tolist() == [1.0, 2.0]
