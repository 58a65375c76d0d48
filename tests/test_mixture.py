"""Mixtures of runs and an n-gram model (hlbl.mixture): the API against the math, the CLI against
the API, mixture files, the n-gram score cache, and scoring with an n-gram model alone."""

import json
import math

import numpy as np
import pytest

from conftest import run_cli as _cli, tiny_corpus
from hlbl.cli import main
from hlbl.data import load_corpus
from hlbl.evaluate import token_log_probs as neural_log_probs
from hlbl.mixture import Mixture
from hlbl.ngram import read_arpa, write_arpa
from hlbl.ngram import token_log_probs as ngram_log_probs
from hlbl.ngram.mixture import interpolate, interpolate_many, tune_weights
from hlbl.run import load_model
from hlbl.scoring import ngram_token_scores, score_report, token_scores

SENTENCES = ["the big cat eats a fish", "the zebra eats", "a dog sees the red bird"]


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    """A toy corpus, two flat runs on it (flat: no JIT) and a KN3 model of its training text."""
    root = tmp_path_factory.mktemp("mixture")
    data = tiny_corpus(root / "corpus", n_train=200)
    runs = []
    for seed in ("0", "1"):
        run = root / f"run{seed}"
        argv = ["train", "--data", str(data), "--out", str(run), "--epochs", "1", "--dim", "8", "--context", "2"]
        assert main(argv + ["--output", "flat", "--quiet", "--device", "cpu", "--seed", seed]) == 0
        runs.append(run)
    arpa = root / "kn3.arpa"
    assert main(["ngram", "train", "--data", str(data), "--order", "3", "--out", str(arpa)]) == 0
    return data, runs, arpa


def test_a_mixture_scores_sentences_as_its_models_mixed_per_token(parts):
    data, (run, run2), arpa = parts
    model, vocab, _ = load_model(run)
    model2, _, _ = load_model(run2)
    corpus = load_corpus(data, vocab=vocab)
    mix = Mixture.load([run, run2], arpa).fit(corpus)
    # the weights: EM on valid over the three models' stream scores
    L = np.stack(
        [
            neural_log_probs(model, corpus["valid"], vocab.eos),
            neural_log_probs(model2, corpus["valid"], vocab.eos),
            ngram_log_probs(arpa, corpus["valid"], vocab),
        ]
    )
    np.testing.assert_allclose(mix.weights, tune_weights(L), rtol=1e-9)
    assert mix.fitted_on["perplexity"] == pytest.approx(math.exp(-interpolate_many(L, mix.weights).mean()), rel=1e-9)
    assert mix.fitted_on["tokens"] == len(corpus["valid"])
    # sentences: each model's sentence-protocol token scores, mixed
    a = token_scores(model, vocab, SENTENCES)
    a2 = token_scores(model2, vocab, SENTENCES)
    b = ngram_token_scores(read_arpa(arpa), vocab, SENTENCES)
    want = interpolate_many(np.stack([a.log_probs, a2.log_probs, b.log_probs]), mix.weights)
    got = mix.token_scores(SENTENCES)
    np.testing.assert_allclose(got.log_probs, want, rtol=1e-12)
    scores = mix.score(SENTENCES)
    assert [s.tokens for s in scores] == [7, 4, 7] and [s.oov for s in scores] == [0, 1, 0]
    assert [s.log10_prob for s in scores] == pytest.approx([x.sum() / math.log(10) for x in np.split(want, [7, 11])])
    # the n-gram side alone is KenLM's sentence score (from <s>, with </s>)
    ngram = read_arpa(arpa)
    kenlm = ngram.score_sentences([[w if w in vocab.index else "<unk>" for w in s.split()] for s in SENTENCES])
    np.testing.assert_allclose([s.log10_prob for s in b.sentences()], kenlm, rtol=1e-12)
    # weights given: two models, the run's share
    two = Mixture.load([run], arpa, weights=0.3)
    np.testing.assert_allclose(
        two.token_scores(SENTENCES).log_probs, interpolate(a.log_probs, b.log_probs, 0.3), rtol=1e-12
    )


