"""Ancestral and tempered sampling (hlbl.sampling) against the exact distributions."""

import math

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from conftest import duplicated_tree, random_layer
from hlbl.model import LBL, LBLConfig
from hlbl.output import TreeSoftmax
from hlbl.sampling import TorchUniforms, ancestral_sample, inverse_cdf, sample_from_log_prob
from hlbl.tree import random_tree


def _counts(words: torch.Tensor, V: int) -> np.ndarray:
    return np.bincount(words.numpy(), minlength=V)


def _chi2_p(counts: np.ndarray, probs: np.ndarray) -> float:
    probs = np.asarray(probs, dtype=np.float64)
    expected = probs / probs.sum() * counts.sum()
    return float(chisquare(counts, expected).pvalue)


@pytest.fixture(scope="module")
def sampling_layer():
    tree = duplicated_tree(30, 20, 11)
    layer, H = random_layer(tree, 6, seed=12, scale=0.7)
    return tree, layer, H[:1].float().repeat(60_000, 1)


def test_ancestral_sampling_matches_the_exact_multi_code_distribution(sampling_layer):
    tree, layer, H = sampling_layer
    assert tree.codes_per_word.max() >= 2
    with torch.no_grad():
        p = layer.log_prob(H[:1])[0].exp().numpy()
        words = ancestral_sample(tree, layer.weight, layer.bias, H, torch.Generator().manual_seed(0))
    counts = _counts(words, tree.num_words)
    assert _chi2_p(counts, p) > 1e-3
    assert 0.5 * np.abs(counts / counts.sum() - p).sum() < 0.01
    # The test can fail: the distribution of the first leaf only (renormalised) is rejected.
    first = np.zeros(tree.num_words)
    for w in range(tree.num_words):
        first[w] = math.exp(float(layer.path_log_probs(H[:1], torch.tensor([w]))[0, 0].detach()))
    assert _chi2_p(counts, first) < 1e-6


def test_temperature_exact_and_per_node_are_different_distributions(sampling_layer):
    tree, layer, H = sampling_layer
    T = 0.5
    with torch.no_grad():
        lp = layer.log_prob(H[:1])[0]
        exact = torch.softmax(lp / T, 0).numpy()
        hot = TreeSoftmax(6, tree)  # per-node T = every score divided by T
        hot.weight.copy_(layer.weight / T)
        hot.bias.copy_(layer.bias / T)
        per_node = hot.log_prob(H[:1])[0].exp().numpy()
        s_exact = _counts(layer.sample(H, torch.Generator().manual_seed(1), T), tree.num_words)
        s_node = _counts(layer.sample(H, torch.Generator().manual_seed(2), T, per_node=True), tree.num_words)
    assert _chi2_p(s_exact, exact) > 1e-3 and _chi2_p(s_node, per_node) > 1e-3
    assert _chi2_p(s_exact, per_node) < 1e-6 and _chi2_p(s_node, exact) < 1e-6


def test_sampling_is_reproducible_and_checks_temperature(sampling_layer):
    tree, layer, H = sampling_layer
    a = ancestral_sample(tree, layer.weight, layer.bias, H[:500], torch.Generator().manual_seed(5))
    b = ancestral_sample(tree, layer.weight, layer.bias, H[:500], torch.Generator().manual_seed(5))
    c = ancestral_sample(tree, layer.weight, layer.bias, H[:500], torch.Generator().manual_seed(6))
    assert torch.equal(a, b) and not torch.equal(a, c)
    with pytest.raises(ValueError, match="temperature"):
        sample_from_log_prob(torch.zeros(1, 3), None, 0.0)
    # A tiny temperature is the argmax, not NaN (lp / T alone would be -inf for every word).
    lp = torch.log_softmax(torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 1.0]]), dim=1)
    assert sample_from_log_prob(lp, torch.Generator().manual_seed(0), 1e-320).tolist() == [1, 0]


@pytest.mark.parametrize("output", ["tree", "flat"])
def test_generate_is_reproducible(output):
    tree = random_tree(40, 0) if output == "tree" else None
    model = LBL(LBLConfig(40, dim=8, context=3, output=output), tree, torch.Generator().manual_seed(0))
    runs = [
        model.generate([1, 2], 30, 0, torch.Generator().manual_seed(s), temperature=t)
        for s, t in ((3, 1.0), (3, 1.0), (4, 1.0), (3, 0.7))
    ]
    assert runs[0] == runs[1] and runs[0] != runs[2] and runs[0] != runs[3]
    assert all(len(r) == 30 and all(0 <= w < 40 for w in r) for r in runs)


def test_torch_uniforms_are_a_seeded_torch_generators_stream():
    for seed in (0, 7, 123456789, 2**32 + 5):
        g, u = torch.Generator().manual_seed(seed), TorchUniforms(seed)
        for shape in ((1, 14), (3, 20), (1, 1), (0, 5), (2, 40)):
            np.testing.assert_array_equal(u.random(shape), torch.rand(*shape, generator=g, dtype=torch.float64).numpy())
    with pytest.raises(ValueError, match="at least 0"):
        TorchUniforms(-1)


def test_inverse_cdf_draws_as_sample_from_log_prob():
    lp = torch.log_softmax(torch.randn(50, 30, generator=torch.Generator().manual_seed(1), dtype=torch.float64), 1)
    for t in (1.0, 0.3, 4.0):
        want = sample_from_log_prob(lp, torch.Generator().manual_seed(2), t).numpy()
        np.testing.assert_array_equal(inverse_cdf(lp.numpy(), TorchUniforms(2).random((50, 1))[:, 0], t), want)
    with pytest.raises(ValueError, match="cannot sample"):
        inverse_cdf(np.full((1, 4), np.nan), np.zeros(1))


def test_sampling_refuses_a_distribution_without_mass():
    for bad in (torch.full((1, 4), float("nan")), torch.full((1, 4), -float("inf"))):
        with pytest.raises(ValueError, match="cannot sample"):
            sample_from_log_prob(bad, torch.Generator().manual_seed(0), 0.7)


def test_generate_needs_a_whole_token_count():
    model = LBL(LBLConfig(10, dim=4, context=2), random_tree(10, 0), torch.Generator().manual_seed(0))
    for bad in (3.0, -1, True):
        with pytest.raises(ValueError, match="num_tokens"):
            model.generate([1], bad, 0)


def test_nan_weights_are_refused_not_sampled_from():
    tree = duplicated_tree(12, 5, 0)
    layer = TreeSoftmax(4, tree)
    with torch.no_grad():
        layer.weight.normal_(generator=torch.Generator().manual_seed(0))
        layer.weight[0, 0] = float("nan")  # the root: every walk starts there
    with pytest.raises(ValueError, match="cannot sample"):
        ancestral_sample(tree, layer.weight, layer.bias, torch.ones(3, 4), torch.Generator().manual_seed(0))
