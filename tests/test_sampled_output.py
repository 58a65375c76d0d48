"""NCE and sampled-softmax output layers: losses and gradients against direct formulas, exact
evaluation, reproducible noise, save/load, and the CLI end to end."""

import json
import math

import numpy as np
import pytest
import torch

from conftest import tiny_corpus
from hlbl import checkpoint as ckpt
from hlbl import run as hrun
from hlbl.cli import main
from hlbl.data import batches, load_corpus
from hlbl.evaluate import evaluate, self_normalisation
from hlbl.model import LBL, LBLConfig
from hlbl.output import OUTPUT_KINDS, make_output_layer
from hlbl.output import NCEOutput, SampledSoftmax, noise_seed
from hlbl.config import TrainConfig
from hlbl.run import fit

V, D, B = 13, 4, 6


def layer(kind, k=5, power=1.0, seed=0):
    torch.manual_seed(seed)
    lay = make_output_layer(kind, D, V, samples=k, noise_power=power).double()
    with torch.no_grad():
        lay.weight.normal_(0, 0.5)
    lay.init_unigram(np.arange(1, V + 1) ** 2)
    with torch.no_grad():
        lay.bias.add_(torch.randn(V, dtype=torch.float64) * 0.3)
    return lay


def case(seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(B, D, generator=g, dtype=torch.float64)
    target = torch.tensor([0, 3, 3, 12, 7, 1])
    noise = torch.tensor([3, 5, 5, 12, 0])  # a duplicate (5), and hits of examples' targets (3, 12, 0)
    return h, target, noise


def grads(lay, h, target, noise):
    h = h.clone().requires_grad_(True)
    lay.zero_grad()
    out = lay(h, target, noise=noise)
    (out.loss * len(target)).backward()  # the summed loss, as the training loop takes it
    return out, h.grad, lay.weight.grad.clone(), lay.bias.grad.clone()


def per_example(noise, B):
    """(B, k) noise ids of each example: a (k,) draw is shared by all; (G, k) gives group g the
    examples [g m, (g+1) m), m = ceil(B / G) (written out with a loop, not the layer's repeat)."""
    if noise.dim() == 1:
        return np.tile(noise.numpy(), (B, 1))
    m = -(-B // noise.shape[0])
    return np.stack([noise[i // m].numpy() for i in range(B)])


def direct_grads(lay, h, target, noise, ds_t, ds_n):
    """Gradients of sum_i loss_i from d loss_i / d s(target_i) (B,) and d loss_i / d s(noise_ij) (B, k),
    written out without autograd: ds/dq_w = h, ds/db_w = 1, ds/dh = q_w. ``noise``: (B, k) ids."""
    W, b = lay.weight.detach().numpy(), lay.bias.detach().numpy()
    gW, gb = np.zeros_like(W), np.zeros_like(b)
    gh = np.zeros((len(target), W.shape[1]))
    hn = h.numpy()
    for i, t in enumerate(target.tolist()):
        gW[t] += ds_t[i] * hn[i]
        gb[t] += ds_t[i]
        gh[i] += ds_t[i] * W[t]
        for j, w in enumerate(noise[i].tolist()):
            gW[w] += ds_n[i, j] * hn[i]
            gb[w] += ds_n[i, j]
            gh[i] += ds_n[i, j] * W[w]
    return gh, gW, gb


def sig(x):
    return 1 / (1 + np.exp(-x))


GROUPED = torch.tensor([[3, 5, 5, 12, 0], [1, 1, 7, 9, 2], [12, 4, 6, 0, 3]])  # 3 groups of 2 examples


@pytest.mark.parametrize("grouped", [False, True])
def test_nce_loss_and_gradients_match_the_formula(grouped):
    lay = layer("nce")
    assert isinstance(lay, NCEOutput)
    h, target, noise = case()
    if grouped:
        noise = GROUPED
    out, gh, gW, gb = grads(lay, h, target, noise)
    noise = per_example(noise, B)
    W, b = lay.weight.detach().numpy(), lay.bias.detach().numpy()
    logpn = lay.noise_log_prob.numpy()
    k = noise.shape[1]
    s_t = (h.numpy() * W[target]).sum(1) + b[target]
    s_n = np.einsum("bd,bkd->bk", h.numpy(), W[noise]) + b[noise]
    d_t = s_t - np.log(k) - logpn[target]
    d_n = s_n - np.log(k) - logpn[noise]
    loss = -(np.log(sig(d_t)) + np.log(sig(-d_n)).sum(1))  # hits and duplicates kept: NCE's estimator
    np.testing.assert_allclose(-out.output.detach().numpy(), loss, rtol=1e-10)
    assert out.loss.item() == pytest.approx(loss.mean(), rel=1e-12)
    # d loss / d delta_t = -(1 - sigmoid(delta_t)); d loss / d delta_n = sigmoid(delta_n)
    eh, eW, eb = direct_grads(lay, h, target, noise, -(1 - sig(d_t)), sig(d_n))
    np.testing.assert_allclose(gh.numpy(), eh, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(gW.numpy(), eW, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(gb.numpy(), eb, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("grouped", [False, True])
def test_sampled_softmax_loss_and_gradients_match_the_formula(grouped):
    lay = layer("sampled")
    assert isinstance(lay, SampledSoftmax)
    h, target, noise = case()
    if grouped:
        noise = GROUPED
    out, gh, gW, gb = grads(lay, h, target, noise)
    noise = per_example(noise, B)
    W, b = lay.weight.detach().numpy(), lay.bias.detach().numpy()
    logq = lay.noise_log_prob.numpy()
    s_t = (h.numpy() * W[target]).sum(1) + b[target]
    s_n = np.einsum("bd,bkd->bk", h.numpy(), W[noise]) + b[noise]
    logits = np.concatenate([(s_t - logq[target])[:, None], s_n - logq[noise]], 1)
    hit = noise == target.numpy()[:, None]  # (B, k)
    assert hit.any()  # the case exercises accidental hits
    logits[:, 1:][hit] = -np.inf
    m = logits.max(1, keepdims=True)
    p = np.exp(logits - m) / np.exp(logits - m).sum(1, keepdims=True)
    loss = -np.log(p[:, 0])
    np.testing.assert_allclose(-out.output.detach().numpy(), loss, rtol=1e-10)
    # d loss / d s_t = -(1 - p_0); d loss / d s_nj = p_j (0 for a hit: it is not in the softmax)
    eh, eW, eb = direct_grads(lay, h, target, noise, -(1 - p[:, 0]), p[:, 1:])
    np.testing.assert_allclose(gh.numpy(), eh, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(gW.numpy(), eW, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(gb.numpy(), eb, rtol=1e-9, atol=1e-12)


def test_sampled_softmax_over_every_word_with_uniform_noise_is_the_full_softmax():
    """With every word drawn once, a uniform Q (power 0) and the target's hit removed, the sampled
    softmax is the exact one: a check of the correction and of the hit removal together."""
    lay = layer("sampled", power=0.0)
    h, target, _ = case()
    out = lay(h, target, noise=torch.arange(V))
    exact = torch.log_softmax(h @ lay.weight.T + lay.bias, 1)[torch.arange(B), target]
    torch.testing.assert_close(out.output, exact)
    lay.eval()
    torch.testing.assert_close(lay(h, target).output, exact)


def test_eval_mode_and_inference_are_the_full_softmax():
    for kind in ("nce", "sampled"):
        lay = layer(kind)
        h, target, _ = case(1)
        W, b = lay.weight.detach().numpy(), lay.bias.detach().numpy()
        logits = h.numpy() @ W.T + b  # an independent full softmax, in numpy
        m = logits.max(1, keepdims=True)
        lp = logits - m - np.log(np.exp(logits - m).sum(1, keepdims=True))
        np.testing.assert_allclose(lay.log_prob(h).detach().numpy(), lp, rtol=1e-10)
        np.testing.assert_allclose(
            lay.target_log_prob(h, target).detach().numpy(), lp[np.arange(B), target], rtol=1e-10
        )
        lay.eval()
        np.testing.assert_allclose(lay(h, target).output.detach().numpy(), lp[np.arange(B), target], rtol=1e-10)
        vals, idx = lay.topk(h, 3)
        np.testing.assert_array_equal(idx.numpy(), np.argsort(-lp, 1, kind="stable")[:, :3])
        np.testing.assert_allclose(lay.log_normaliser(h).detach().numpy(), np.log(np.exp(logits).sum(1)), rtol=1e-10)


def test_init_unigram_starts_self_normalised_and_sets_the_noise():
    counts = np.array([50, 20, 10, 10, 5, 3, 1, 1])
    for power in (1.0, 0.75, 0.0):
        lay = make_output_layer("nce", 3, 8, noise_power=power)
        lay.init_unigram(counts)
        p = counts / counts.sum()
        q = p**power / (p**power).sum()
        np.testing.assert_allclose(lay.noise_log_prob.exp().numpy(), q, rtol=1e-5)
        # zero weights: s(w, h) = log p(w), so Z = 1 exactly
        assert lay.log_normaliser(torch.randn(2, 3)).abs().max().item() < 1e-5


@pytest.mark.parametrize("share,groups", [(0, 1), (1, 7), (3, 3), (25, 1)])
def test_forward_draws_one_noise_sample_per_group_of_examples(share, groups, monkeypatch):
    lay = make_output_layer("nce", D, V, samples=4, noise_share=share)
    lay.init_unigram(np.arange(1, V + 1))
    asked = []
    draw = lay.draw_noise
    monkeypatch.setattr(lay, "draw_noise", lambda g=1: asked.append(g) or draw(g))
    lay(torch.randn(7, D), torch.arange(7))
    assert asked == [groups]


def test_noise_is_reproducible_and_follows_the_distribution():
    counts = np.array([60, 25, 10, 4, 1] + [0] * 3)
    a, b = (make_output_layer("nce", 3, 8, samples=20) for _ in range(2))
    for lay in (a, b):
        lay.init_unigram(counts)
        lay.reseed(noise_seed(7, 3))
    da = torch.cat([a.draw_noise() for _ in range(5)])
    db = torch.cat([b.draw_noise() for _ in range(5)])
    assert torch.equal(da, db)
    b.reseed(noise_seed(7, 4))
    assert not torch.equal(da, torch.cat([b.draw_noise() for _ in range(5)]))
    assert noise_seed(7, 3) != noise_seed(7, 4) != noise_seed(8, 3)
    # frequencies: 200k draws, every word within 4 standard deviations of k * q(w)
    big = make_output_layer("sampled", 3, 8, samples=200_000)
    big.init_unigram(counts)
    got = np.bincount(big.draw_noise().numpy(), minlength=8)
    q = big.noise_log_prob.exp().double().numpy()
    sd = np.sqrt(200_000 * q * (1 - q))
    assert np.all(np.abs(got - 200_000 * q) <= 4 * sd + 1), (got, 200_000 * q)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="sample"):
        make_output_layer("nce", 3, 8, samples=0)
    with pytest.raises(ValueError, match="noise power"):
        make_output_layer("sampled", 3, 8, noise_power=-1)
    with pytest.raises(ValueError):
        LBLConfig(8, output="nce", samples=0)
    with pytest.raises(ValueError):
        LBLConfig(8, output="nce", noise_share=-1)
    assert {"nce", "sampled"} <= set(OUTPUT_KINDS)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return load_corpus(tiny_corpus(tmp_path_factory.mktemp("c") / "corpus", n_train=400))


def train(tmp_path, name, corpus, kind="nce", epochs=2, seed=0, k=4):
    Vc = len(corpus.vocab)
    model = LBL(LBLConfig(Vc, dim=8, context=3, output=kind, samples=k), None, torch.Generator().manual_seed(seed))
    model.init_unigram(corpus.vocab.counts)
    cfg = TrainConfig(batch_size=64, max_epochs=epochs, seed=seed, progress=False, lr_final=0)
    fit(model, corpus, cfg, tmp_path / name, log=lambda *a: None)
    return model


def independent_perplexity(model, stream, pad):
    """exp(mean NLL) from numpy: r_hat from R and C, then the full softmax over V."""
    R, C = model.R.weight.detach().double().numpy(), model.C.detach().double().numpy()
    W, b = model.out.weight.detach().double().numpy(), model.out.bias.detach().double().numpy()
    nll = 0.0
    for ctx, tgt in batches(stream, model.config.context, 1000, pad):
        h = (R[ctx] * C).sum(1)
        logits = h @ W.T + b
        m = logits.max(1, keepdims=True)
        lse = m[:, 0] + np.log(np.exp(logits - m).sum(1))
        nll += (lse - logits[np.arange(len(tgt)), tgt]).sum()
    return math.exp(nll / len(stream))


@pytest.mark.parametrize("kind", ["nce", "sampled"])
def test_training_learns_and_exact_perplexity_ignores_the_scale_of_the_scores(tmp_path, corpus, kind):
    pad = corpus.vocab.eos
    model = train(tmp_path, kind, corpus, kind, epochs=4)
    test = corpus["test"]
    ppl = evaluate(model, test, pad)["perplexity"]
    unigram = np.asarray(corpus.vocab.counts, float)
    unigram = unigram[unigram > 0] / unigram.sum()
    assert ppl < 0.6 * math.exp(-(unigram * np.log(unigram)).sum())  # it learned the toy grammar
    assert ppl == pytest.approx(independent_perplexity(model, test, pad), rel=1e-5)
    norm = self_normalisation(model, test, pad)
    assert norm["perplexity"] == pytest.approx(ppl, rel=1e-5)
    # Shift every score by 3: the softmax (and so the exact perplexity) is unchanged, while anything
    # computed from the unnormalised scores would move by a factor e^3.
    model.train()  # evaluate() must score in eval mode whatever mode it is given
    with torch.no_grad():
        model.out.bias += 3.0
    assert evaluate(model, test, pad)["perplexity"] == pytest.approx(ppl, rel=1e-5)
    shifted = self_normalisation(model, test, pad)
    assert shifted["log_z_mean"] == pytest.approx(norm["log_z_mean"] + 3.0, abs=1e-4)
    assert shifted["perplexity_trusting_z1"] == pytest.approx(norm["perplexity_trusting_z1"] * math.exp(-3.0), rel=1e-4)
    assert model.training  # the mode it was given is restored


def test_fixed_seed_same_run_other_seed_other_noise_and_resume_is_exact(tmp_path, corpus):
    a = train(tmp_path, "a", corpus, epochs=3)
    b = train(tmp_path, "b", corpus, epochs=3)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    # Same initial weights (generator seed 0), another run seed: only the order and the noise differ.
    Vc = len(corpus.vocab)
    c = LBL(LBLConfig(Vc, dim=8, context=3, output="nce", samples=4), None, torch.Generator().manual_seed(0))
    c.init_unigram(corpus.vocab.counts)
    fit(
        c,
        corpus,
        TrainConfig(batch_size=64, max_epochs=3, seed=1, progress=False, lr_final=0),
        tmp_path / "c",
        log=lambda *x: None,
    )
    assert not torch.equal(a.out.weight, c.out.weight)
    # 2 epochs, then resume to 3: the same weights as 3 straight (the noise restarts per epoch).
    half = train(tmp_path, "half", corpus, epochs=2)
    resumed = LBL(LBLConfig(Vc, dim=8, context=3, output="nce", samples=4), None, init=False)
    fit(
        resumed,
        corpus,
        TrainConfig(batch_size=64, max_epochs=3, progress=False, lr_final=0),
        tmp_path / "half",
        resume=True,
        log=lambda *x: None,
    )
    lines = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    if all(x["improved"] for x in lines):  # both hold the epoch-3 weights (best = last)
        assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), resumed.state_dict().values()))
    else:  # early stopping picked an earlier epoch: compare the last checkpoints
        la, _ = ckpt.load_tensors_and_meta(tmp_path / "a" / "last.safetensors")
        lr, _ = ckpt.load_tensors_and_meta(tmp_path / "half" / "last.safetensors")
        assert all(torch.equal(la[k], lr[k]) for k in la)
    assert half is not None


def test_save_and_load_give_identical_log_probs_and_noise(tmp_path, corpus):
    model = train(tmp_path, "r", corpus, "sampled", epochs=1)
    loaded, _, info = hrun.load_model(tmp_path / "r")
    assert info.model.output == "sampled" and info.model.samples == 4
    ctx = torch.from_numpy(next(batches(corpus["test"], 3, 50, corpus.vocab.eos))[0])
    assert torch.equal(model.log_prob(ctx), loaded.log_prob(ctx))
    assert torch.equal(model.out.noise_log_prob, loaded.out.noise_log_prob)
    model.out.reseed(5)
    loaded.out.reseed(5)
    assert torch.equal(model.out.draw_noise(), loaded.out.draw_noise())


def test_cli_trains_nce_end_to_end_and_reports_self_normalisation(tmp_path, capsys):
    data = tiny_corpus(tmp_path / "corpus")
    run = tmp_path / "r"
    assert (
        main(
            [
                "train",
                "--data",
                str(data),
                "--out",
                str(run),
                "--epochs",
                "2",
                "--dim",
                "8",
                "--output",
                "nce",
                "--samples",
                "3",
                "--noise-power",
                "0.75",
                "--quiet",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out.splitlines()
    result = json.loads(out[0])
    assert 1 < result["test_perplexity"] < 30  # 22 words
    norm = result["test_self_normalisation"]
    assert norm["perplexity"] == pytest.approx(result["test_perplexity"], rel=1e-5)
    assert set(norm["log_z_percentiles"]) == {"p1", "p5", "p25", "p50", "p75", "p95", "p99"}
    info = json.loads((run / "run.json").read_text())
    assert info["model"]["samples"] == 3 and info["model"]["noise_power"] == 0.75
    assert main(["eval", str(run), "--split", "test", "--device", "cpu"]) == 0
    ev = json.loads(capsys.readouterr().out)
    assert ev["perplexity"] == pytest.approx(result["test_perplexity"], rel=1e-6)
    assert ev["self_normalisation"]["log_z_mean"] == pytest.approx(norm["log_z_mean"], rel=1e-6)
    # flags that would be ignored are errors
    assert main(["train", "--data", str(data), "--out", str(tmp_path / "x"), "--samples", "3"]) == 2
    assert "--samples" in capsys.readouterr().err
    assert (
        main(["train", "--data", str(data), "--out", str(tmp_path / "x"), "--output", "flat", "--noise-share", "5"])
        == 2
    )
    assert "--noise-share" in capsys.readouterr().err


def test_train_help_lists_the_output_kinds(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = capsys.readouterr().out
    assert "nce" in text and "sampled" in text and "--samples" in text and "--noise-power" in text
    assert "--noise-share" in text