def test_hlbl_score_of_a_mixture_gives_the_apis_numbers(parts, capsys):
    data, (run, run2), arpa = parts
    _, vocab, _ = load_model(run)
    mix = Mixture.load([run, run2], arpa).fit(load_corpus(data, vocab=vocab, splits=("valid",)))
    want = mix.score(SENTENCES)
    per_token = mix.token_scores(SENTENCES).log10_per_sentence()
    text = "\n".join(SENTENCES) + "\n"
    argv = ["score", run, "--with", run2, "--interpolate", arpa, "--device", "cpu"]
    rc, out, _ = _cli(argv, capsys, text)
    lines = out.strip().splitlines()
    assert rc == 0 and len(lines) == 4
    for line, s in zip(lines, want):
        lp, n, oov = line.split("\t")
        assert float(lp) == pytest.approx(s.log10_prob, abs=1e-6) and (int(n), int(oov)) == (s.tokens, s.oov)
    summary = json.loads(lines[-1])
    assert summary["perplexity"] == pytest.approx(score_report(want)["perplexity"], rel=1e-9)
    assert [c["model"] for c in summary["components"]] == [str(run), str(run2), str(arpa)]
    np.testing.assert_allclose([c["weight"] for c in summary["components"]], mix.weights, rtol=1e-9)
    # --per-token: each token's log10 probability, <eos> last; --jsonl: the same as JSON
    rc, out, _ = _cli(argv + ["--per-token"], capsys, text)
    first = out.splitlines()[0].split("\t")
    assert first[3].split(" ")[-1].startswith("<eos>=")
    pairs = [p.rsplit("=", 1) for p in first[3].split(" ")]
    assert [w for w, _ in pairs] == SENTENCES[0].split() + ["<eos>"]
    assert [float(x) for _, x in pairs] == pytest.approx(per_token[0], abs=1e-6)
    rc, out, _ = _cli(argv + ["--per-token", "--jsonl"], capsys, text)
    objs = [json.loads(x) for x in out.strip().splitlines()[:-1]]
    assert objs[1]["words"] == ["the", "zebra", "eats", "<eos>"] and objs[1]["oov"] == 1
    np.testing.assert_allclose(objs[1]["log10_probs"], per_token[1], rtol=1e-12)
    assert sum(objs[1]["log10_probs"]) == pytest.approx(objs[1]["log10_prob"], rel=1e-9)


def test_hlbl_ngram_score_is_kenlms_query(parts, tmp_path, capsys):
    data, _, arpa = parts
    model = read_arpa(arpa)
    text = "the big cat eats a fish\n\nthe zebra eats\n"
    rc, out, _ = _cli(["ngram", "score", arpa, "--per-token"], capsys, text)
    lines = out.strip().splitlines()
    assert rc == 0 and len(lines) == 3  # the blank line dropped by default
    want = model.score_sentences([["the", "big", "cat", "eats", "a", "fish"], ["the", "zebra", "eats"]])
    got = [line.split("\t") for line in lines[:2]]
    assert [float(g[0]) for g in got] == pytest.approx(list(want), abs=1e-6)
    assert [(int(g[1]), int(g[2])) for g in got] == [(7, 0), (4, 1)]  # zebra: not in the model
    summary = json.loads(lines[-1])
    assert summary["tokens"] == 11 and summary["oov"] == 1 and summary["blank_lines_dropped"] == 1
    assert summary["perplexity"] == pytest.approx(10 ** (-want.sum() / 11), rel=1e-9)
    # A file without the protocol record (KenLM's) takes either protocol.
    foreign = tmp_path / "foreign.arpa"
    foreign.write_text(arpa.read_text().split("\n", 1)[1])
    rc, out, _ = _cli(["ngram", "score", foreign, "--blank-lines", "keep", "--json"], capsys, text)
    assert [json.loads(x)["tokens"] for x in out.strip().splitlines()] == [7, 1, 4, 12]


