"""TreeSoftmax as a PyTorch layer: its tree in the state_dict, one-vector inputs, predict, clear
errors, the fast log_prob, and sampling by tensor operations."""

import io
import math

import numpy as np
import pytest
import torch
from torch import nn

from conftest import all_trees, duplicated_tree, multi_code_tree
from hlbl.output import TreeSoftmax
from hlbl.tree import huffman_tree, random_tree


def layer_on(tree, d=5, seed=0, dtype=torch.float64, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    layer = TreeSoftmax(d, tree).to(dtype)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(layer.weight.shape, generator=g, dtype=torch.float64) * scale)
        layer.bias.copy_(torch.randn(layer.bias.shape, generator=g, dtype=torch.float64))
    return layer, torch.randn(7, d, generator=g, dtype=torch.float64).to(dtype)


def enumerate_log_prob(tree, layer, h):
    """float64 reference: every leaf's path, summed over a word's leaves."""
    W, b = layer.weight.detach().double(), layer.bias.detach().double()
    out = torch.full((h.shape[0], tree.num_words), -math.inf, dtype=torch.float64)
    for w in range(tree.num_words):
        for nodes, bits in tree.codes(w):
            s = h.double() @ W[nodes].t() + b[nodes]  # (B, depth)
            sign = torch.tensor([1.0 if x else -1.0 for x in bits], dtype=torch.float64)
            out[:, w] = torch.logaddexp(out[:, w], torch.nn.functional.logsigmoid(sign * s).sum(1))
    return out


