"""Kneser-Ney baseline: hand-computed tables, a brute-force reference, normalisation, back-off,
ARPA round trip and errors, KenLM agreement, interpolation, the CLI, and PTB reference numbers."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections import Counter, defaultdict
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from conftest import ptb_root
from hlbl.data import EOS, DataError, Vocab, load_corpus
from hlbl.ngram import (
    ArpaError,
    NgramModel,
    interpolate,
    modified_kn_discounts,
    parse_arpa,
    read_arpa,
    token_log_probs,
    train_kneser_ney,
    tune_weight,
    write_arpa,
)
from hlbl.ngram.binary import write_binary
from hlbl.ngram.cache import read_protocol
from hlbl.ngram.kneser_ney import FALLBACK_DISCOUNTS
from hlbl.data import TextProtocol
from hlbl.ngram.protocol import make_protocol

# ---------------------------------------------------------------------------------- helpers

_FMT_FIRST_UNIGRAM = re.compile(r"\\1-grams:\n(-[0-9.]+[0-9])\t(\S+)")


def make_vocab(sentences, max_vocab=None) -> Vocab:
    c = Counter(w for s in sentences for w in s)
    c[EOS] += len(sentences)
    return Vocab.from_counts(c, max_vocab=max_vocab)


def make_stream(sentences, vocab: Vocab) -> np.ndarray:
    return np.asarray([i for s in sentences for i in vocab.encode(s) + [vocab.eos]], dtype=np.int32)


def zipf_sentences(rng, n, n_words=40, max_len=12):
    words = [f"w{i}" for i in range(n_words)]
    p = 1.0 / np.arange(1, n_words + 1)
    p /= p.sum()
    return [[words[i] for i in rng.choice(n_words, size=rng.integers(1, max_len), p=p)] for _ in range(n)]


@pytest.fixture(scope="module")
def small():
    """A 3-gram model on 400 Zipfian sentences; vocabulary capped so <unk> is a real word."""
    rng = np.random.default_rng(0)
    train = zipf_sentences(rng, 400)
    test = [s + (["never-seen"] if rng.random() < 0.3 else []) for s in zipf_sentences(rng, 60)]
    vocab = make_vocab(train, max_vocab=30)
    model = train_kneser_ney(make_stream(train, vocab), vocab, 3)
    return train, test, vocab, model


def prob(model: NgramModel, context, word) -> float:
    """p(word | context) under the model's back-off rule (ARPA words)."""
    ids = list(model.word_ids(list(context) + [word]))
    return 10 ** float(model.score_windows(np.asarray([ids]))[0])


# ---------------------------------------------------------------------- hand-computed tables


def test_discounts_by_hand():
    # n1=4, n2=2, n3=1, n4=1: Y = 4/(4+4) = 1/2; D1 = 1 - 2 Y 2/4 = 1/2;
    # D2 = 2 - 3 Y 1/2 = 5/4; D3 = 3 - 4 Y 1/1 = 1. Counts of 5 and 0 do not enter.
    a = np.array([1, 1, 1, 1, 2, 2, 3, 4, 5, 0])
    d, ok = modified_kn_discounts(a)
    assert ok and d == pytest.approx((0.5, 1.25, 1.0), abs=1e-12)
    # No n-gram with count 3: the discounts are undefined -> KenLM's fallback.
    d, ok = modified_kn_discounts(np.array([1, 1, 2, 4]))
    assert not ok and d == FALLBACK_DISCOUNTS


def test_unigram_table_by_hand():
    # Raw counts a:4 b:3 c:2 d:1 <eos>:4 -> n1=n2=n3=1, n4=2: Y=1/3, D=(1/3, 1, 1/3).
    sents = [["a", "b", "c", "d"], ["a", "b", "c"], ["a", "b"], ["a"]]
    vocab = make_vocab(sents)
    model = train_kneser_ney(make_stream(sents, vocab), vocab, 1)
    d1, d2, d3 = Fraction(1, 3), Fraction(1), Fraction(1, 3)
    assert model.discounts[0] == pytest.approx((float(d1), float(d2), float(d3)), abs=1e-12)
    # gamma = (D1*1 + D2*1 + D3*3) / 14 = 1/6, spread uniformly over V = 6 words (<unk> too).
    total, gamma, V = 14, Fraction(1, 6), 6
    counts = {"a": 4, "b": 3, "c": 2, "d": 1, "</s>": 4, "<unk>": 0}
    disc = {0: 0, 1: d1, 2: d2, 3: d3}
    for w, c in counts.items():
        expect = Fraction(c) - disc[min(c, 3)]
        expect = expect / total + gamma / V
        assert model.lookup([w])[0] == pytest.approx(math.log10(expect), abs=1e-12), w
    assert model.lookup(["<s>"])[0] == -99.0


def test_bigram_table_by_hand():
    # <s> a b </s> twice, <s> b a </s> once. Bigram (top order) raw counts: <s>a 2, ab 2,
    # b</s> 2, <s>b 1, ba 1, a</s> 1 -> n3 = 0, so both orders use the fallback (1/2, 1, 3/2).
    sents = [["a", "b"], ["a", "b"], ["b", "a"]]
    vocab = make_vocab(sents)
    model = train_kneser_ney(make_stream(sents, vocab), vocab, 2)
    assert model.discounts == [FALLBACK_DISCOUNTS, FALLBACK_DISCOUNTS]
    # Unigram continuation counts: a {<s>, b} = 2, b {<s>, a} = 2, </s> {a, b} = 2, <unk> 0.
    # total 6, gamma() = 3 * D2 / 6 = 1/2 over V = 4: p(a) = (2-1)/6 + 1/8 = 7/24, p(<unk>) = 1/8.
    uni = {"a": Fraction(7, 24), "b": Fraction(7, 24), "</s>": Fraction(7, 24), "<unk>": Fraction(1, 8)}
    for w, p in uni.items():
        assert model.lookup([w])[0] == pytest.approx(math.log10(p), abs=1e-12)
    # Context <s>: a 2, b 1 -> denominator 3, gamma(<s>) = (D2 + D1) / 3 = 1/2.
    # p(a|<s>) = 1/3 + 1/2 * 7/24 = 23/48; p(b|<s>) = 1/2/3 + 7/48 = 15/48.
    assert model.lookup(["<s>", "a"])[0] == pytest.approx(math.log10(23 / 48), abs=1e-12)
    assert model.lookup(["<s>", "b"])[0] == pytest.approx(math.log10(15 / 48), abs=1e-12)
    assert model.lookup(["<s>"])[1] == pytest.approx(math.log10(0.5), abs=1e-12)
    assert model.lookup(["a", "b"])[0] == pytest.approx(math.log10(23 / 48), abs=1e-12)
    assert model.lookup(["b", "a"])[0] == pytest.approx(math.log10(15 / 48), abs=1e-12)
    # Unseen bigrams back off: p(</s>|<s>) = 1/2 * 7/24, p(<unk>|a) = 1/2 * 1/8.
    assert model.lookup(["<s>", "</s>"]) is None
    assert prob(model, ["<s>"], "</s>") == pytest.approx(7 / 48, abs=1e-12)
    assert prob(model, ["a"], "<unk>") == pytest.approx(1 / 16, abs=1e-12)
    # </s> and <unk> are never contexts: no back-off weight.
    assert model.lookup(["</s>"])[1] == 0.0 and model.lookup(["<unk>"])[1] == 0.0