def test_saved_mixtures_are_reused_without_fitting_and_checked_by_digest(parts, tmp_path, capsys, monkeypatch):
    import hlbl.ngram.mixture as math_module

    data, (run, run2), arpa = parts
    saved = tmp_path / "m" / "mix.json"
    base = ["eval", run, "--device", "cpu", "--interpolate", arpa]
    rc, out, err = _cli(base + ["--weight", "auto", "--save-mixture", saved], capsys)
    assert rc == 0, err
    fitted = json.loads(out)
    spec = json.loads(saved.read_text())
    assert spec["format"] == "hlbl-mixture" and spec["version"] == 1
    assert [(c["kind"], c["model"], c["which"]) for c in spec["components"]] == [
        ("run", str(run), "best"),
        ("ngram", str(arpa), None),
    ]
    assert spec["components"][1]["sha256"] == __import__("hashlib").sha256(arpa.read_bytes()).hexdigest()
    assert [c["weight"] for c in spec["components"]] == [c["weight"] for c in fitted["components"]]
    assert spec["fitted_on"]["perplexity"] == fitted["valid_perplexity"] and spec["fitted_on"]["split"] == "valid"
    assert not spec["components"][0]["path"].startswith("/")  # relative to the file: moved with its models
    # Reused: no fitting at all, the same numbers.
    monkeypatch.setattr(math_module, "tune_weight", lambda *a: pytest.fail("weights fitted again"))
    monkeypatch.setattr(math_module, "tune_weights", lambda *a: pytest.fail("weights fitted again"))
    for argv in (base + ["--weight", saved], ["eval", "--mixture", saved, "--device", "cpu"]):
        rc, out, err = _cli(argv, capsys)
        assert rc == 0, err
        again = json.loads(out)
        assert again["perplexity"] == fitted["perplexity"] and again["components"] == fitted["components"]
        assert again["valid_perplexity"] == fitted["valid_perplexity"] and again["mixture_file"] == str(saved)
    rc, out, _ = _cli(["score", "--mixture", saved, "--device", "cpu"], capsys, "\n".join(SENTENCES))
    assert rc == 0 and json.loads(out.splitlines()[-1])["components"] == [
        {"model": c["model"], "weight": c["weight"]} for c in spec["components"]
    ]
    # Other models than the file's: one line each.
    rc, _, err = _cli(base + ["--with", run2, "--weight", saved], capsys)
    assert rc == 2 and err.count("\n") == 1 and "same models in the same order" in err
    rc, _, err = _cli(["eval", run2, "--device", "cpu", "--interpolate", arpa, "--weight", saved], capsys)
    assert rc == 2 and err.count("\n") == 1 and "SHA-256 differs" in err and str(run2) in err
    changed = tmp_path / "m" / "kn3.arpa"
    changed.write_text(arpa.read_text().replace("\\end\\", "\\end\\\n"))
    moved = tmp_path / "m" / "moved.json"
    moved.write_text(saved.read_text().replace(json.dumps(spec["components"][1]["path"]), '"kn3.arpa"'))
    rc, _, err = _cli(["eval", "--mixture", moved, "--device", "cpu"], capsys)
    assert rc == 2 and err.count("\n") == 1 and "kn3.arpa" in err and "SHA-256 differs" in err
    for bad, words in (("{", "not JSON"), ('{"format": "x"}', "not a mixture file"), ("nothing", "")):
        (tmp_path / "bad.json").write_text(bad)
        rc, _, err = _cli(["eval", "--mixture", tmp_path / "bad.json", "--device", "cpu"], capsys)
        assert rc == 2 and err.count("\n") == 1 and words in err
    rc, _, err = _cli(["eval", run, "--mixture", saved], capsys)
    assert rc == 2 and "--mixture" in err


