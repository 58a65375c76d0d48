"""HybridSoftmax: an exact softmax over the head words and a tail entry, a tree under it.

Every check is against references built here from the parameters alone (the head's softmax by
hand, the tail's paths from the tree's codes), not against the layer's own paths."""

import io
import math

import numpy as np
import pytest
import torch

from conftest import multi_code_tree
from hlbl.output import HybridSoftmax, TreeSoftmax, hybrid_split, make_output_layer, restrict_tree
from hlbl.search import topk_matches
from hlbl.tree import WordTree, huffman_tree, random_tree

COUNTS = np.random.default_rng(3).permutation(np.floor(1e4 / np.arange(1, 41)) + 1)  # 40 words, Zipf, shuffled ids


def layers():
    """(name, layer) pairs: Huffman and random tails, a multi-code tail, a head of one word."""
    head, tail = hybrid_split(COUNTS, 6)
    return {
        "huffman_tail": HybridSoftmax.from_counts(5, COUNTS, head=6),
        "random_tail": HybridSoftmax.from_counts(5, COUNTS, head=12, tail_tree=random_tree(28, 2)),
        "multi_code_tail": HybridSoftmax(5, [7, 2, 0], multi_code_tree()),  # V = 9
        "head_of_one": HybridSoftmax(5, [3], random_tree(4, 0)),
        "whole_tree_cut": HybridSoftmax.from_tree(5, random_tree(30, 4), head=9),
    }


def randomised(layer, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    layer = layer.double()
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * scale)
    return layer, torch.randn(11, 5, generator=g, dtype=torch.float64) * 1.5


def reference_log_prob(layer, h):
    """(B, V) float64 from the parameters: log-softmax of the head, plus for a tail word the log of
    the sum over its leaves of the product of its path's sigmoids."""
    W, b = layer.weight.double(), layer.bias.double()
    head = torch.log_softmax(h @ W.t() + b, dim=1)  # (B, K + 1)
    tree, tw, tb = layer.tail.tree, layer.tail.weight.double(), layer.tail.bias.double()
    heads = sorted(layer.head_words.tolist())
    tails = [w for w in range(layer.vocab_size) if w not in set(heads)]
    cols = [None] * layer.vocab_size
    for i, w in enumerate(heads):
        cols[w] = head[:, i]
    for i, w in enumerate(tails):
        paths = []
        for nodes, bits in tree.codes(i):
            sign = torch.tensor([1.0 if x else -1.0 for x in bits], dtype=torch.float64)
            paths.append(torch.nn.functional.logsigmoid(sign * (h @ tw[nodes].t() + tb[nodes])).sum(1))
        cols[w] = head[:, len(heads)] + torch.logsumexp(torch.stack(paths, 1), 1)
    return torch.stack(cols, 1)


@pytest.mark.parametrize("name", list(layers()))
def test_rows_sum_to_one_and_match_the_reference(name):
    layer, h = randomised(layers()[name])
    lp = layer.log_prob(h)
    assert lp.shape == (11, layer.vocab_size)
    assert torch.allclose(lp.exp().sum(1), torch.ones(11, dtype=torch.float64), atol=1e-12)
    with torch.no_grad():
        ref = reference_log_prob(layer, h)
    assert torch.allclose(lp, ref, atol=1e-10)
    assert torch.allclose(layer.float().log_prob(h.float()).exp().sum(1), torch.ones(11), atol=1e-5)


@pytest.mark.parametrize("name", list(layers()))
def test_forward_gives_each_targets_log_prob_and_the_mean_nll(name):
    layer, h = randomised(layers()[name])
    V = layer.vocab_size
    ref = reference_log_prob(layer, h).detach()
    for shift in range(0, V, 5):  # every word a target somewhere, head and tail mixed in one batch
        t = (torch.arange(11) * 3 + shift) % V
        out = layer(h, t)
        assert torch.allclose(out.output, ref[torch.arange(11), t], atol=1e-10)
        assert out.loss.item() == pytest.approx(-ref[torch.arange(11), t].mean().item(), abs=1e-10)