def reference_kn(sentences, vocab_words, order):
    """Brute-force dictionary version of the module docstring's formulas (slow, obvious)."""
    seqs = [["<s>"] + s + ["</s>"] for s in sentences]
    raw = [Counter() for _ in range(order + 1)]
    for s in seqs:
        for k in range(1, order + 1):
            for i in range(len(s) - k + 1):
                if not (k == 1 and s[i] == "<s>"):
                    raw[k][tuple(s[i : i + k])] += 1
    adj = [None] * (order + 1)
    adj[order] = dict(raw[order])
    for k in range(order - 1, 0, -1):
        left = defaultdict(set)
        for g in raw[k + 1]:
            left[g[1:]].add(g[0])
        adj[k] = {g: (c if g[0] == "<s>" else len(left[g])) for g, c in raw[k].items()}
    disc = {}
    for k in range(1, order + 1):
        n = Counter(adj[k].values())  # n[j]: n-grams with adjusted count exactly j
        if min(n[1], n[2], n[3]) == 0:
            d = FALLBACK_DISCOUNTS
        else:
            y = n[1] / (n[1] + 2 * n[2])
            d = tuple(j - (j + 1) * y * n[j + 1] / n[j] for j in (1, 2, 3))
            if any(not 0 <= dj <= j for j, dj in zip((1, 2, 3), d)):
                d = FALLBACK_DISCOUNTS
        disc[k] = d
    D = lambda k, c: 0.0 if c == 0 else disc[k][min(c, 3) - 1]  # noqa: E731
    words = [w for w in vocab_words if w != "<s>"]
    total = sum(adj[1].get((w,), 0) for w in words)
    gamma0 = sum(D(1, adj[1].get((w,), 0)) for w in words) / total
    p = {(w,): (adj[1].get((w,), 0) - D(1, adj[1].get((w,), 0))) / total + gamma0 / len(words) for w in words}
    gamma = {}
    for k in range(2, order + 1):
        by_ctx = defaultdict(list)
        for g, c in adj[k].items():
            by_ctx[g[:-1]].append(c)
        for h, cs in by_ctx.items():
            gamma[h] = sum(D(k, c) for c in cs) / sum(cs)
        for g, c in adj[k].items():
            p[g] = (c - D(k, c)) / sum(by_ctx[g[:-1]]) + gamma[g[:-1]] * p[g[1:]]
    return p, gamma, disc


def test_matches_brute_force_reference(small):
    train, _, vocab, model = small
    words = [w if w != EOS else "</s>" for w in vocab.words]
    mapped = [[w if w in vocab.index else "<unk>" for w in s] for s in train]
    p, gamma, disc = reference_kn(mapped, words, 3)
    assert [tuple(d) for d in model.discounts] == [pytest.approx(disc[k], abs=1e-12) for k in (1, 2, 3)]
    assert sum(model.sizes()) == len(p) + 1  # + the <s> unigram
    for g, pg in p.items():
        lp, bo = model.lookup(list(g))
        assert lp == pytest.approx(math.log10(pg), abs=1e-10), g
        assert bo == pytest.approx(math.log10(gamma.get(g, 1.0)), abs=1e-10), g
    assert model.lookup(["<s>"])[1] == pytest.approx(math.log10(gamma[("<s>",)]), abs=1e-10)


# --------------------------------------------------------------- normalisation and back-off


def test_distributions_sum_to_one(small):
    _, _, _, model = small
    rng = np.random.default_rng(1)
    targets = np.asarray([i for i, w in enumerate(model.words) if w != "<s>"])
    seen = model.keys[2] // model.base  # rows of bigrams that are contexts of trigrams
    contexts = []
    for row in rng.choice(np.unique(seen), 5, replace=False):  # seen 2-word contexts
        contexts.append(list(np.divmod(model.keys[1][row], model.base)))
    contexts += [list(rng.choice(targets, 2)) for _ in range(5)]  # random, mostly unseen
    contexts += [[-1, model.bos], [model.bos, int(targets[0])], [-1, -1]]  # sentence starts, none
    n_unseen = 0
    for ctx in contexts:
        win = np.column_stack([np.tile(ctx, (len(targets), 1)), targets])
        n_unseen += int(model.lookup_rows(np.asarray([ctx]))[0] < 0)
        total = np.sum(10.0 ** model.score_windows(win))
        assert total == pytest.approx(1.0, abs=1e-9), ctx
    assert n_unseen >= 2  # the check covered unseen contexts too


def test_backoff_rule(small):
    _, _, _, model = small
    w = model.words
    # Find a seen bigram context (u v) and a word x with (u v x) unseen but (v x) seen.
    for row in range(len(model.keys[1])):
        u, v = np.divmod(model.keys[1][row], model.base)
        if model.log10_backoff[1][row] == 0.0:
            continue
        for x in range(model.base):
            if w[x] == "<s>":
                continue
            if model.lookup([w[u], w[v], w[x]]) is None and model.lookup([w[v], w[x]]) is not None:
                bo = model.lookup([w[u], w[v]])[1]
                expect = bo + model.lookup([w[v], w[x]])[0]
                assert math.log10(prob(model, [w[u], w[v]], w[x])) == pytest.approx(expect, abs=1e-12)
                break
        else:
            continue
        break
    else:
        pytest.fail("no seen context with an unseen continuation")
    # An unseen context has back-off weight 1: p(x | unseen u v) = bo(v) p(x | ) or p(x | v).
    unseen = next(
        (a, b)
        for a in range(model.base)
        for b in range(model.base)
        if "<s>" not in (w[a], w[b]) and model.lookup([w[a], w[b]]) is None
    )
    a, b = unseen
    for x in range(model.base):
        if w[x] != "<s>":
            assert prob(model, [w[a], w[b]], w[x]) == pytest.approx(prob(model, [w[b]], w[x]), rel=1e-12)


# ------------------------------------------------------------------------------------ ARPA