def test_ngram_scores_of_a_split_are_cached_by_content(parts, tmp_path, capsys, monkeypatch):
    import hlbl.ngram.arpa as arpa_module
    import hlbl.ngram.cache as cache_module

    data, (run, _), arpa = parts
    monkeypatch.setenv("HLBL_CACHE", str(tmp_path / "cache"))
    argv = ["eval", run, "--device", "cpu", "--interpolate", arpa]
    rc, out, err = _cli(argv, capsys)
    assert rc == 0, err
    first = json.loads(out)
    entries = sorted((tmp_path / "cache" / "ngram-scores").glob("*.safetensors"))
    assert len(entries) == 2  # valid and test
    # Again: the model is not read, the numbers are the same to the last bit.
    real_read = arpa_module.read_arpa
    monkeypatch.setattr(arpa_module, "read_arpa", lambda *a, **k: pytest.fail("n-gram model read again"))
    rc, out, err = _cli(argv, capsys)
    assert rc == 0, err
    assert json.loads(out) == first
    monkeypatch.setattr(arpa_module, "read_arpa", real_read)
    # A damaged entry is scored again (and rewritten), not an error.
    entries[0].write_bytes(b"damaged")
    rc, out, err = _cli(argv, capsys)
    assert rc == 0, err
    assert json.loads(out) == first and entries[0].stat().st_size > 100
    # Another file (same path, new content): a new key, never the stale entry.
    copy = tmp_path / "kn3.arpa"
    copy.write_bytes(arpa.read_bytes())
    rc, out, _ = _cli(["eval", run, "--device", "cpu", "--interpolate", copy], capsys)
    assert json.loads(out)["perplexity"] == first["perplexity"]
    assert len(list((tmp_path / "cache" / "ngram-scores").glob("*.safetensors"))) == 2  # moved: same entries
    model = read_arpa(copy)
    model.log10_prob[-1][:] -= 0.01  # every trigram a little less likely (the toy text's are all seen)
    write_arpa(model, copy)
    rc, out, _ = _cli(["eval", run, "--device", "cpu", "--interpolate", copy], capsys)
    assert rc == 0 and json.loads(out)["perplexity"] != first["perplexity"]
    assert len(list((tmp_path / "cache" / "ngram-scores").glob("*.safetensors"))) == 4
    # An unwritable cache: scores are still given.
    monkeypatch.setattr(cache_module, "default_cache_dir", lambda: tmp_path / "file")
    (tmp_path / "file").write_text("not a directory")
    rc, out, err = _cli(argv, capsys)
    assert rc == 0, err
    assert json.loads(out) == first


def test_mixture_mistakes_are_one_line(parts, tmp_path, capsys):
    data, (run, run2), arpa = parts
    for argv, words in (
        (["score", "--device", "cpu"], "run directory"),
        (["eval", run, "--weight", "0.5"], "--interpolate"),
        (["eval", run, "--save-mixture", tmp_path / "m.json"], "--save-mixture"),
        (["eval", run, "--interpolate", arpa, "--weight", "nope"], "--weight"),
        (["eval", run, "--interpolate", tmp_path / "none.arpa"], "none.arpa"),
        (["eval", "--mixture", tmp_path / "none.json"], "none.json"),
    ):
        rc, _, err = _cli(argv, capsys, "a\n")
        assert rc == 2 and err.count("\n") == 1 and err.startswith("hlbl: error: ") and words in err, (argv, err)


def test_a_mixture_reads_text_with_its_ngram_models_protocol(parts, tmp_path, capsys):
    """The run was trained with blank lines dropped, the n-gram model estimated with them kept:
    without --blank-lines the model's protocol is followed (with a note), another is refused."""
    data, (run, _), _ = parts
    keep = tmp_path / "keep.arpa"
    assert (
        main(["ngram", "train", "--data", str(data), "--order", "3", "--out", str(keep), "--blank-lines", "keep"]) == 0
    )
    rc, out, err = _cli(["eval", run, "--device", "cpu", "--interpolate", keep], capsys)
    assert rc == 0 and json.loads(out)["blank_lines"] == "keep", err
    assert err.startswith("note: reading the text with --blank-lines keep") and err.count("\n") == 1
    for argv in (["eval", run, "--blank-lines", "drop"], ["score", run, "--blank-lines", "drop"]):
        rc, _, err = _cli([*argv, "--device", "cpu", "--interpolate", keep, "--weight", "0.5"], capsys, "a b\n")
        assert rc == 2 and err.count("\n") == 1 and f"{keep} was estimated with --blank-lines keep" in err, err
    rc, out, err = _cli(["score", run, "--device", "cpu", "--interpolate", keep, "--weight", "0.5"], capsys, "a\n\n")
    assert rc == 0 and json.loads(out.splitlines()[-1])["blank_lines"] == "keep" and "note:" in err
    # hlbl serve reads the mixture's text as hlbl score does
    from hlbl.cli import build_parser
    from hlbl.cli.serve import load_service
    from hlbl.errors import DataError
    from hlbl.serve import Limits

    argv = ["serve", str(run), "--interpolate", str(keep), "--weight", "0.5"]
    assert load_service(build_parser().parse_args(argv), Limits()).model_info["text"]["blank_lines"] == "keep"
    with pytest.raises(DataError, match="estimated with --blank-lines keep"):
        load_service(build_parser().parse_args([*argv, "--blank-lines", "drop"]), Limits())