def round_trip(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


# ---- the tree in the state_dict -----------------------------------------------------------------


@pytest.mark.parametrize("tree", [huffman_tree([50, 20, 9, 9, 5, 1]), multi_code_tree()])
def test_a_saved_state_loads_into_a_fresh_layer_with_identical_log_probs(tree):
    layer, h = layer_on(tree)
    state = round_trip(layer.state_dict())
    assert torch.equal(state["tree_children"], torch.from_numpy(tree.children.copy()))
    fresh = TreeSoftmax(5, tree).double()
    fresh.load_state_dict(state)
    with torch.no_grad():
        assert torch.equal(fresh.log_prob(h), layer.log_prob(h))
    rebuilt = TreeSoftmax.from_state_dict(state)  # the tree from the state alone
    assert rebuilt.tree.fingerprint() == tree.fingerprint() and rebuilt.weight.dtype == torch.float64
    with torch.no_grad():
        assert torch.equal(rebuilt.log_prob(h), layer.log_prob(h))


def test_a_state_of_another_tree_of_the_same_shape_is_refused():
    a, b = random_tree(12, 0), random_tree(12, 1)
    assert a.num_nodes == b.num_nodes and a.fingerprint() != b.fingerprint()
    state = TreeSoftmax(4, a).state_dict()
    other = TreeSoftmax(4, b)
    before = other.weight.detach().clone()
    for strict in (True, False):
        with pytest.raises(RuntimeError, match="another word tree.*from_state_dict"):
            other.load_state_dict(state, strict=strict)
    assert torch.equal(other.weight, before)  # nothing was loaded
    with pytest.raises(RuntimeError, match="another word tree"):  # another size: the same message
        TreeSoftmax(4, random_tree(13, 0)).load_state_dict(state)


def test_a_model_holding_the_layer_saves_and_rebuilds_it_by_prefix():
    tree = huffman_tree([9, 8, 7, 3, 2, 1, 1])
    model = nn.ModuleDict({"encoder": nn.Linear(3, 4), "decoder": TreeSoftmax(4, tree, 0.5, torch.Generator())})
    state = round_trip(model.state_dict())
    assert "decoder.tree_children" in state
    layer = TreeSoftmax.from_state_dict(state, prefix="decoder.")
    h = torch.randn(3, 4)
    with torch.no_grad():
        assert torch.equal(layer.log_prob(h), model["decoder"].log_prob(h))
    with pytest.raises(ValueError, match="no encoder.tree_children"):
        TreeSoftmax.from_state_dict(state, prefix="encoder.")


# ---- inputs -------------------------------------------------------------------------------------


@pytest.mark.parametrize("tree", [random_tree(9, 0), multi_code_tree()])
def test_one_vector_gives_outputs_without_a_batch_dimension(tree):
    layer, h = layer_on(tree)
    x = h[2]
    out = layer(x, torch.tensor(3))
    assert out.output.shape == () and out.loss.shape == ()
    assert torch.allclose(out.output, layer(h, torch.full((7,), 3)).output[2])
    assert layer.log_prob(x).shape == (tree.num_words,)
    values, ids = layer.topk(x, 2)
    assert values.shape == ids.shape == (2,)
    assert layer.predict(x).shape == () and layer.predict(x) == ids[0]
    assert layer.sample(x, torch.Generator().manual_seed(0)).shape == ()
    assert layer.sample(x, torch.Generator().manual_seed(0), temperature=0.5).shape == ()


def test_shape_and_type_mistakes_are_one_clear_error():
    layer = TreeSoftmax(4, random_tree(10, 0))
    for bad in (torch.zeros(3, 5), torch.zeros(2, 3, 4), torch.zeros(())):
        with pytest.raises(ValueError, match=r"shape \(B, 4\) or \(4,\)"):
            layer.log_prob(bad)
        with pytest.raises(ValueError, match=r"shape \(B, 4\) or \(4,\)"):
            layer.predict(bad)
    with pytest.raises(ValueError, match=r"target must have shape \(3,\)"):
        layer(torch.zeros(3, 4), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"target must have shape \(\)"):
        layer(torch.zeros(4), torch.zeros(1, dtype=torch.long))
    with pytest.raises(TypeError, match="floating point"):
        layer.log_prob(torch.zeros(3, 4, dtype=torch.long))  # word ids given for hidden vectors
    with pytest.raises(ValueError, match="torch.float64, the layer's weights torch.float32"):
        layer.log_prob(torch.zeros(3, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="torch.float64, the layer's weights torch.float32"):
        layer(torch.zeros(3, 4, dtype=torch.float64), torch.zeros(3, dtype=torch.long))
    with pytest.raises(TypeError, match="a tensor"):
        layer.log_prob([[0.0] * 4])
    with pytest.raises(TypeError, match="WordTree"):
        TreeSoftmax(4, [[0, 1]])


# ---- log_prob: the in-place path, the autograd path, the reference ------------------------------


@pytest.mark.parametrize("name,tree", {**all_trees(), "duplicated": duplicated_tree(40, 25, 0)}.items())
def test_both_log_prob_paths_equal_the_enumeration(name, tree):
    layer, h = layer_on(tree)
    ref = enumerate_log_prob(tree, layer, h)
    with torch.no_grad():
        fast = layer.log_prob(h)  # in place
    slow = layer.log_prob(h)  # differentiable
    assert slow.requires_grad and not fast.requires_grad
    assert torch.allclose(fast, ref, atol=1e-10) and torch.allclose(slow, ref, atol=1e-10)
    with torch.no_grad():
        assert torch.allclose(layer.float().log_prob(h.float()).double(), ref, atol=1e-4)


@pytest.mark.parametrize("tree", [random_tree(300, 1), duplicated_tree(300, 120, 2)], ids=["single", "multi"])
def test_the_cpu_kernel_equals_the_level_by_level_path_and_ignores_the_thread_count(tree):
    """log_prob on a CPU sweeps the tree in a numba kernel, rows split over torch's threads; other
    devices go level by level with tensor operations: the same distribution, and the same bits
    for any number of threads (200 rows: sliced when 2 threads are allowed)."""
    layer, _ = layer_on(tree, d=6, dtype=torch.float32)
    h = torch.randn(200, 6, generator=torch.Generator().manual_seed(3))
    threads = torch.get_num_threads()
    try:
        with torch.no_grad():
            torch.set_num_threads(1)
            one = layer.log_prob(h)
            torch.set_num_threads(2)
            two = layer.log_prob(h)
            levels = layer._edge_log_probs_inplace(h)  # the path a GPU takes, run on the CPU
    finally:
        torch.set_num_threads(threads)
    wc = layer._word_cols
    ref = torch.logsumexp(levels[:, wc.clamp(min=0)].masked_fill(wc < 0, float("-inf")), dim=2)
    assert torch.equal(one, two)
    assert torch.allclose(one, ref, atol=1e-5) and torch.allclose(one.exp().sum(1), torch.ones(200), atol=1e-4)


def test_log_prob_is_exact_for_scores_past_where_sigmoid_underflows():
    """log(sigmoid(s)) is -inf below s = -104 in float32: the layer must give s itself."""
    tree = random_tree(8, 0)
    layer = TreeSoftmax(2, tree)
    with torch.no_grad():
        layer.weight.fill_(-100.0)  # scores of -200 at every node for h = (1, 1)
        lp = layer.log_prob(torch.ones(3, 2))
        ref = enumerate_log_prob(tree, layer, torch.ones(3, 2, dtype=torch.float64))
    assert torch.isfinite(lp).all() and torch.allclose(lp.double(), ref, rtol=1e-6)


def test_the_gradient_of_log_prob_is_that_of_target_log_prob():
    tree = duplicated_tree(30, 12, 1)
    layer, h = layer_on(tree)
    h.requires_grad_(True)
    targets = torch.tensor([0, 5, 29, 7, 7, 3, 11])
    layer.log_prob(h)[torch.arange(7), targets].sum().backward()
    grads = [h.grad.clone(), layer.weight.grad.clone(), layer.bias.grad.clone()]
    h.grad = layer.weight.grad = layer.bias.grad = None
    layer.target_log_prob(h, targets).sum().backward()
    for a, b in zip(grads, (h.grad, layer.weight.grad, layer.bias.grad)):
        assert torch.allclose(a, b, atol=1e-10)


# ---- predict, top-k and sampling ----------------------------------------------------------------


@pytest.mark.parametrize("name,tree", all_trees().items())
def test_predict_is_the_argmax_of_log_prob(name, tree):
    layer, h = layer_on(tree, scale=2.0)
    with torch.no_grad():
        assert torch.equal(layer.predict(h), layer.log_prob(h).argmax(1))
    assert layer.predict(h).dtype == torch.int64


def test_the_tensor_walk_draws_what_the_cpu_kernel_draws():
    """The walk of tensor operations (for inputs off the CPU) takes the same uniforms and the
    same decisions as the numba kernel: equal words for equal seeds."""
    from hlbl.sampling import ancestral_sample

    tree = duplicated_tree(50, 20, 2)
    layer, _ = layer_on(tree, d=6)
    h = torch.randn(300, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    for T in (1.0, 0.6):
        walk = layer._walk(h, torch.Generator().manual_seed(7), T)
        kernel = ancestral_sample(tree, layer.weight, layer.bias, h, torch.Generator().manual_seed(7), T)
        assert torch.equal(walk, kernel)


def test_the_tensor_walk_follows_the_distribution():
    tree = multi_code_tree()
    layer, _ = layer_on(tree, d=3)
    h = torch.randn(1, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).expand(40000, 3)
    words = layer._walk(h, torch.Generator().manual_seed(0), 1.0)
    freq = np.bincount(words.numpy(), minlength=tree.num_words) / len(words)
    with torch.no_grad():
        p = layer.log_prob(h[:1]).exp()[0].numpy()
    assert np.abs(freq - p).max() < 0.01


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_inference_stays_on_the_device():
    tree = duplicated_tree(200, 50, 3)
    layer, h = layer_on(tree, d=8, dtype=torch.float32)
    cpu_lp = layer.log_prob(h).detach()
    layer, h = layer.cuda(), h.cuda()
    with torch.no_grad():
        assert torch.allclose(layer.log_prob(h).cpu(), cpu_lp, atol=1e-4)
    values, ids = layer.topk(h, 5)
    assert values.device == ids.device == h.device
    assert torch.equal(layer.predict(h).cpu(), cpu_lp.argmax(1))
    assert layer.sample(h, torch.Generator("cuda").manual_seed(0)).device == h.device


# ---- word features of any model, a tree learned from them ----------------------------------------


def test_hidden_features_are_the_exact_mean_hidden_vector_of_each_word():
    import hlbl

    g = torch.Generator().manual_seed(0)
    V, d = 6, 3
    batches = [(torch.randn(4, 5, d, generator=g), torch.randint(0, V - 1, (4, 5), generator=g)) for _ in range(3)]
    X, n = hlbl.hidden_features(iter(batches), V)  # word 5 is never a target
    H = torch.cat([h.reshape(-1, d) for h, _ in batches]).double().numpy()
    T = torch.cat([t.reshape(-1) for _, t in batches]).numpy()
    for w in range(V - 1):
        assert n[w] == (T == w).sum() and np.allclose(X[w], H[T == w].mean(0), atol=1e-12)
    assert n[V - 1] == 0 and np.allclose(X[V - 1], H.mean(0), atol=1e-12)
    acc = hlbl.WordFeatures(V)  # step by step, float32 and float64 batches alike
    for h, t in batches:
        acc.add(h.double(), t)
    assert np.array_equal(acc.result()[1], n) and np.allclose(acc.result()[0], X, atol=1e-12)


def test_feature_mistakes_are_one_clear_error():
    from hlbl import TreeError, WordFeatures, hidden_features, word_features

    acc = WordFeatures(5)
    with pytest.raises(ValueError, match=r"hidden must have shape \(B, d\) with targets \(B,\)"):
        acc.add(torch.zeros(4, 3), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"word ids in 0\.\.4"):
        acc.add(torch.zeros(2, 3), torch.tensor([0, 5]))
    with pytest.raises(TypeError, match="targets word ids"):
        acc.add(torch.zeros(2, 3), torch.zeros(2))
    with pytest.raises(TreeError, match="at least one"):
        acc.result()
    with pytest.raises(TypeError, match=r"\(hidden \(B, d\), targets \(B,\)\) pairs"):
        hidden_features([torch.zeros(2, 3)], 5)
    with pytest.raises(TypeError, match="hidden_features"):  # the LBL reader, given another model
        word_features(nn.LSTM(3, 3), np.zeros(10, dtype=np.int32), 0)


def test_a_tree_learned_from_features_groups_similar_words():
    import hlbl

    g = torch.Generator().manual_seed(0)
    centres = torch.tensor([[5.0, 0.0], [-5.0, 0.0]])
    X = centres[torch.arange(40) % 2] + 0.3 * torch.randn(40, 2, generator=g)  # even words left, odd right
    tree = hlbl.learn_tree(X, "adaptive")
    assert tree.num_words == 40 and tree.stats()["codes_per_word"] == 1.0
    top = [{int(w) for w in range(40) if tree.codes(w)[0][1][0] == side} for side in (1, 0)]
    assert sorted(map(sorted, top)) == [list(range(0, 40, 2)), list(range(1, 40, 2))]
    same = hlbl.build_tree_from_features(X.double().numpy(), "adaptive")
    assert same.fingerprint() == tree.fingerprint()  # tensors and arrays alike
    joined = hlbl.learn_tree(hlbl.embedding_features(X), "adaptive:0.3", copies=2, seed=1)
    assert joined.num_words == 40 and joined.stats()["codes_per_word"] >= 2.0
    with pytest.raises(hlbl.TreeError, match=r"\(V, d\)"):
        hlbl.embedding_features(torch.zeros(5))


# ---- per-node gradient scaling ------------------------------------------------------------------


def test_node_gradient_scaling_changes_only_the_parameter_gradients():
    counts = [500, 200, 100, 80, 60, 30, 20, 10]
    tree = huffman_tree(counts)
    layer, h = layer_on(tree, d=4)
    h = h[:, :4].clone().requires_grad_(True)
    targets = torch.tensor([0, 1, 2, 3, 4, 5, 7])

    def grads():
        for t in (h, layer.weight, layer.bias):
            t.grad = None
        out = layer(h, targets)
        out.loss.backward()
        return out.output.detach(), h.grad.clone(), layer.weight.grad.clone(), layer.bias.grad.clone()

    plain = grads()
    layer.scale_node_gradients(counts)
    scale = layer.node_grad_scale
    p = np.asarray(counts) / sum(counts)
    # the root carries every token: scaled to the most frequent word's share; no node above 1
    assert scale[0].item() == pytest.approx(p.max()) and (scale <= 1).all() and (scale == 1).any()
    scaled = grads()
    assert torch.equal(scaled[0], plain[0]) and torch.allclose(scaled[1], plain[1], atol=1e-12)
    assert torch.allclose(scaled[2], plain[2] * scale[:, None], atol=1e-12)
    assert torch.allclose(scaled[3], plain[3] * scale, atol=1e-12)
    full = layer.log_prob(h)[torch.arange(7), targets].mean()  # the full distribution's path too
    layer.weight.grad = None
    (-full).backward()
    assert torch.allclose(layer.weight.grad, scaled[2], atol=1e-10)
    assert "node_grad_scale" not in layer.state_dict()
    layer.scale_node_gradients(None)
    assert all(torch.allclose(a, b, atol=1e-12) for a, b in zip(grads(), plain))
    with pytest.raises(ValueError, match="power"):
        layer.scale_node_gradients(counts, power=-1)


def test_the_packed_and_the_padded_multi_code_paths_agree():
    """On the CPU a multi-code batch computes only its real (example, leaf) pairs; elsewhere every
    example is padded to the most codes. Same values, same gradients."""
    tree = duplicated_tree(30, 12, 4)
    layer, h = layer_on(tree)
    targets = torch.tensor([0, 5, 29, 7, 7, 3, 11])
    packed = layer.path_log_probs(h, targets)
    leaves = layer.word_leaves[targets]
    assert leaves.shape[1] > 1 and (leaves < 0).any()
    padded = layer._leaf_log_probs(h.unsqueeze(1).expand(-1, leaves.shape[1], -1), leaves.clamp(min=0))
    padded = padded.masked_fill(leaves < 0, float("-inf"))
    assert torch.equal(torch.isinf(packed), torch.isinf(padded))
    assert torch.allclose(packed[leaves >= 0], padded[leaves >= 0], atol=1e-12)
    (ga,) = torch.autograd.grad(torch.logsumexp(packed, 1).sum(), layer.weight)
    (gb,) = torch.autograd.grad(torch.logsumexp(padded, 1).sum(), layer.weight)
    assert torch.allclose(ga, gb, atol=1e-12)