def test_arpa_round_trip(small, tmp_path):
    _, test, _, model = small
    path = tmp_path / "m.arpa"
    write_arpa(model, path)
    text = path.read_text()
    assert text.startswith("\\data\\\nngram 1=") and text.rstrip().endswith("\\end\\")
    for special in ("<s>", "</s>", "<unk>"):
        assert f"\t{special}" in text
    back = read_arpa(path, cache=False)  # really parse the text
    assert back.words == model.words and back.sizes() == model.sizes()
    for k in range(model.order):
        np.testing.assert_array_equal(back.keys[k], model.keys[k])
        np.testing.assert_allclose(back.log10_prob[k], model.log10_prob[k], rtol=1e-7, atol=1e-7)
        np.testing.assert_allclose(back.log10_backoff[k], model.log10_backoff[k], rtol=1e-7, atol=1e-7)
    np.testing.assert_allclose(back.score_sentences(test), model.score_sentences(test), atol=1e-5)


def test_binary_form_round_trip_and_errors(small, tmp_path, monkeypatch, capsys):
    """The safetensors form holds the model exactly (no 8-digit rounding), read_arpa and the CLI
    recognise it by content, and a damaged or foreign file is a one-line error."""
    from hlbl.ngram.binary import is_binary, write_binary

    _, test, vocab, model = small
    path = tmp_path / "m.safetensors"
    write_binary(model, path)
    assert is_binary(path) and not is_binary(tmp_path / "missing")
    back = read_arpa(path)
    assert back.words == model.words
    for k in range(model.order):
        np.testing.assert_array_equal(back.keys[k], model.keys[k])
        np.testing.assert_array_equal(back.log10_prob[k], model.log10_prob[k])
        np.testing.assert_array_equal(back.log10_backoff[k], model.log10_backoff[k])
    np.testing.assert_array_equal(back.score_sentences(test), model.score_sentences(test))
    arpa = tmp_path / "m.arpa"
    write_arpa(model, arpa)
    assert not is_binary(arpa)
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(DataError, match="damaged n-gram model"):
        read_arpa(cut)
    from safetensors.numpy import save_file

    other = tmp_path / "other.safetensors"
    save_file({"x": np.zeros(3)}, str(other), metadata={"format": "something-else"})
    with pytest.raises(DataError, match="not an hlbl n-gram model"):
        read_arpa(other)
    import hlbl.cli as cli

    monkeypatch.setenv("HLBL_CACHE", str(tmp_path / "cache"))
    data = _write_corpus(tmp_path / "toy", np.random.default_rng(4))
    for name in ("kn3.arpa", "kn3.safetensors"):
        assert cli.main(["ngram", "train", "--data", str(data), "--order", "3", "--out", str(tmp_path / name)]) == 0
        capsys.readouterr()
        assert cli.main(["ngram", "eval", str(tmp_path / name), "--data", str(data)]) == 0
        rep = json.loads(capsys.readouterr().out)
        if name.endswith("arpa"):
            first = rep["perplexity"]
    assert is_binary(tmp_path / "kn3.safetensors")
    assert rep["perplexity"] == pytest.approx(first, rel=1e-6)


def test_arpa_binary_cache(small, tmp_path, monkeypatch):
    monkeypatch.setenv("HLBL_CACHE", str(tmp_path / "cache"))
    _, test, _, model = small
    path = tmp_path / "m.arpa"
    write_arpa(model, path)  # leaves the parsed form in the cache
    assert len(list((tmp_path / "cache" / "arpa").glob("*.npz"))) == 1
    parsed = parse_arpa(path.read_bytes())
    for m in (read_arpa(path), read_arpa(path, cache=False)):
        assert m.words == parsed.words
        for k in range(parsed.order):  # bit for bit what parsing the text gives
            np.testing.assert_array_equal(m.keys[k], parsed.keys[k])
            np.testing.assert_array_equal(m.log10_prob[k], parsed.log10_prob[k])
            np.testing.assert_array_equal(m.log10_backoff[k], parsed.log10_backoff[k])
    # A changed file is parsed again, not served from the stale copy.
    path.write_text(corrupt(7, "-0.25\ta\t-0.3"))
    assert read_arpa(path).lookup(["a"]) == (-0.25, -0.3)
    # A damaged copy is ignored.
    for f in (tmp_path / "cache" / "arpa").glob("*.npz"):
        f.write_bytes(b"junk")
    assert read_arpa(path).lookup(["a"]) == (-0.25, -0.3)


def test_arpa_missing_contexts_become_blanks():
    # The file lists "a b c" but not "a b": it is added with back-off 0 and the probability
    # the back-off rule gives, so scores are as if it were absent; no <unk>: it gets -100.
    text = "\n".join(
        [
            "\\data\\",
            "ngram 1=4",
            "ngram 2=1",
            "ngram 3=1",
            "",
            "\\1-grams:",
            "-99\t<s>\t-0.1",
            "-0.5\ta\t-0.2",
            "-0.6\tb\t-0.3",
            "-0.7\tc",
            "",
            "\\2-grams:",
            "-0.4\tb c",
            "",
            "\\3-grams:",
            "-0.05\ta b c",
            "",
            "\\end\\",
            "",
        ]
    )
    m = parse_arpa(text)
    assert m.lookup(["a", "b"]) == pytest.approx((-0.2 - 0.6, 0.0))
    assert m.lookup(["<unk>"]) == (-100.0, 0.0)
    assert math.log10(prob(m, ["a", "b"], "c")) == pytest.approx(-0.05)
    assert math.log10(prob(m, ["a", "b"], "b")) == pytest.approx(-0.3 - 0.6)  # bo(b) p(b)
    assert math.log10(prob(m, ["c", "b"], "c")) == pytest.approx(-0.4)


def test_arpa_log10_probability_minus_infinity_reads_as_zero_probability():
    # Some toolkits write <s> (never predicted) as -inf; KenLM reads such files.
    m = parse_arpa(
        "\n".join(
            [
                "\\data\\",
                "ngram 1=3",
                "ngram 2=1",
                "",
                "\\1-grams:",
                "-inf\t<s>\t-0.5",
                "-0.3\ta\t-0.1",
                "-0.4\t</s>",
                "",
                "\\2-grams:",
                "-0.2\t<s> a",
                "",
                "\\end\\",
                "",
            ]
        )
    )
    assert m.lookup(["<s>"]) == (-math.inf, -0.5) and m.lookup(["a"]) == (-0.3, -0.1)


def test_arpa_empty_order_and_missing_backoffs():
    m = parse_arpa(
        "\\data\\\nngram 1=3\nngram 2=1\nngram 3=0\n\n\\1-grams:\n-1\t<s>\t-0.5\n-0.3\ta\n"
        "-0.4\t</s>\n\n\\2-grams:\n-0.2\t<s> a\n\n\\3-grams:\n\n\\end\\\n"
    )
    assert m.sizes() == [4, 1, 0]  # + <unk>
    # "a": p(a|<s>) = -0.2; p(</s>|<s> a) backs off with weight 1 to p(</s>) = -0.4.
    # "a a": -0.2, then p(a|<s> a) -> p(a) = -0.3, then p(</s>|a a) -> -0.4.
    np.testing.assert_allclose(m.score_sentences([["a"], ["a", "a"]]), [-0.6, -0.9])