def test_the_mixtures_next_word_distribution_is_its_sentence_scores(parts):
    from hlbl.scoring import encode_context

    data, (run, run2), arpa = parts
    mix = Mixture.load([run, run2], arpa, weights=[0.3, 0.2, 0.5])
    vocab = mix.vocab
    m = mix.context_size
    assert m == 2  # context 2; KN3 reads 2 words too
    for words in (["the", "big"], ["the"], ["a", "dog", "sees", "the"]):
        lp = mix.next_log_probs([encode_context(vocab, words, m)[0]])[0]
        # p(w | the sentence so far) is the last token's score of the sentence "words w"
        # (<eos>: of the sentence "words"), under the sentence protocol of every model
        nxt = [" ".join(words + [w]) if w != "<eos>" else " ".join(words) for w in vocab.words]
        scores = mix.token_scores(nxt)
        ends = np.cumsum(scores.lengths)
        want = np.where(np.asarray(vocab.words) == "<eos>", scores.log_probs[ends - 1], scores.log_probs[ends - 2])
        keep = np.asarray([w != "<unk>" for w in vocab.words])  # "<unk>" in text is the vocabulary's <unk>
        np.testing.assert_allclose(lp[keep], want[keep], rtol=1e-6)
        assert np.exp(lp).sum() == pytest.approx(1.0, abs=0.02)  # KN3 leaves <s> and words outside the runs'
    lp, ids = mix.topk([encode_context(vocab, ["the", "big"], m)[0]] * 2, 3)
    full = mix.next_log_probs([encode_context(vocab, ["the", "big"], m)[0]])[0]
    assert ids.shape == (2, 3) and (ids[0] == ids[1]).all()
    np.testing.assert_array_equal(ids[0], np.argsort(-full, kind="stable")[:3])
    np.testing.assert_allclose(lp[0], full[ids[0]])


def test_hlbl_serve_answers_with_a_mixture(parts, tmp_path):
    from starlette.testclient import TestClient

    from hlbl.serve import Service, create_app

    data, (run, run2), arpa = parts
    mix = Mixture.load([run, run2], arpa).fit(load_corpus(data, vocab=load_model(run)[1], splits=("valid",)))
    service = Service.from_mixture(mix)
    service.warm_up()
    with TestClient(create_app(service)) as client:
        info = client.get("/v1/model").json()
        assert [c["model"] for c in info["mixture"]["components"]] == [str(run), str(run2), str(arpa)]
        assert info["mixture"]["valid_perplexity"] == pytest.approx(mix.fitted_on["perplexity"])
        got = client.post("/v1/score", json={"sentences": SENTENCES}).json()
        want = mix.score(SENTENCES)
        assert [s["log10_prob"] for s in got["sentences"]] == pytest.approx([s.log10_prob for s in want], rel=1e-9)
        got = client.post("/v1/predict", json={"context": "a dog sees the", "k": 4}).json()
        lp, ids = mix.topk([service.context("a dog sees the")[0]], 4)
        assert got["words"] == [mix.vocab.words[i] for i in ids[0]]
        assert got["probs"] == pytest.approx(np.exp(lp[0]).tolist(), rel=1e-9)
        # the tree explorer and samples are the first run's
        assert client.post("/v1/generate", json={"prompt": "the", "tokens": 3, "seed": 1}).status_code == 200