@pytest.mark.parametrize("name", ["huffman_tail", "multi_code_tail"])
def test_the_gradient_is_that_of_the_reference(name):
    """Gradients of the mean NLL (head and tail targets, a multi-code tail) equal those of the
    reference written with plain autograd, for every parameter and the input."""
    layer, h = randomised(layers()[name])
    t = torch.arange(11) % layer.vocab_size
    h1, h2 = h.clone().requires_grad_(), h.clone().requires_grad_()
    layer(h1, t).loss.backward()
    got = [p.grad.clone() for p in layer.parameters()] + [h1.grad]
    layer.zero_grad()
    (-reference_log_prob(layer, h2)[torch.arange(11), t].mean()).backward()
    want = [p.grad for p in layer.parameters()] + [h2.grad]
    for a, b in zip(got, want):
        assert torch.allclose(a, b, atol=1e-10)
    # log_prob's autograd path too
    layer.zero_grad()
    h3 = h.clone().requires_grad_()
    (-layer.log_prob(h3)[torch.arange(11), t].mean()).backward()
    assert torch.allclose(h3.grad, h2.grad, atol=1e-10)


@pytest.mark.parametrize("name", list(layers()))
@pytest.mark.parametrize("scale", [0.3, 3.0])
def test_topk_is_exact_for_every_k(name, scale):
    layer, h = randomised(layers()[name], seed=1, scale=scale)
    lp = layer.log_prob(h)
    for k in (1, 2, 5, layer.head_size + 1, layer.vocab_size, layer.vocab_size + 3):
        values, ids = layer.topk(h, k)
        assert values.shape == (11, min(k, layer.vocab_size))
        assert topk_matches(values, ids, lp, atol=1e-10)
    assert torch.equal(layer.predict(h), lp.argmax(1))


def test_topk_skips_the_tree_where_the_head_decides_and_searches_it_elsewhere(monkeypatch):
    """Rows whose head words beat the tail's whole mass never reach the tree search; rows where the
    tail is heavy do, and both give the exact answer."""
    layer, h = randomised(HybridSoftmax.from_counts(5, COUNTS, head=6))
    with torch.no_grad():
        layer.bias[:6] = 8.0  # the head words dominate ...
        layer.weight[6] = 0.0
        layer.bias[6] = -20.0  # ... unless the input says otherwise: rows 0-4 push the tail entry up
        layer.weight[6, 0] = 30.0
        h[:5, 0], h[5:, 0] = 2.0, -2.0
    import hlbl.search

    searched = []
    real = hlbl.search.tree_topk
    monkeypatch.setattr(hlbl.search, "tree_topk", lambda *a, **kw: searched.append(len(a[3])) or real(*a, **kw))
    values, ids = layer.topk(h, 3)
    assert searched == [5]
    assert topk_matches(values, ids, layer.log_prob(h), atol=1e-10)
    assert (ids[:5] >= 0).all() and set(ids[5:].flatten().tolist()) <= set(layer.head_words.tolist())


def test_topk_ties_go_to_the_lower_word_id():
    layer = HybridSoftmax(3, [4, 1], huffman_tree([1, 1, 1, 1])).double()  # zero weights, equal biases
    layer.init_unigram(np.ones(6))
    values, ids = layer.topk(torch.zeros(2, 3, dtype=torch.float64), 6)
    assert ids.tolist() == [list(range(6))] * 2
    assert torch.allclose(values, torch.full((2, 6), -math.log(6), dtype=torch.float64))


def test_sampling_follows_the_distribution():
    layer, h = randomised(HybridSoftmax(5, [7, 2, 0], multi_code_tree()), seed=2, scale=0.5)
    x = h[:1].expand(40000, -1)
    p = layer.log_prob(h[:1]).exp()[0]
    for temperature, per_node in ((1.0, False), (0.6, False)):
        words = layer.sample(x, torch.Generator().manual_seed(0), temperature, per_node)
        freq = torch.bincount(words, minlength=9).double() / len(words)
        want = p ** (1 / temperature) / (p ** (1 / temperature)).sum()
        assert torch.allclose(freq, want, atol=0.012)
    words = layer.sample(x[:2000], torch.Generator().manual_seed(0), 0.6, per_node=True)  # tempered per decision
    assert ((0 <= words) & (words < 9)).all()
    again = layer.sample(x[:2000], torch.Generator().manual_seed(0), 0.6, per_node=True)
    assert torch.equal(words, again)