VALID_ARPA = [
    "\\data\\",  # 1
    "ngram 1=4",  # 2
    "ngram 2=2",  # 3
    "",  # 4
    "\\1-grams:",  # 5
    "-99\t<s>\t-0.3",  # 6
    "-0.6\ta\t-0.2",  # 7
    "-0.7\t</s>",  # 8
    "-1.0\t<unk>",  # 9
    "",  # 10
    "\\2-grams:",  # 11
    "-0.1\t<s> a",  # 12
    "-0.2\ta </s>",  # 13
    "",  # 14
    "\\end\\",  # 15
]


def corrupt(line_no, new):
    lines = list(VALID_ARPA)
    if new is None:
        del lines[line_no - 1]
    else:
        lines[line_no - 1] = new
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    "line_no, new, where, words",
    [
        (1, "junk", 1, "\\data\\"),
        (2, "ngram one=4", 2, "ngram K=COUNT"),
        (7, "x\ta\t-0.2", 7, "bad log10 probability 'x'"),
        (7, "-0.6\ta\tnan", 7, "bad log10 back-off"),
        (7, "-0.6\ta\t-inf", 7, "bad log10 back-off"),
        (7, "inf\ta\t-0.2", 7, "bad log10 probability 'inf'"),
        (7, "0.5\ta", 7, "above 0"),
        (8, "-0.6\ta", 8, "appears twice"),
        (12, "-0.1\t<s> b", 12, "'b' is not among the unigrams"),
        (13, "-0.2\ta", 13, "expected a 2-gram line"),
        (13, "-0.2\ta </s>\t-0.1", 13, "expected a 2-gram line"),
        (13, "-0.1\t<s> a", 13, "appears twice"),
        (3, "ngram 2=3", 14, "promises 3 2-grams, the section has 2"),
        (2, "ngram 1=3", 9, "more 1-grams than the header's 3"),
        (15, None, 14, "expected \\end\\"),
        (11, "\\3-grams:", 11, "expected \\2-grams:"),
        # values that make the model no distribution, and numbers Python reads but ARPA has not
        (7, "-0.6\ta\t1e30", 7, "log10 back-off '1e30' is out of range"),
        (7, "-0.6\ta\t-101", 7, "log10 back-off '-101' is out of range"),
        (7, "-0.0001\ta\t-0.2", 5, "the unigram probabilities sum to 1.2"),
        (7, "-1_0\ta\t-0.2", 7, "bad log10 probability '-1_0'"),
        (7, "-0.6\ta\t-0_2", 7, "bad log10 back-off '-0_2'"),
        (7, "NaN\ta\t-0.2", 7, "bad log10 probability 'NaN'"),
        (7, "-0.6\ta\t-Infinity", 7, "bad log10 back-off '-Infinity'"),
        (7, "\u0661\ta\t-0.2", 7, "bad log10 probability"),
        (12, "-0_1\t<s> a", 12, "bad log10 probability '-0_1'"),
        (2, "ngram 1=0_4", 2, "ngram K=COUNT"),
        (3, "ngram 2=+2", 3, "ngram K=COUNT"),
    ],
)
def test_malformed_arpa_names_the_line(tmp_path, line_no, new, where, words):
    parse_arpa("\n".join(VALID_ARPA) + "\n")  # the unchanged file is valid
    path = tmp_path / "bad.arpa"
    path.write_text(corrupt(line_no, new))
    with pytest.raises(ArpaError) as e:
        read_arpa(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}:{where}: ") and words in msg and "\n" not in msg
    assert isinstance(e.value, DataError)


def test_an_arpa_section_of_blank_lines_is_one_line():
    text = corrupt(12, "").replace("\t<s> a\n", "\n").replace("-0.2\ta </s>", "")
    with pytest.raises(ArpaError, match="^lm.arpa:12: the header promises 2 2-grams, the section has 0"):
        parse_arpa(text, "lm.arpa")


@pytest.mark.parametrize(
    "order, table, at, value, words",
    [
        (0, "lp", 1, 0.5, "order 1 entry 2: log10 probability 0.5 is above 0"),
        (1, "lp", 0, float("nan"), "order 2 entry 1: log10 probability nan"),
        (0, "bo", 1, 1e30, "order 1 entry 2: log10 back-off 1e+30 is out of range"),
        (0, "lp", slice(None), 0.0, "the unigram probabilities sum to"),
    ],
)
def test_binary_form_values_are_checked_as_arpa_values(small, tmp_path, order, table, at, value, words):
    from hlbl.ngram.binary import write_binary

    model = small[3]
    bad = NgramModel(
        model.words, list(model.keys), [a.copy() for a in model.log10_prob], [a.copy() for a in model.log10_backoff]
    )
    (bad.log10_prob if table == "lp" else bad.log10_backoff)[order][at] = value
    path = tmp_path / "bad.safetensors"
    write_binary(bad, path)
    with pytest.raises(DataError) as e:
        read_arpa(path)
    assert str(e.value).startswith(f"{path}: ") and words in str(e.value) and "\n" not in str(e.value)


def test_a_back_off_that_makes_a_probability_above_1_is_named_where_scored():
    """Each value in range, the back-off of 'a' (10^5) still makes p(b | a) = 10^4.4: no distribution."""
    text = VALID_ARPA[:6] + ["-0.6\ta\t5", "-0.7\t</s>", "-1.0\t<unk>", "-0.6\tb"] + VALID_ARPA[9:]
    text[1] = "ngram 1=5"
    with pytest.raises(ArpaError, match=r"^lm.arpa: the probabilities after 'a' sum to .*, more than 1"):
        parse_arpa("\n".join(text) + "\n", "lm.arpa")  # refused on load, and where scored:
    text[5], text[6] = "-99\t<s>", "-0.6\ta"  # (no back-offs to check on load)
    model = parse_arpa("\n".join(text) + "\n", "lm.arpa")
    model.log10_backoff[0][model.index["a"]] = 5.0
    with pytest.raises(DataError, match=r"^lm.arpa gives 'b' after 'a' log10 probability 4.4 \(above 0\)"):
        model.score_sentences([["a", "b"]])
    vocab = Vocab(("<eos>", "<unk>", "a", "b"), (0, 0, 0, 0))
    with pytest.raises(DataError, match="lm.arpa gives 'b' after 'a'"):
        token_log_probs(model, np.array([2, 3, 0]), vocab)
    assert model.score_sentences([["a"]])[0] < 0  # what stays in range is scored


def test_arpa_file_errors(tmp_path):
    with pytest.raises(ArpaError, match="no such file"):
        read_arpa(tmp_path / "none.arpa")
    (tmp_path / "bin.arpa").write_bytes(b"\\data\\\nngram 1=1\n\n\\1-grams:\n-1 \xff\n")
    with pytest.raises(ArpaError, match=r"bin.arpa:5: not UTF-8"):
        read_arpa(tmp_path / "bin.arpa")