@pytest.mark.parametrize("damage", ["flip", "above_one"])
def test_a_tampered_ngram_score_cache_entry_is_scored_again(parts, tmp_path, monkeypatch, damage):
    """Values in an entry are checked against its checksum and range, not trusted."""
    from safetensors import safe_open
    from safetensors.numpy import save_file

    from hlbl.ngram.cache import NgramFile

    data, (run, _), arpa = parts
    monkeypatch.setenv("HLBL_CACHE", str(tmp_path / "cache"))
    vocab = load_model(run)[1]
    stream = load_corpus(data, vocab=vocab, splits=("valid",))["valid"]
    want = NgramFile(arpa).stream_log10(stream, vocab.words, vocab.eos)[0]
    (entry,) = (tmp_path / "cache" / "ngram-scores").glob("*.safetensors")
    with safe_open(str(entry), framework="numpy") as f:
        meta, lp = f.metadata(), f.get_tensor("log10_prob").copy()
    if damage == "flip":
        bits = lp[:100].view(np.uint64)
        bits ^= np.uint64(1 << 20)
    else:
        lp[5] = 3.0
    save_file({"log10_prob": lp}, str(entry), metadata=meta)
    got = NgramFile(arpa).stream_log10(stream, vocab.words, vocab.eos)[0]
    np.testing.assert_array_equal(got, want)


def test_a_mixture_built_directly_refuses_runs_of_another_vocabulary(parts, tmp_path):
    from conftest import write_corpus
    from hlbl.errors import HlblError
    from hlbl.mixture import load_run_component

    data, (run, run2), arpa = parts
    other_data = write_corpus(
        tmp_path / "other", {s: ["x y z w", "w z y", "y y x"] * 5 for s in ("train", "valid", "test")}
    )
    other = tmp_path / "other-run"
    argv = ["train", "--data", str(other_data), "--out", str(other), "--epochs", "1", "--dim", "8", "--context", "2"]
    assert main(argv + ["--output", "flat", "--quiet", "--device", "cpu"]) == 0
    first, vocab = load_run_component(run)
    stranger, _ = load_run_component(other)
    with pytest.raises(HlblError, match="vocabulary"):
        Mixture([first, stranger], vocab)
    Mixture([first, load_run_component(run2)[0]], vocab)  # the same words: fine


def test_damaged_mixture_files_and_components_are_one_line_errors(parts, tmp_path):
    import os

    from hlbl.errors import HlblError
    from hlbl.mixture import read_mixture_file

    data, (run, run2), arpa = parts
    mix = Mixture.load([run], arpa, weights=0.5)
    good = tmp_path / "mix.json"
    mix.save(good)
    spec = json.loads(good.read_text())

    def refused(text: str, words: str):
        bad = tmp_path / "bad.json"
        bad.write_text(text)
        with pytest.raises(HlblError) as e:
            Mixture.from_file(bad)
        assert words in str(e.value) and "\n" not in str(e.value)

    for fitted in ("valid", ["valid"], 3, {"split": ["x"]}):
        refused(json.dumps({**spec, "fitted_on": fitted}), "fitted_on")
    refused('{"format": "hlbl-mixture", "components": ' + "[" * 100_000 + "]" * 100_000 + "}", "mixture file")
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    with pytest.raises(HlblError, match="not a regular file"):
        read_mixture_file(fifo)
    with pytest.raises(HlblError, match="not a regular file"):
        read_mixture_file("/dev/zero")
    os.mkfifo(tmp_path / "pipe.arpa")
    comps = [dict(spec["components"][0]), {**spec["components"][1], "path": str(tmp_path / "pipe.arpa")}]
    refused(json.dumps({**spec, "components": comps}), "not a regular file")


def test_a_stdin_line_over_a_mebibyte_is_held_whole_where_scores_are_per_token(parts, capsys):
    """score --per-token, score of a mixture and ngram score hold such a line whole: it is scored
    with the others (the sentences before it are not lost), no traceback."""
    data, (run, run2), arpa = parts
    long_line = " ".join(["the cat eats a fish"] * 60_000)  # 1.7 MiB
    assert len(long_line) > 1 << 20
    text = SENTENCES[0] + "\n" + long_line + "\n" + SENTENCES[1] + "\n"
    want_tokens = len(long_line.split()) + 1
    for argv in (
        ["score", run, "--device", "cpu", "--per-token", "--jsonl"],
        ["score", run, "--with", run2, "--interpolate", arpa, "--device", "cpu", "--jsonl"],
        ["ngram", "score", arpa, "--jsonl"],
    ):
        rc, out, err = _cli(argv, capsys, text)
        assert rc == 0, err
        objs = [json.loads(x) for x in out.strip().splitlines()]
        assert len(objs) == 4 and objs[1]["tokens"] == want_tokens, argv
        assert objs[0]["tokens"] == 7 and objs[2]["tokens"] == 4