def test_zero_weights_and_unigram_biases_give_the_unigram_model():
    layer = HybridSoftmax.from_counts(4, COUNTS, head=7).double()
    layer.init_unigram(COUNTS)
    lp = layer.log_prob(torch.randn(3, 4, dtype=torch.float64))
    assert torch.allclose(lp.exp(), torch.from_numpy(COUNTS / COUNTS.sum()).expand(3, -1), atol=1e-12)


def test_the_head_is_the_most_frequent_words_and_the_tail_tree_follows_the_tail_ids():
    head, tail = hybrid_split(COUNTS, 6)
    assert set(head.tolist()) == set(np.argsort(-COUNTS, kind="stable")[:6].tolist())
    assert (np.diff(head) > 0).all() and (np.diff(tail) > 0).all() and len(head) + len(tail) == 40
    layer = HybridSoftmax.from_counts(4, COUNTS, head=6)
    assert layer.tail.tree.fingerprint() == huffman_tree(COUNTS[tail]).fingerprint()
    assert torch.equal(layer.tail_words, torch.from_numpy(tail))


def test_a_cut_tree_keeps_the_order_of_the_remaining_decisions():
    tree = WordTree.from_nested(((0, 1), ((2, 3), (4, (5, 6)))), 7)
    cut = restrict_tree(tree, [1, 3, 5, 6])
    assert cut.fingerprint() == WordTree.from_nested((0, (1, (2, 3))), 4).fingerprint()
    with pytest.raises(ValueError, match="at least two"):
        restrict_tree(tree, [2])