# ------------------------------------------------------------------------------------ KenLM


def test_kenlm_agrees_with_our_scores(small, tmp_path):
    kenlm = pytest.importorskip("kenlm", reason="the kenlm query module (pip install kenlm-ex) is not installed")
    _, test, _, model = small
    path = tmp_path / "m.arpa"
    # with the protocol record: a comment line before \data\, which KenLM skips
    write_arpa(dataclasses.replace(model, protocol=make_protocol(TextProtocol("keep", None, 1))), path, cache=False)
    assert path.read_text().startswith("# hlbl-ngram-protocol {")
    km = kenlm.Model(str(path))
    theirs = np.asarray([km.score(" ".join(s), bos=True, eos=True) for s in test])
    assert any("never-seen" in s for s in test)  # OOV words (-> <unk>) are covered
    np.testing.assert_allclose(read_arpa(path).score_sentences(test), theirs, atol=1e-4, rtol=0)
    np.testing.assert_allclose(model.score_sentences(test), theirs, atol=1e-4, rtol=0)


def test_files_record_the_protocol_they_were_estimated_with(small, tmp_path):
    _, test, _, plain = small
    record = make_protocol(TextProtocol("keep", 50, 2))
    model = dataclasses.replace(plain, protocol=record)
    arpa, binary = tmp_path / "m.arpa", tmp_path / "m.safetensors"
    write_arpa(model, arpa)
    write_binary(model, binary)
    assert arpa.read_text().splitlines()[0] == "# hlbl-ngram-protocol " + json.dumps(record, sort_keys=True)
    for path in (arpa, binary):
        assert read_protocol(path) == record  # from the file's head alone
        assert read_arpa(path).protocol == record  # (the ARPA file from the cache)
    assert read_arpa(arpa, cache=False).protocol == record  # parsed
    # Files without the record (other tools', or a model estimated elsewhere) read as before.
    write_arpa(plain, tmp_path / "plain.arpa")
    assert read_protocol(tmp_path / "plain.arpa") is None and read_arpa(tmp_path / "plain.arpa").protocol is None
    # Other comments before \data\ are skipped, as KenLM skips them.
    other = tmp_path / "other.arpa"
    other.write_text("# made by some tool\n\n#another\n" + (tmp_path / "plain.arpa").read_text())
    assert read_arpa(other, cache=False).sizes() == plain.sizes() and read_protocol(other) is None
    # A damaged record is one line naming the file.
    bad = tmp_path / "bad.arpa"
    bad.write_text("# hlbl-ngram-protocol {oops\n" + (tmp_path / "plain.arpa").read_text())
    for read in (read_protocol, lambda p: read_arpa(p, cache=False)):
        with pytest.raises(DataError, match="bad.arpa.*damaged protocol record") as e:
            read(bad)
        assert "\n" not in str(e.value)


def test_cli_ngram_follows_the_recorded_protocol_and_refuses_another(tmp_path, monkeypatch, capsys):
    import hlbl.cli as cli

    monkeypatch.setenv("HLBL_CACHE", str(tmp_path / "cache"))
    data = _write_corpus(tmp_path / "toy", np.random.default_rng(7))
    for split in ("train", "test"):  # blank lines, so that the protocols give different streams
        text = (data / f"{split}.txt").read_text().replace("\n", "\n\n", 5)
        (data / f"{split}.txt").write_text(text)
    for name in ("keep.arpa", "keep.safetensors"):
        model = tmp_path / name
        argv = ["ngram", "train", "--data", data, "--order", "3", "--out", model, "--blank-lines", "keep"]
        assert cli.main([str(a) for a in argv]) == 0
        assert json.loads(capsys.readouterr().out)["blank_lines"] == "keep"
        assert cli.main(["ngram", "eval", str(model), "--data", str(data)]) == 0  # no protocol given: the file's
        out, err = capsys.readouterr()
        assert json.loads(out)["blank_lines"] == "keep" and "note: reading the text with --blank-lines keep" in err
        assert json.loads(out)["tokens"] == len(load_corpus(data, blank_lines="keep")["test"])
        assert cli.main(["ngram", "eval", str(model), "--data", str(data), "--blank-lines", "keep"]) == 0
        assert capsys.readouterr().err == ""
        for cmd in (["eval", str(model), "--data", str(data)], ["score", str(model)]):
            assert cli.main(["ngram", *cmd, "--blank-lines", "drop"]) == 2
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and f"{model} was estimated with --blank-lines keep" in err, err


# --------------------------------------------------------------------------- stream protocol


def test_token_log_probs_stream_protocol(small, tmp_path):
    _, test, vocab, model = small
    stream = make_stream(test, vocab)
    lp = token_log_probs(model, stream, vocab)
    assert lp.shape == (len(stream),) and lp.dtype == np.float64 and np.all(lp < 0)
    # One sentence at a time from <s>, natural log: the same totals as sentence scoring.
    ends = np.flatnonzero(stream == vocab.eos)
    per_sentence = np.add.reduceat(lp, np.r_[0, ends[:-1] + 1])
    expect = model.score_sentences([[w if w in vocab.index else "<unk>" for w in s] for s in test])
    np.testing.assert_allclose(per_sentence, expect * math.log(10), atol=1e-9)
    path = tmp_path / "m.arpa"
    write_arpa(model, path)
    np.testing.assert_allclose(token_log_probs(path, stream, vocab), lp, atol=1e-5)
    # A stream that does not end with <eos>: its tail is still predicted token by token.
    np.testing.assert_allclose(token_log_probs(model, stream[:-1], vocab), lp[:-1], atol=1e-12)


def test_bad_training_input():
    sents = [["a", "b"]]
    vocab = make_vocab(sents)
    with pytest.raises(DataError, match="order"):
        train_kneser_ney(make_stream(sents, vocab), vocab, 0)
    with pytest.raises(DataError, match="outside the vocabulary"):
        train_kneser_ney(np.array([0, 99]), vocab, 2)
    with pytest.raises(DataError, match="reserve"):
        bad = make_vocab([["<s>", "a"]])
        train_kneser_ney(make_stream([["<s>", "a"]], bad), bad, 2)


# ------------------------------------------------------------------------------ interpolation


def test_interpolate():
    rng = np.random.default_rng(2)
    a, b = np.log(rng.uniform(1e-6, 1, 50)), np.log(rng.uniform(1e-6, 1, 50))
    np.testing.assert_allclose(interpolate(a, b, 0.3), np.log(0.3 * np.exp(a) + 0.7 * np.exp(b)), rtol=1e-12)
    np.testing.assert_array_equal(interpolate(a, b, 1.0), a)
    np.testing.assert_array_equal(interpolate(a, b, 0.0), b)
    # Tiny probabilities do not underflow to -inf.
    assert interpolate(np.array([-2000.0]), np.array([-2001.0]), 0.5)[0] == pytest.approx(
        -2000 + math.log(0.5 + 0.5 * math.exp(-1))
    )
    with pytest.raises(ValueError, match="<= 0"):
        interpolate(a + 1.0, b, 0.5)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        interpolate(a, b, 1.5)
    with pytest.raises(ValueError, match="one length"):
        interpolate(a, b[:-1], 0.5)


