import math

import numpy as np
import pytest
import torch

from conftest import all_trees, multi_code_tree
from hlbl.output import FlatSoftmax, TreeSoftmax, make_output_layer
from hlbl.tree import random_tree


def random_layer(tree, d=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    layer = TreeSoftmax(d, tree).double()
    with torch.no_grad():
        layer.weight.copy_(torch.randn(layer.weight.shape, generator=g, dtype=torch.float64))
        layer.bias.copy_(torch.randn(layer.bias.shape, generator=g, dtype=torch.float64))
    return layer, torch.randn(9, d, generator=g, dtype=torch.float64)


def brute_force_log_prob(tree, weight, bias, h):
    """Plain-Python reference: walk every root-to-leaf path from the children table."""
    V = tree.num_words
    out = []
    for x in h.tolist():
        probs = [0.0] * V

        def walk(node, p):
            s = sum(a * b for a, b in zip(weight[node], x)) + bias[node]
            p_left = 1.0 / (1.0 + math.exp(-s))
            for child, pc in ((tree.children[node][0], p_left), (tree.children[node][1], 1.0 - p_left)):
                if child >= 0:
                    walk(int(child), p * pc)
                else:
                    probs[-1 - int(child)] += p * pc

        walk(0, 1.0)
        out.append([math.log(p) for p in probs])
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("name,tree", all_trees().items())
def test_distribution_sums_to_one(name, tree):
    layer, h = random_layer(tree)
    lp = layer.log_prob(h)
    assert lp.shape == (9, tree.num_words)
    assert torch.allclose(lp.exp().sum(1), torch.ones(9, dtype=torch.float64), atol=1e-5)
    # float32 too, the precision used in training
    assert torch.allclose(layer.float().log_prob(h.float()).exp().sum(1), torch.ones(9), atol=1e-5)


@pytest.mark.parametrize("name,tree", all_trees().items())
def test_matches_brute_force_enumeration(name, tree):
    layer, h = random_layer(tree)
    ref = brute_force_log_prob(tree, layer.weight.tolist(), layer.bias.tolist(), h)
    assert torch.allclose(layer.log_prob(h), ref, atol=1e-10)
    targets = torch.arange(9) % tree.num_words
    out = layer(h, targets)
    assert torch.allclose(out.output, ref[torch.arange(9), targets], atol=1e-10)
    assert out.loss.item() == pytest.approx(-ref[torch.arange(9), targets].mean().item())


def reference_path_log_probs(layer, x, w):
    """log P(path) of each of word w's codes, written out with autograd ops from tree.codes."""
    out = []
    for nodes, bits in layer.tree.codes(w):
        s = layer.weight[nodes] @ x + layer.bias[nodes]
        sign = torch.tensor([1.0 if b else -1.0 for b in bits], dtype=s.dtype)
        out.append(torch.nn.functional.logsigmoid(sign * s).sum())
    return torch.stack(out)


def logsumexp_reference_loss(layer, h, targets):
    """The exact objective: -log sum over a word's leaves of its path probabilities."""
    losses = [-torch.logsumexp(reference_path_log_probs(layer, x, w), 0) for x, w in zip(h, targets.tolist())]
    return torch.stack(losses).mean()


def averaged_path_loss(layer, h, targets):
    """The wrong objective: mean of the paths' log-losses."""
    losses = [-reference_path_log_probs(layer, x, w).mean() for x, w in zip(h, targets.tolist())]
    return torch.stack(losses).mean()


def grads(layer, loss_fn, h, targets):
    layer.zero_grad()
    h = h.clone().requires_grad_(True)
    loss_fn(h).backward()
    return torch.cat([layer.weight.grad.flatten(), layer.bias.grad.flatten(), h.grad.flatten()])


def test_multi_code_gradient_is_the_exact_log_sum_gradient():
    tree = multi_code_tree()
    layer, h = random_layer(tree, seed=1)
    targets = torch.tensor([2, 4, 2, 0, 1, 4, 5, 3, 2])
    ours = grads(layer, lambda x: layer(x, targets).loss, h, targets)
    ref = grads(layer, lambda x: logsumexp_reference_loss(layer, x, targets), h, targets)
    assert torch.allclose(ours, ref, atol=1e-10)
    wrong = grads(layer, lambda x: averaged_path_loss(layer, x, targets), h, targets)
    assert (ours - wrong).abs().max() > 1e-2, "averaging path losses must give a different gradient"
    # finite differences on the weights and the input, all in float64
    assert torch.autograd.gradcheck(
        lambda w, b, x: _loss_with(layer, w, b, x, targets),
        (
            layer.weight.detach().clone().requires_grad_(True),
            layer.bias.detach().clone().requires_grad_(True),
            h.clone().requires_grad_(True),
        ),
    )


def _loss_with(layer, w, b, x, targets):
    with torch.no_grad():
        layer.weight.zero_()
        layer.bias.zero_()
    # functional call with the given parameters
    return torch.func.functional_call(layer, {"weight": w, "bias": b}, (x, targets)).loss


def test_gradient_weights_each_path_by_its_posterior_share():
    # d log P(w) / dh = sum_k P(path k | w, h) * d log P(path k) / dh
    tree = multi_code_tree()
    layer, h = random_layer(tree, seed=4)
    with torch.no_grad():
        layer.weight.mul_(0.2)
        layer.bias.mul_(0.2)
    x = h[:1].clone().requires_grad_(True)
    w = torch.tensor([2])  # three codes
    paths = layer.path_log_probs(x, w)[0]
    post = torch.softmax(paths, 0).detach()
    assert (post > 0.05).all(), "the test needs every path to matter"
    per_path = [torch.autograd.grad(paths[k], x, retain_graph=True)[0] for k in range(3)]
    expected = sum(p * g for p, g in zip(post, per_path))
    (got,) = torch.autograd.grad(layer(x, w).output.sum(), x)
    assert torch.allclose(got, expected, atol=1e-12)
    assert not torch.allclose(got, sum(per_path) / 3, atol=1e-3)


@pytest.mark.parametrize("kind", ["tree", "flat", "hybrid"])
def test_zero_weights_and_unigram_biases_give_the_unigram_model(kind):
    tree = multi_code_tree() if kind in ("tree", "hybrid") else None
    counts = np.array([5.0, 1.0, 7.0, 2.0, 3.0, 9.0])
    layer = make_output_layer(kind, 4, 6, tree, head=2).double()
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if "weight" in name:
                p.zero_()
    layer.init_unigram(counts)
    p = counts / counts.sum()
    lp = layer.log_prob(torch.randn(3, 4, dtype=torch.float64))
    assert torch.allclose(lp.exp(), torch.tensor(p).expand(3, 6), atol=1e-12)
    # Perplexity of a stream with these frequencies equals the unigram perplexity.
    stream = np.repeat(np.arange(6), counts.astype(int))
    out = layer(torch.zeros(len(stream), 4, dtype=torch.float64), torch.from_numpy(stream))
    assert math.exp(out.loss.item()) == pytest.approx(math.exp(-(p * np.log(p)).sum()))


@pytest.mark.parametrize("name,tree", all_trees().items())
def test_uniform_model_has_perplexity_v(name, tree):
    V = tree.num_words
    for layer in (TreeSoftmax(3, tree), FlatSoftmax(3, V)):
        layer = layer.double()
        with torch.no_grad():
            layer.weight.zero_()
        layer.init_unigram(np.ones(V))
        targets = torch.arange(V)
        out = layer(torch.randn(V, 3, dtype=torch.float64), targets)
        assert math.exp(out.loss.item()) == pytest.approx(V, rel=1e-9)


def test_factory_rejects_bad_requests():
    with pytest.raises(ValueError, match="unknown output layer"):
        make_output_layer("softmaxx", 4, 6)
    with pytest.raises(ValueError, match="needs a WordTree"):
        make_output_layer("tree", 4, 6)
    with pytest.raises(ValueError, match="tree has 6 words"):
        make_output_layer("tree", 4, 7, multi_code_tree())


@pytest.mark.parametrize("kind", ["tree", "flat", "hybrid"])
def test_targets_out_of_range_are_refused_not_wrapped(kind):
    """A -1 "padding" target must not silently score word V-1 (nor be skipped as -100 would be)."""
    tree = multi_code_tree()
    layer = make_output_layer(kind, 3, tree.num_words, tree if kind != "flat" else None, head=2)
    h = torch.randn(2, 3)
    for bad in (-1, -100, tree.num_words):
        with pytest.raises(ValueError, match="target word ids"):
            layer(h, torch.tensor([0, bad]))


@pytest.mark.parametrize("name,tree", all_trees().items())
def test_empty_batch_gives_an_empty_distribution(name, tree):
    layer, _ = random_layer(tree)
    assert layer.log_prob(torch.zeros(0, 6, dtype=torch.float64)).shape == (0, tree.num_words)


def test_init_unigram_needs_one_count_per_word():
    tree = multi_code_tree()
    for kind in ("tree", "flat", "adaptive"):
        layer = make_output_layer(kind, 3, tree.num_words, tree if kind == "tree" else None)
        for counts in (
            [1.0] * (tree.num_words + 1),
            [1.0] * (tree.num_words - 1),
            [1.0, -1.0] + [1.0] * (tree.num_words - 2),
        ):
            with pytest.raises(ValueError, match="init_unigram"):
                layer.init_unigram(counts)


def test_adaptive_init_unigram_changes_nothing():
    """PyTorch's adaptive softmax has no biases: init_unigram keeps its initialisation (documented)."""
    layer = make_output_layer("adaptive", 8, 40)
    before = {k: v.clone() for k, v in layer.state_dict().items()}
    layer.init_unigram(np.arange(1.0, 41.0))
    assert all(torch.equal(before[k], v) for k, v in layer.state_dict().items())


@pytest.mark.parametrize("counts", [[1e308] * 9, [1e300] + [1e-300] * 8])
@pytest.mark.parametrize("kind", ["tree", "flat", "hybrid"])
def test_init_unigram_with_extreme_counts_keeps_biases_finite(kind, counts):
    tree = random_tree(9, 0)
    layer = make_output_layer(kind, 3, 9, tree if kind != "flat" else None, head=3)
    layer.init_unigram(counts)
    assert all(torch.isfinite(p).all() for name, p in layer.named_parameters() if "bias" in name)
    assert torch.allclose(layer.log_prob(torch.zeros(1, 3)).exp().sum(), torch.tensor(1.0))


@pytest.mark.parametrize("kind", ["tree", "flat", "hybrid"])
@pytest.mark.parametrize("dtype", [torch.uint8, torch.bool, torch.float32])
def test_targets_of_a_non_integer_dtype_are_refused(kind, dtype):
    """A uint8/bool tensor would index as a mask (B == V gives plausible wrong numbers)."""
    tree = random_tree(10, 0)
    layer = make_output_layer(kind, 3, 10, tree if kind != "flat" else None, head=4)
    with pytest.raises(TypeError, match="int64 or int32"):
        layer(torch.randn(10, 3), torch.arange(10).to(dtype))
    assert torch.equal(
        layer(torch.zeros(2, 3), torch.tensor([1, 2], dtype=torch.int32)).output,
        layer(torch.zeros(2, 3), torch.tensor([1, 2])).output,
    )


def test_the_layer_tree_is_fixed_and_shown():
    layer = TreeSoftmax(8, random_tree(10, 0))
    with pytest.raises(AttributeError):
        layer.tree = random_tree(10, 1)  # its buffers would keep the old tree's paths
    assert "vocab_size=10, nodes=9" in repr(layer)


def test_factory_refuses_a_tree_for_other_layers():
    """A tree given with flat output would be saved (tree.json, fingerprint) beside a model that ignores it."""
    for kind in ("flat", "adaptive"):
        with pytest.raises(ValueError, match="takes no tree"):
            make_output_layer(kind, 4, 6, multi_code_tree())


@pytest.mark.parametrize("kind", ["tree", "flat", "adaptive", "hybrid"])
def test_every_layer_has_the_whole_interface(kind):
    """topk / sample / forward exist on every layer and agree with log_prob (no per-layer dispatch)."""
    from hlbl.output import OutputLayer

    V = 40
    tree = random_tree(V, 0) if kind in ("tree", "hybrid") else None
    layer = make_output_layer(kind, 16, V, tree, init_std=0.3, generator=torch.Generator(), head=8).double()
    assert isinstance(layer, OutputLayer)
    h = torch.randn(5, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    lp = layer.log_prob(h)
    values, ids = layer.topk(h, 3)
    assert torch.equal(ids, torch.sort(lp, dim=1, descending=True, stable=True).indices[:, :3])
    assert torch.allclose(values, lp.gather(1, ids), atol=1e-9)
    t = torch.arange(5)
    out = layer(h, t)
    assert torch.allclose(out.output, lp[torch.arange(5), t], atol=1e-9) and torch.isclose(out.loss, -out.output.mean())
    words = layer.sample(h, torch.Generator().manual_seed(1), temperature=0.7)
    assert words.shape == (5,) and ((0 <= words) & (words < V)).all()
    if kind not in ("tree", "hybrid"):
        with pytest.raises(ValueError, match="per-node temperature needs a tree"):
            layer.sample(h, None, 0.7, per_node=True)


def test_an_overflowed_score_on_a_padded_path_is_not_nan():
    # Word 0 has a path of depth 1, padded to the tree's depth 2 with node 0 and sign 0: a root
    # score of +inf (float32 overflow) must give log P(word 0) = 0, not 0 x inf = NaN.
    from hlbl.tree import WordTree

    layer = TreeSoftmax(2, WordTree.from_nested((0, (1, 2)), 3))
    with torch.no_grad():
        layer.weight.zero_()
        layer.weight[0].fill_(3e38)
    h = torch.full((3, 2), 3e38, requires_grad=True)
    out = layer(h, torch.tensor([0, 1, 2]))
    assert out.output.tolist() == [0.0, -math.inf, -math.inf]
    out.output[0].backward()
    assert torch.isfinite(h.grad).all() and torch.isfinite(layer.weight.grad).all()


def test_adaptive_softmax_on_too_few_words_is_a_clear_error():
    with pytest.raises(ValueError, match="at least 3 words"):
        make_output_layer("adaptive", 8, 2)
    assert make_output_layer("adaptive", 8, 3).log_prob(torch.zeros(1, 8)).exp().sum().item() == pytest.approx(1.0)


@pytest.mark.parametrize("kind", ["tree", "flat", "hybrid"])
def test_a_standalone_layer_draws_its_weights_from_the_given_generator(kind):
    tree = random_tree(12, 0) if kind != "flat" else None
    a, b = (make_output_layer(kind, 5, 12, tree, 0.1, torch.Generator().manual_seed(3), head=3) for _ in range(2))
    torch.manual_seed(0)  # the global generator plays no part
    c = make_output_layer(kind, 5, 12, tree, 0.1, torch.Generator().manual_seed(4), head=3)
    assert torch.equal(a.weight, b.weight) and not torch.equal(a.weight, c.weight)
    assert a.weight.std().item() == pytest.approx(0.1, rel=0.3)