def round_trip(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


@pytest.mark.parametrize("name", ["huffman_tail", "multi_code_tail"])
def test_the_structure_travels_in_the_state_dict(name):
    layer, h = randomised(layers()[name])
    state = round_trip(layer.state_dict())
    assert {"head_words", "tail.tree_children", "weight", "bias"} <= set(state)
    rebuilt = HybridSoftmax.from_state_dict(state)
    assert rebuilt.weight.dtype == torch.float64
    with torch.no_grad():
        assert torch.equal(rebuilt.log_prob(h), layer.log_prob(h))
    with pytest.raises(ValueError, match="not a HybridSoftmax state"):
        HybridSoftmax.from_state_dict(TreeSoftmax(5, random_tree(9, 0)).state_dict())


def test_a_state_of_another_structure_is_refused_and_nothing_loads():
    a = HybridSoftmax(4, [0, 1, 2], random_tree(9, 0))
    state = a.state_dict()
    for other in (
        HybridSoftmax(4, [0, 1, 3], random_tree(9, 0)),  # another head, the same shapes
        HybridSoftmax(4, [0, 1, 2], random_tree(9, 1)),  # another tail tree, the same shapes
    ):
        before = [p.detach().clone() for p in other.parameters()]
        for strict in (True, False):
            with pytest.raises(RuntimeError, match="hybrid softmax of another structure.*from_state_dict"):
                other.load_state_dict(state, strict=strict)
        assert all(torch.equal(p, q) for p, q in zip(other.parameters(), before))


def test_inputs_and_mistakes_are_as_for_the_tree_layer():
    layer = HybridSoftmax(4, [0, 5], random_tree(8, 0))
    x = torch.randn(4)
    out = layer(x, torch.tensor(3))
    assert out.output.shape == () and layer.log_prob(x).shape == (10,) and layer.predict(x).shape == ()
    assert layer.topk(x, 2)[0].shape == (2,) and layer.sample(x, torch.Generator()).shape == ()
    for bad in (torch.zeros(3, 5), torch.zeros(2, 3, 4), torch.zeros(())):
        with pytest.raises(ValueError, match=r"shape \(B, 4\) or \(4,\)"):
            layer.log_prob(bad)
        with pytest.raises(ValueError, match=r"shape \(B, 4\) or \(4,\)"):
            layer.topk(bad, 2)
    with pytest.raises(ValueError, match=r"target must have shape \(3,\)"):
        layer(torch.zeros(3, 4), torch.zeros(2, dtype=torch.long))
    with pytest.raises(TypeError, match="floating point"):
        layer.log_prob(torch.zeros(3, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="input is torch.float64"):
        layer.log_prob(torch.zeros(3, 4, dtype=torch.float64))
    for bad in (-1, 10):
        with pytest.raises(ValueError, match="target word ids"):
            layer(torch.zeros(2, 4), torch.tensor([0, bad]))
    with pytest.raises(TypeError, match="int64 or int32"):
        layer(torch.zeros(2, 4), torch.tensor([0.0, 1.0]))
    assert layer.log_prob(torch.zeros(0, 4)).shape == (0, 10)
    assert layer(torch.zeros(0, 4), torch.zeros(0, dtype=torch.long)).output.shape == (0,)


def test_bad_structures_are_one_clear_error():
    with pytest.raises(ValueError, match="distinct word id"):
        HybridSoftmax(4, [0, 0], random_tree(8, 0))
    with pytest.raises(ValueError, match="distinct word id"):
        HybridSoftmax(4, [0, 10], random_tree(8, 0))  # V = 10
    with pytest.raises(ValueError, match="at least one"):
        HybridSoftmax(4, [], random_tree(8, 0))
    with pytest.raises(TypeError, match="WordTree"):
        HybridSoftmax(4, [0], None)
    for head in (0, 39, 2.5, True):
        with pytest.raises(ValueError, match="head must be a whole number from 1 to V - 2"):
            HybridSoftmax.from_counts(4, COUNTS, head=head)
    with pytest.raises(ValueError, match="the tail tree has 5 words, the tail 34"):
        HybridSoftmax.from_counts(4, COUNTS, head=6, tail_tree=random_tree(5, 0))


def test_node_gradient_scaling_changes_only_the_tail_parameter_gradients():
    layer, h = randomised(HybridSoftmax.from_counts(5, COUNTS, head=3))
    t = torch.arange(11) * 3 % 40
    x = h.clone().requires_grad_()
    layer(x, t).loss.backward()
    before = [p.grad.clone() for p in layer.parameters()] + [x.grad.clone()]
    out_before = layer(h, t).output
    layer.zero_grad()
    layer.scale_node_gradients(COUNTS)
    x = h.clone().requires_grad_()
    out = layer(x, t)
    out.loss.backward()
    after = [p.grad for p in layer.parameters()] + [x.grad]
    assert torch.equal(out.output, out_before)
    names = [n for n, _ in layer.named_parameters()] + ["input"]
    for n, a, b in zip(names, before, after):
        if n.startswith("tail."):  # the tail's root carries the tail's share, over the busiest word's
            assert not torch.allclose(a, b)
        else:
            assert torch.allclose(a, b, atol=1e-12), n
    p = COUNTS / COUNTS.sum()
    tail = layer.tail_words.numpy()
    assert layer.tail.node_grad_scale[0].item() == pytest.approx(min(1.0, p.max() / p[tail].sum()))


def test_the_lbl_hybrid_kind_cuts_the_run_tree_and_the_auto_engine_picks_torch():
    import hlbl
    from hlbl import engine
    from hlbl.config import LBLConfig, TrainConfig

    tree = random_tree(30, 4)
    layer = make_output_layer("hybrid", 5, 30, tree, head=9)
    assert isinstance(layer, HybridSoftmax) and layer.head_words.tolist() == list(range(9))
    assert layer.tail.tree.fingerprint() == restrict_tree(tree, range(9, 30)).fingerprint()
    with pytest.raises(ValueError, match="hybrid output layer needs a WordTree"):
        make_output_layer("hybrid", 5, 30, None)
    model = hlbl.LBL(LBLConfig(30, dim=5, output="hybrid", head=9), tree)
    assert model.structure is tree  # saved as the run's tree.json
    assert engine.choose_engine(model, TrainConfig(engine="auto")) is engine.train_epoch
    with pytest.raises(hlbl.ConfigError, match="tree output layer only"):
        engine.choose_engine(model, TrainConfig(engine="fast"))


def test_the_cli_trains_a_hybrid_run_that_loads_and_predicts(tmp_path, capsys):
    import hlbl
    from conftest import tiny_corpus
    from hlbl.cli import main

    data = tiny_corpus(tmp_path / "data")
    run = tmp_path / "run"
    flags = ["--dim", "8", "--epochs", "1", "--quiet", "--device", "cpu"]
    assert main(["train", "--data", str(data), "--out", str(run), "--output", "hybrid", "--head", "5", *flags]) == 0
    model, vocab, info = hlbl.load_model(run)
    assert isinstance(model.out, HybridSoftmax) and model.out.head_size == 5 and info.model.head == 5
    assert model.structure.fingerprint() == WordTree.load(run / "tree.json").fingerprint()
    ctx = torch.zeros(3, model.config.context, dtype=torch.long)
    lp = model.log_prob(ctx)
    assert torch.allclose(lp.exp().sum(1), torch.ones(3), atol=1e-5)
    capsys.readouterr()
    assert main(["train", "--data", str(data), "--out", str(tmp_path / "r2"), "--head", "5", *flags]) == 2
    assert "--head applies to --output hybrid only" in capsys.readouterr().err
    assert main(["train", "--data", str(data), "--out", str(tmp_path / "r3"), "--output", "hybrid", *flags]) == 2
    assert "--head 2000: the hybrid needs 1 to V - 2" in capsys.readouterr().err


@pytest.mark.parametrize("tree", [random_tree(60, 3), multi_code_tree()], ids=["single", "multi"])
def test_a_floor_stops_the_tree_search_without_changing_what_it_finds(tree):
    """tree_topk(floor=f): exactly the words of the plain search at or above f, fewer nodes scored."""
    from hlbl.search import tree_topk

    layer, _ = randomised(TreeSoftmax(5, tree), seed=4)
    h = torch.randn(30, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    k = min(8, tree.num_words)
    plain = tree_topk(tree, layer.weight, layer.bias, h, k)
    floor = plain.values[:, 2].clone()  # rows want their best three (and ties)
    floor[::3] = -math.inf  # some rows want everything
    cut = tree_topk(tree, layer.weight, layer.bias, h, k, floor=floor)
    want = plain.values >= floor[:, None]
    assert torch.equal(cut.indices[want], plain.indices[want]) and torch.equal(cut.values[want], plain.values[want])
    # below the floor: unfilled (-1, -inf), or a word met on the way, with its exact value
    rest_w, rest_v = cut.indices[~want], cut.values[~want]
    assert (rest_v < floor[:, None].expand_as(want)[~want]).all()
    assert torch.isinf(rest_v[rest_w < 0]).all()
    lp = layer.log_prob(h)
    met = rest_w >= 0
    rows = torch.arange(30)[:, None].expand_as(want)[~want][met]
    assert torch.allclose(rest_v[met], lp[rows, rest_w[met]], atol=1e-12)
    assert (cut.nodes <= plain.nodes).all()
    if tree.num_nodes > 8:  # (the 8 nodes of the small multi-code tree are all scored either way)
        assert cut.nodes.sum() < plain.nodes.sum()
    with pytest.raises(ValueError, match="one value per row"):
        tree_topk(tree, layer.weight, layer.bias, h, k, floor=floor[:3])


def test_the_head_top_k_breaks_ties_by_lower_index_as_a_stable_sort():
    from hlbl.output.hybrid import _sorted_topk
    from hlbl.search import full_topk

    lp = torch.tensor([[0.5, 1.0, 1.0, 0.2, 1.0, 0.9], [3.0, 1.0, 2.0, 2.0, 0.0, 2.0]])
    for k in range(1, 7):
        assert all(torch.equal(a, b) for a, b in zip(_sorted_topk(lp, k), full_topk(lp, k)))
    x = torch.randn(50, 300, generator=torch.Generator().manual_seed(0)).round(decimals=1)  # many ties
    assert all(torch.equal(a, b) for a, b in zip(_sorted_topk(x, 10), full_topk(x, 10)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_hybrid_gives_what_it_gives_on_the_cpu():
    """The device paths (the tree for every row, top-k from the tail's distribution, the tensor
    walk) against the CPU's."""
    cpu, h = randomised(layers()["multi_code_tail"])
    gpu, _ = randomised(layers()["multi_code_tail"])
    gpu, hg = gpu.cuda(), h.cuda()
    t = torch.arange(11) % cpu.vocab_size
    assert torch.allclose(gpu(hg, t.cuda()).output.cpu(), cpu(h, t).output, atol=1e-10)
    assert torch.allclose(gpu.log_prob(hg).cpu(), cpu.log_prob(h), atol=1e-10)
    values, ids = gpu.topk(hg, 4)
    assert ids.device.type == "cuda" and topk_matches(values.cpu(), ids.cpu(), cpu.log_prob(h), atol=1e-10)
    words = gpu.sample(hg, torch.Generator("cuda").manual_seed(0))
    assert words.device.type == "cuda" and ((0 <= words) & (words < cpu.vocab_size)).all()