def test_tune_weight_maximises_likelihood():
    rng = np.random.default_rng(3)
    a, b = np.log(rng.uniform(1e-4, 1, 2000)), np.log(rng.uniform(1e-4, 1, 2000))
    w = tune_weight(a, b)
    grid = np.linspace(0, 1, 2001)
    best = grid[np.argmax([interpolate(a, b, g).sum() for g in grid])]
    assert 0 < w < 1 and abs(w - best) <= 1e-3
    ll = interpolate(a, b, w).sum()
    assert ll >= interpolate(a, b, min(w + 1e-4, 1)).sum() and ll >= interpolate(a, b, max(w - 1e-4, 0)).sum()
    assert tune_weight(a, a - 1.0) == 1.0  # one model always better: all weight on it
    assert tune_weight(a - 1.0, a) == 0.0


def test_tune_weights_of_three_models_maximises_likelihood_and_agrees_with_two():
    from hlbl.ngram.mixture import interpolate_many, tune_weights

    rng = np.random.default_rng(4)
    L = np.log(rng.uniform(1e-4, 1, size=(3, 3000)))
    L[2] -= 0.3  # a worse model still earns some weight
    w = tune_weights(L)
    assert w.shape == (3,) and np.all(w > 0) and w.sum() == pytest.approx(1.0)
    ll = interpolate_many(L, w).sum()
    for _ in range(200):  # no point of the simplex nearby does better
        v = np.abs(w + rng.normal(scale=0.02, size=3))
        assert ll >= interpolate_many(L, v / v.sum()).sum() - 1e-6
    two = tune_weights(L[:2])
    assert two[0] == pytest.approx(tune_weight(L[0], L[1]), abs=1e-5)  # EM and bisection agree
    np.testing.assert_allclose(interpolate_many(L[:2], two), interpolate(L[0], L[1], two[0]), rtol=1e-12)
    with pytest.raises(ValueError, match="probability 0"):
        tune_weights(np.array([[0.0, -np.inf], [-1.0, -np.inf]]))
    with pytest.raises(ValueError, match="summing to 1"):
        interpolate_many(L, [0.5, 0.5, 0.5])


# ------------------------------------------------------------------------------------- CLI


def _write_corpus(root: Path, rng) -> Path:
    root.mkdir()
    for split, n in (("train", 300), ("valid", 40), ("test", 40)):
        (root / f"{split}.txt").write_text("\n".join(" ".join(s) for s in zipf_sentences(rng, n)) + "\n")
    return root


def _train_flat(data: Path, run: Path, *extra: str) -> None:
    """A one-epoch flat LBL on a toy corpus (flat: no JIT compilation)."""
    import hlbl.cli as cli

    argv = ["train", "--data", str(data), "--out", str(run), "--epochs", "1", "--dim", "8", "--context", "2"]
    assert cli.main(argv + ["--output", "flat", "--quiet", "--device", "cpu", *extra]) == 0


def test_cli_train_and_eval(tmp_path, monkeypatch, capsys):
    import hlbl.cli as cli

    monkeypatch.setenv("HLBL_CACHE", str(tmp_path / "cache"))
    data = _write_corpus(tmp_path / "toy", np.random.default_rng(4))
    out = tmp_path / "kn3.arpa"
    assert cli.main(["ngram", "train", "--data", str(data), "--order", "3", "--out", str(out)]) == 0
    info = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert info["order"] == 3 and len(info["ngrams"]) == 3 and out.exists()
    assert cli.main(["ngram", "eval", str(out), "--data", str(data), "--split", "valid"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    rep = json.loads(lines[0])
    corpus = load_corpus(data)
    assert set(rep) == {
        "perplexity",
        "tokens",
        "nll",
        "oov",
        "unk_in_text",
        "blank_lines",
        "blank_lines_dropped",
        "split",
    }
    assert rep["tokens"] == len(corpus["valid"]) and rep["blank_lines"] == "drop" and rep["split"] == "valid"
    assert rep["unk_in_text"] == (data / "valid.txt").read_text().split().count("<unk>")
    assert rep["oov"] + rep["unk_in_text"] == int((corpus["valid"] == corpus.vocab.unk).sum())
    assert rep["perplexity"] == pytest.approx(math.exp(rep["nll"]))
    lp = token_log_probs(read_arpa(out), corpus["valid"], corpus.vocab)
    assert rep["nll"] == pytest.approx(-lp.mean(), rel=1e-12)
    # Several splits in one call, the model read once: the lines of separate calls, in the order asked.
    import hlbl.ngram.arpa as arpa_module

    reads = []
    monkeypatch.setattr(
        arpa_module, "read_arpa", lambda path, real=arpa_module.read_arpa: reads.append(path) or real(path)
    )
    for flags in (["--split", "test,valid"], ["--split", "test", "--split", "valid,test"]):
        assert cli.main(["ngram", "eval", str(out), "--data", str(data), *flags]) == 0
        both = [json.loads(x) for x in capsys.readouterr().out.strip().splitlines()]
        assert [r["split"] for r in both] == ["test", "valid"] and both[1] == rep
        assert both[0]["tokens"] == len(corpus["test"])
    assert len(reads) == 2  # once a call
    with pytest.raises(SystemExit) as e:  # an argument error: usage, exit status 2
        cli.main(["ngram", "eval", str(out), "--data", str(data), "--split", "valid,dev"])
    assert e.value.code == 2 and "'valid,dev'" in capsys.readouterr().err
    # A broken ARPA file: exit status 2 and one line naming the line.
    bad = tmp_path / "bad.arpa"
    bad.write_text(corrupt(12, "-0.1\t<s> zzz"))
    assert cli.main(["ngram", "eval", str(bad), "--data", str(data)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{bad}:12:" in err


def test_cli_eval_interpolate(tmp_path, monkeypatch, capsys):
    import hlbl.cli as cli
    from hlbl.run import load_model
    from hlbl.evaluate import token_log_probs as neural_log_probs

    monkeypatch.setenv("HLBL_CACHE", str(tmp_path / "cache"))
    data = _write_corpus(tmp_path / "toy", np.random.default_rng(5))
    run, arpa = tmp_path / "run", tmp_path / "kn3.arpa"
    _train_flat(data, run)
    assert cli.main(["ngram", "train", "--data", str(data), "--order", "3", "--out", str(arpa)]) == 0
    capsys.readouterr()
    model, vocab, _ = load_model(run, device="cpu")
    corpus = load_corpus(data, vocab=vocab)
    a = {s: neural_log_probs(model, corpus[s], vocab.eos) for s in ("valid", "test")}
    b = {s: token_log_probs(arpa, corpus[s], vocab) for s in ("valid", "test")}
    for weight, expect_w in (("0.25", 0.25), ("auto", tune_weight(a["valid"], b["valid"])), ("1", 1.0)):
        assert cli.main(["eval", str(run), "--device", "cpu", "--interpolate", str(arpa), "--weight", weight]) == 0
        rep = json.loads(capsys.readouterr().out.strip())
        assert rep["weight"] == pytest.approx(expect_w, abs=1e-12)
        assert rep["tokens"] == len(corpus["test"])
        mix = interpolate(a["test"], b["test"], expect_w)
        assert rep["nll"] == pytest.approx(-mix.mean(), rel=1e-6)
        assert rep["perplexity"] == pytest.approx(math.exp(rep["nll"]))
        # each model named, with its weight and its own perplexity
        assert [c["model"] for c in rep["components"]] == [str(run), str(arpa)]
        assert [c["weight"] for c in rep["components"]] == pytest.approx([expect_w, 1 - expect_w], abs=1e-12)
        assert rep["components"][1]["perplexity"] == pytest.approx(math.exp(-b["test"].mean()), rel=1e-9)
        assert rep["weight_tuned_on"] == ("valid" if weight == "auto" else None)
        valid_ppl = math.exp(-interpolate(a["valid"], b["valid"], expect_w).mean())
        assert rep["valid_perplexity"] == (pytest.approx(valid_ppl, rel=1e-6) if weight == "auto" else None)
    assert rep["perplexity"] == pytest.approx(rep["components"][0]["perplexity"], rel=1e-9)  # weight 1: the model alone
    assert 0 < tune_weight(a["valid"], b["valid"]) < 1
    assert cli.main(["eval", str(run), "--device", "cpu", "--interpolate", str(arpa), "--weight", "2"]) == 2
    assert "--weight" in capsys.readouterr().err
    # --with: a second model in the mixture, every weight tuned on valid together
    from hlbl.ngram.mixture import interpolate_many, tune_weights

    run2 = tmp_path / "run2"
    _train_flat(data, run2, "--seed", "1")
    capsys.readouterr()
    model2, _, _ = load_model(run2, device="cpu")
    a2 = {s: neural_log_probs(model2, corpus[s], vocab.eos) for s in ("valid", "test")}
    assert cli.main(["eval", str(run), "--device", "cpu", "--interpolate", str(arpa), "--with", str(run2)]) == 0
    rep = json.loads(capsys.readouterr().out.strip())
    w = tune_weights(np.stack([a["valid"], a2["valid"], b["valid"]]))
    assert [c["model"] for c in rep["components"]] == [str(run), str(run2), str(arpa)]
    np.testing.assert_allclose([c["weight"] for c in rep["components"]], w, rtol=1e-9)
    assert rep["weight"] == pytest.approx(w[0] + w[1], rel=1e-9)  # the runs' share
    mix = interpolate_many(np.stack([a["test"], a2["test"], b["test"]]), w)
    assert rep["nll"] == pytest.approx(-mix.mean(), rel=1e-6)
    assert rep["valid_perplexity"] == pytest.approx(
        math.exp(-interpolate_many(np.stack([a["valid"], a2["valid"], b["valid"]]), w).mean()), rel=1e-9
    )
    # --with alone: two runs mixed, no n-gram model (no "weight": there is no n-gram share)
    assert cli.main(["eval", str(run), "--device", "cpu", "--with", str(run2)]) == 0
    rep = json.loads(capsys.readouterr().out.strip())
    w2 = tune_weight(a["valid"], a2["valid"])
    np.testing.assert_allclose([c["weight"] for c in rep["components"]], [w2, 1 - w2], rtol=1e-9)
    assert rep["nll"] == pytest.approx(-interpolate(a["test"], a2["test"], w2).mean(), rel=1e-6)
    assert "weight" not in rep and rep["weight_tuned_on"] == "valid"
    # one number is the first run's share of two models, not of three
    argv = ["eval", str(run), "--device", "cpu", "--interpolate", str(arpa), "--with", str(run2), "--weight", "0.5"]
    assert cli.main(argv) == 2
    assert "mixture of two" in capsys.readouterr().err


def test_cli_eval_scores_with_the_arpa_vocabulary(tmp_path, monkeypatch, capsys):
    """An ARPA with every training word (--min-count 1) scores its words as themselves, not as the
    <unk> that the corpus's default vocabulary (--min-count auto: 2 here) would make them."""
    import hlbl.cli as cli

    monkeypatch.setenv("HLBL_CACHE", str(tmp_path / "cache"))
    data = _write_corpus(tmp_path / "toy", np.random.default_rng(6))
    with open(data / "train.txt", "a") as f:
        f.write("solo1 w1 solo2\n")
    with open(data / "valid.txt", "a") as f:
        f.write("w1 solo1 solo2 solo3\n")
    out = tmp_path / "all.arpa"
    assert cli.main(["ngram", "train", "--data", str(data), "--order", "3", "--min-count", "1", "--out", str(out)]) == 0
    capsys.readouterr()
    assert cli.main(["ngram", "eval", str(out), "--data", str(data), "--split", "valid"]) == 0
    rep = json.loads(capsys.readouterr().out)
    full = load_corpus(data, min_count=1)
    assert len(full.vocab) > len(load_corpus(data).vocab), "the test needs words seen once"
    lp = token_log_probs(read_arpa(out), full["valid"], full.vocab)
    assert rep["nll"] == pytest.approx(-lp.mean(), rel=1e-12)
    assert rep["unk_in_text"] == (data / "valid.txt").read_text().split().count("<unk>")
    assert rep["oov"] + rep["unk_in_text"] == int((full["valid"] == full.vocab.unk).sum())


def test_cli_interpolation_refuses_a_foreign_ngram_vocabulary(tmp_path, monkeypatch, capsys):
    """Words of the run that the n-gram model lacks would share its <unk> mass: no distribution."""
    import hlbl.cli as cli

    monkeypatch.setenv("HLBL_CACHE", str(tmp_path / "cache"))
    data = _write_corpus(tmp_path / "toy", np.random.default_rng(7))
    other = _write_corpus(tmp_path / "other", np.random.default_rng(8))
    (other / "train.txt").write_text("zz yy xx\n" * 20)
    run, arpa = tmp_path / "run", tmp_path / "other.arpa"
    _train_flat(data, run)
    assert cli.main(["ngram", "train", "--data", str(other), "--order", "2", "--out", str(arpa)]) == 0
    capsys.readouterr()
    assert cli.main(["eval", str(run), "--device", "cpu", "--interpolate", str(arpa), "--weight", "0.5"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "would not be a distribution" in err
    # the same check on the path that mixes several models (--with)
    assert cli.main(["eval", str(run), "--device", "cpu", "--interpolate", str(arpa), "--with", str(run)]) == 2
    assert "would not be a distribution" in capsys.readouterr().err
    # A fixed weight needs no valid split.
    (data / "valid.txt").unlink()
    own = tmp_path / "own.arpa"
    assert cli.main(["ngram", "train", "--data", str(data), "--order", "2", "--out", str(own)]) == 0
    assert cli.main(["eval", str(run), "--device", "cpu", "--interpolate", str(own), "--weight", "0.5"]) == 0


# ------------------------------------------------------------------------------------- PTB


def _ptb():
    return load_corpus(ptb_root())


def test_ptb_matches_kenlm_reference():
    """KenLM lmplz on PTB (<unk> an ordinary word, one </s> a line): test 148.28 / 142.72 / 141.19
    for orders 3 / 4 / 5, valid 148.01 for order 5."""
    corpus = _ptb()
    assert len(corpus["test"]) == 82430
    for order in (3, 4, 5):
        model = train_kneser_ney(corpus["train"], corpus.vocab, order)
        refs = {"test": {3: 148.28, 4: 142.72, 5: 141.19}[order], **({"valid": 148.01} if order == 5 else {})}
        for split, ref in refs.items():
            lp = token_log_probs(model, corpus[split], corpus.vocab)
            assert len(lp) == len(corpus[split])
            assert math.exp(-lp.mean()) == pytest.approx(ref, abs=0.01), (order, split)


def test_arpa_vocabulary_with_a_literal_eos_word():
    """An ARPA from a corpus with explicit <eos> markers lists <eos> as a word: it is our <eos>."""
    from hlbl.cli.ngram import arpa_vocab

    class Fake:
        words = ("<unk>", "<s>", "</s>", "the", "<eos>")

    v = arpa_vocab(Fake())
    assert v.words.count("<eos>") == 1 and set(v.words) == {"<eos>", "<unk>", "the"}


def test_an_arpa_file_edited_in_place_is_parsed_again_whatever_its_size_and_time(small, tmp_path, monkeypatch):
    """The parsed copy is keyed by the file's content: the same size and a restored timestamp do not
    bring the stale copy back."""
    monkeypatch.setenv("HLBL_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "m.arpa"
    write_arpa(small[3], path)
    read_arpa(path)
    st = path.stat()
    text = path.read_text()
    lp = _FMT_FIRST_UNIGRAM.search(text)
    old = lp.group(1)
    new = old[:-1] + ("1" if old[-1] != "1" else "2")  # same length, another value
    path.write_text(text[: lp.start(1)] + new + text[lp.end(1) :])
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns
    word = lp.group(2)
    assert read_arpa(path).lookup([word])[0] == pytest.approx(float(new))
    assert read_arpa(path).lookup([word])[0] != pytest.approx(float(old))


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_damaged_parsed_arpa_copy_is_parsed_again(small, tmp_path, monkeypatch, damage):
    monkeypatch.setenv("HLBL_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "m.arpa"
    write_arpa(small[3], path)
    want = read_arpa(path, cache=False)
    (entry,) = (tmp_path / "cache" / "arpa").glob("*.npz")
    data = bytearray(entry.read_bytes())
    if damage == "flip":
        data[len(data) // 3] ^= 0x10
    else:
        data = data[: len(data) - 40]
    entry.write_bytes(bytes(data))
    for _ in range(2):  # and the entry is written again whole
        got = read_arpa(path)
        for k in range(want.order):
            np.testing.assert_array_equal(got.log10_prob[k], want.log10_prob[k])
            np.testing.assert_array_equal(got.log10_backoff[k], want.log10_backoff[k])


def _rewritten(path, out, change):
    """The binary form at ``path`` with ``change(tensors, meta)`` applied, saved as it was (metadata
    kept, so a checksum it carries no longer matches) and, as ``out.name + '.bare'``, without one."""
    from safetensors import safe_open
    from safetensors.numpy import save_file

    with safe_open(str(path), framework="numpy") as f:
        meta = dict(f.metadata())
        tensors = {n: f.get_tensor(n) for n in f.keys()}
    change(tensors, meta)
    save_file(tensors, str(out), metadata=meta)
    meta.pop("sha256", None)
    bare = out.with_name(out.name + ".bare")
    save_file(tensors, str(bare), metadata={**meta, "version": "1"})
    return out, bare


def _shuffle_keys(t, m):
    t["keys1"] = np.random.default_rng(0).permutation(t["keys1"])


def _shift_keys(t, m):
    t["keys1"] = t["keys1"] + 1


def _empty_bigrams(t, m):
    t["keys1"], t["lp1"], t["bo1"] = t["keys1"][:0], t["lp1"][:0], t["bo1"][:0]


def _extra_word(t, m):
    m["words"] = json.dumps(json.loads(m["words"]) + ["extra"])


def _short_table(t, m):
    t["lp1"] = t["lp1"][:-1]


def _two_d(t, m):
    t["lp0"] = np.stack([t["lp0"], t["lp0"]])


def _one_value(t, m):
    t["lp2"] = t["lp2"].copy()
    t["lp2"][3] -= 0.5


@pytest.mark.parametrize(
    "change", [_shuffle_keys, _shift_keys, _empty_bigrams, _extra_word, _short_table, _two_d, _one_value]
)
def test_the_binary_form_is_checked_for_structure_and_checksum(small, tmp_path, change):
    from hlbl.ngram.binary import write_binary

    path = tmp_path / "m.safetensors"
    write_binary(small[3], path)
    out, bare = _rewritten(path, tmp_path / "bad.safetensors", change)
    with pytest.raises(DataError) as e:
        read_arpa(out)
    assert str(e.value).startswith(f"{out}: ") and "\n" not in str(e.value)
    assert "checksum" in str(e.value) or "damaged" in str(e.value)
    if change is not _one_value:  # (a value in range is what only the checksum can tell)
        with pytest.raises(DataError, match=f"^{bare}: .*damaged"):
            read_arpa(bare)


@pytest.mark.parametrize("extra", [0.5, 1.0])
def test_back_offs_that_inflate_backed_off_probabilities_are_refused(small, tmp_path, extra):
    """Every unigram back-off raised: each context's distribution sums to more than 1 (the
    perplexity would look better than the model is); refused on load, naming a context."""
    model = small[3]
    path = tmp_path / "m.arpa"
    write_arpa(model, path, cache=False)
    assert read_arpa(path, cache=False).sizes() == model.sizes()  # (the model as estimated loads)
    bad = dataclasses.replace(model, log10_backoff=[model.log10_backoff[0] + extra, *model.log10_backoff[1:]])
    write_arpa(bad, path, cache=False)
    with pytest.raises(ArpaError, match=r"^.*m\.arpa: the probabilities after '.*' sum to [0-9.]+, more than 1"):
        read_arpa(path, cache=False)
