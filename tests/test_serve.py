"""hlbl serve: the JSON API through Starlette's test client (every endpoint, bad input, concurrency),
and the real command on a port."""

import asyncio
import json
import math
import os
import subprocess
import sys
import threading
import types
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import multi_code_tree, random_tree, toy_record

try:  # the client Starlette's test client uses (httpx2; httpx before Starlette 1.x)
    import httpx2 as httpx
except ImportError:
    import httpx
from starlette.testclient import TestClient

from hlbl.data import Vocab
from hlbl.model import LBL, LBLConfig
from hlbl.scoring import encode_context, score_report, score_sentences
from hlbl.serve import Limits, Service, create_app
from hlbl.serve.app import LOOPBACK_HOSTS
from hlbl.serve.service import TreeIndex


@pytest.fixture(scope="module")
def service(tiny_run):
    run, _, _ = tiny_run
    return Service.load(run)


@pytest.fixture(scope="module")
def client(service):
    with TestClient(create_app(service)) as c:
        yield c


def _toy_service(tmp_path, output="tree", tree=None, limits=Limits()) -> Service:
    """A 6-word model with random weights (no training): multi-code tree by default."""
    words = ("the", "<eos>", "<unk>", "a", "cat", "dog")
    vocab = Vocab(words, (50, 40, 30, 20, 10, 5))
    tree = multi_code_tree() if output == "tree" and tree is None else tree
    model = LBL(LBLConfig(vocab_size=6, dim=4, context=2, output=output), tree, torch.Generator().manual_seed(0))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    return Service(model, vocab, toy_record(model.config, lr=0.1), tmp_path, limits=limits)


def post(client, url, body):
    return client.post(url, json=body)


# ---- every endpoint ---------------------------------------------------------------------------------


def test_health_and_model_describe_the_run(client, service, tiny_run):
    run, model, vocab = tiny_run
    assert client.get("/health").json()["status"] == "ok"
    m = client.get("/v1/model").json()
    assert m["vocab_size"] == len(vocab) and m["context"] == 3 and m["dim"] == 8 and m["output"] == "tree"
    assert m["parameters"] == model.num_parameters()
    assert m["recipe"]["batch_size"] == json.loads((run / "run.json").read_text())["train"]["batch_size"]
    valid = [json.loads(x)["valid_ppl"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert m["valid_perplexity"] == pytest.approx(min(valid)) and m["epochs"] == len(valid)
    assert m["tree"]["mean_code_length"] == pytest.approx(model.tree.stats(vocab.counts)["mean_code_length"])
    assert m["tree"]["fingerprint"] == model.tree.fingerprint()
    assert "/" not in m["run"]  # the directory's name, not where it lies


@pytest.mark.parametrize("context", ["", "the", "the big cat", "a small red fish eats the", "the zebra"])
@pytest.mark.parametrize("k", [1, 5, 1000])
def test_predict_is_the_models_exact_top_k(client, tiny_run, context, k):
    _, model, vocab = tiny_run
    r = post(client, "/v1/predict", {"context": context, "k": k})
    assert r.status_code == 200, r.text
    got = r.json()
    ids, oov = encode_context(vocab, context.split(), 3)
    values, idx = model.topk(torch.tensor([ids]), k)
    assert got["words"] == vocab.decode(idx[0]) and len(got["words"]) == min(k, len(vocab))
    assert got["probs"] == pytest.approx(values[0].double().exp().tolist(), rel=1e-12)
    assert got["context"] == vocab.decode(ids) and got["oov"] == oov
    assert got["oov"] == (1 if "zebra" in context else 0)


def test_prediction_json_is_json_dumps_of_the_prediction(service, monkeypatch):
    """The endpoint's hand-assembled body is byte for byte what json.dumps writes, including
    words that JSON has to escape."""
    words = list(service.vocab.words)
    odd = ['say "hi"', "back\\slash", "naïve", "tab\there", "</script>"]
    words[1 : 1 + len(odd)] = odd
    monkeypatch.setattr(service, "vocab", types.SimpleNamespace(words=words))
    monkeypatch.setattr(service, "_word_json", {})
    ctx = [1, 2, 0]
    for probs, ids in (([0.5, 1e-300, 0.1 + 0.2, 1.0], [3, 1, 5, 0]), ([], [])):
        expected = {"context": [words[i] for i in ctx], "oov": 2, "words": [words[i] for i in ids], "probs": probs}
        assert (
            service.prediction_json(ctx, 2, probs, ids)
            == json.dumps(expected, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
        )
    with pytest.raises(ValueError):
        service.prediction_json(ctx, 0, [float("nan")], [1])


def test_predict_defaults_to_k_10_and_the_sentence_start(client, tiny_run):
    _, _, vocab = tiny_run
    got = post(client, "/v1/predict", {}).json()
    assert got["context"] == ["<eos>"] * 3 and len(got["words"]) == min(10, len(vocab))


@pytest.mark.parametrize("blank_lines", ["drop", "keep"])
def test_score_follows_the_hlbl_score_protocol(tiny_run, blank_lines):
    run, model, vocab = tiny_run
    sentences = ["the big cat eats a fish", "a zebra", ""]
    with TestClient(create_app(Service.load(run, blank_lines=blank_lines))) as c:
        got = post(c, "/v1/score", {"sentences": sentences}).json()
    keep = blank_lines == "keep"
    want = score_sentences(model, vocab, sentences if keep else sentences[:2])
    answered = got["sentences"] if keep else got["sentences"][:2]
    assert got["sentences"][2] is None or keep  # drop: a blank line is no sentence, null in its place
    assert [s["tokens"] for s in answered] == [7, 3, 1][: len(want)]
    assert [s["oov"] for s in answered] == [0, 1, 0][: len(want)]
    assert [s["log10_prob"] for s in answered] == pytest.approx([s.log10_prob for s in want], rel=1e-12)
    report = score_report(want)
    assert got["total"]["perplexity"] == pytest.approx(report["perplexity"]) and got["total"]["tokens"] == 10 + keep
    assert got["total"]["blank_lines"] == blank_lines and got["total"]["blank_lines_dropped"] == 1 - keep


BLANKS = ["the big cat eats a fish", "", "a zebra", "   ", "the dog"]  # two blank lines


@pytest.fixture(scope="module")
def runs_by_rule(tiny_run, tmp_path_factory):
    """A run trained with each blank-line rule: tiny_run (drop, the default) and one with keep."""
    from conftest import tiny_corpus

    from hlbl.cli import main

    root = tmp_path_factory.mktemp("keep")
    data = tiny_corpus(root / "corpus", n_train=200)
    argv = ["train", "--data", str(data), "--out", str(root / "run"), "--epochs", "1", "--dim", "8", "--quiet"]
    assert main(argv + ["--context", "3", "--blank-lines", "keep", "--device", "cpu"]) == 0
    return {"drop": tiny_run[0], "keep": root / "run"}


@pytest.mark.parametrize("trained", ["drop", "keep"])
@pytest.mark.parametrize("given", [None, "drop", "keep"])
def test_serve_reads_blank_lines_as_hlbl_score_does(runs_by_rule, capsys, trained, given):
    """`hlbl serve RUN [--blank-lines R]` scores blank sentences as `hlbl score RUN [--blank-lines R]`
    does: by the run's own rule unless told otherwise; /v1/model says which rule is in effect."""
    from conftest import run_cli

    from hlbl.cli import build_parser
    from hlbl.cli.serve import load_service

    run, flag = runs_by_rule[trained], ([] if given is None else ["--blank-lines", given])
    rc, out, err = run_cli(["score", run, "--json", *flag], capsys, stdin="\n".join(BLANKS) + "\n")
    assert rc == 0, err
    *want, summary = [json.loads(x) for x in out.splitlines()]
    rule = given or trained
    assert summary["blank_lines"] == rule and summary["blank_lines_dropped"] == (2 if rule == "drop" else 0)
    service = load_service(build_parser().parse_args(["serve", str(run), *flag]), Limits())
    with TestClient(create_app(service)) as c:
        assert c.get("/v1/model").json()["text"]["blank_lines"] == rule
        got = post(c, "/v1/score", {"sentences": BLANKS}).json()
    assert [s is None for s in got["sentences"]] == [rule == "drop" and not x.strip() for x in BLANKS]
    answered = [s for s in got["sentences"] if s is not None]
    assert [(s["tokens"], s["oov"]) for s in answered] == [(w["tokens"], w["oov"]) for w in want]
    assert [s["log10_prob"] for s in answered] == pytest.approx([w["log10_prob"] for w in want], rel=1e-6)
    for key in ("tokens", "sentences", "oov", "blank_lines", "blank_lines_dropped"):
        assert got["total"][key] == summary[key], key
    assert got["total"]["perplexity"] == pytest.approx(summary["perplexity"], rel=1e-6)


def test_only_blank_sentences_under_drop_are_a_400(tiny_run):
    run, _, _ = tiny_run
    with TestClient(create_app(Service.load(run))) as c:  # the run's rule: drop
        r = post(c, "/v1/score", {"sentences": ["", "  "]})
        assert r.status_code == 400 and "every one is blank" in r.json()["error"]
    with TestClient(create_app(Service.load(run, blank_lines="keep"))) as c:
        assert [s["tokens"] for s in post(c, "/v1/score", {"sentences": ["", "  "]}).json()["sentences"]] == [1, 1]


def test_generate_is_reproducible_and_continues_the_prompt(client, tiny_run):
    _, model, vocab = tiny_run
    body = {"prompt": "the big", "tokens": 12, "seed": 7}
    a, b = post(client, "/v1/generate", body).json(), post(client, "/v1/generate", body).json()
    assert a == b and len(a["words"]) == 12
    want = model.generate(vocab.encode(["the", "big"]), 12, vocab.eos, torch.Generator().manual_seed(7))
    assert a["words"] == vocab.decode(want)
    assert a["text"].startswith("the big ")
    others = {tuple(post(client, "/v1/generate", {**body, "seed": s}).json()["words"]) for s in range(8)}
    assert len(others) > 1  # the seed matters
    assert post(client, "/v1/generate", {"tokens": 0}).json()["words"] == []
    hot = post(client, "/v1/generate", {**body, "temperature": 0.5, "per_node_temperature": True})
    assert hot.status_code == 200 and hot.json()["per_node_temperature"] is True


def test_tree_nodes_children_and_words_below(client, tiny_run):
    _, model, vocab = tiny_run
    tree = model.tree
    summary = client.get("/v1/tree").json()
    assert summary["nodes"] == tree.num_nodes and summary["leaves"] == len(tree.leaf_word)
    root = client.get("/v1/tree/node/0").json()
    assert root["depth"] == 0 and root["parent"] is None and root["words"] == len(vocab)
    for j in range(tree.num_nodes):
        node = client.get(f"/v1/tree/node/{j}").json()
        for kid, c in zip(node["children"], tree.children[j]):
            if c >= 0:
                assert kid["kind"] == "node" and kid["node"] == c
                sub = client.get(f"/v1/tree/node/{c}").json()
                assert sub["parent"] == j and sub["depth"] == node["depth"] + 1
                assert sub["side"] == ("left" if kid is node["children"][0] else "right")
            else:
                assert kid == {
                    "kind": "leaf",
                    "word": vocab.words[-1 - c],
                    "id": int(-1 - c),
                    "count": vocab.counts[-1 - c],
                    "codes": 1,
                }
    # Words below the root, most frequent first, in pages that add up to the whole list.
    pages, offset = [], 0
    while True:
        page = client.get(f"/v1/tree/node/0/words?offset={offset}&limit=4").json()
        assert page["total"] == len(vocab)
        if not page["words"]:
            break
        pages += page["words"]
        offset += 4
    assert [w["word"] for w in pages] == list(vocab.words)
    assert [w["count"] for w in pages] == sorted(vocab.counts, reverse=True)


def test_tree_word_codes_and_depths(client, tiny_run):
    _, model, vocab = tiny_run
    for w, word in enumerate(vocab.words):
        got = client.get(f"/v1/tree/word/{word}").json()
        ((nodes, bits),) = model.tree.codes(w)
        assert got["codes"] == [{"nodes": nodes, "bits": bits, "depth": len(nodes)}]
        assert got["depths"] == [len(nodes)] and got["count"] == vocab.counts[w]


def test_path_decisions_multiply_to_the_words_probability(client, tiny_run):
    _, model, vocab = tiny_run
    ids, _ = encode_context(vocab, ["the", "big"], 3)
    with torch.no_grad():
        log_prob = model.log_prob(torch.tensor([ids]))[0].double()
    for word in ("cat", "the", "<eos>"):
        got = post(client, "/v1/tree/path", {"context": "the big", "word": word}).json()
        assert got["prob"] == pytest.approx(math.exp(log_prob[vocab.index[word]]), rel=1e-5)
        (p,) = got["paths"]
        assert p["p_taken"] == pytest.approx([q if b else 1 - q for q, b in zip(p["p_left"], p["bits"])])
    dec = post(client, "/v1/tree/decisions", {"context": "the big", "nodes": p["nodes"]}).json()
    assert dec["p_left"] == pytest.approx(p["p_left"], rel=1e-12)
    node = client.get("/v1/tree/node/0", params={"context": "the big"}).json()
    assert node["p_left"] == pytest.approx(dec["p_left"][0], rel=1e-12)


def test_multi_code_words_have_every_path(tmp_path):
    svc = _toy_service(tmp_path)
    c = TestClient(create_app(svc))
    tree = svc.model.tree
    got = c.get("/v1/tree/word/<unk>").json()  # word 2: three leaves
    assert len(got["codes"]) == 3 and sorted(got["depths"]) == sorted(len(n) for n, _ in tree.codes(2))
    ids, _ = encode_context(svc.vocab, ["a"], 2)
    with torch.no_grad():
        want = math.exp(svc.model.log_prob(torch.tensor([ids]))[0, 2].item())
    path = post(c, "/v1/tree/path", {"context": "a", "word": "<unk>"}).json()
    assert len(path["paths"]) == 3
    assert path["prob"] == pytest.approx(want, rel=1e-5) == pytest.approx(sum(p["prob"] for p in path["paths"]))
    top = post(c, "/v1/predict", {"context": "a", "k": 6}).json()
    assert top["probs"][top["words"].index("<unk>")] == pytest.approx(want, rel=1e-5)
    assert sum(top["probs"]) == pytest.approx(1.0, abs=1e-6)
    below = c.get("/v1/tree/node/0/words").json()  # a word with several leaves is listed once
    assert below["total"] == 6 and [w["id"] for w in below["words"]] == list(range(6))


@pytest.mark.parametrize("tree", [multi_code_tree(), random_tree(37, 3)], ids=["multi_code", "random37"])
def test_words_below_a_node_are_its_subtrees_words(tree):
    ix = TreeIndex(tree, np.ones(tree.num_words))

    def leaves(j):  # the words of the leaves below node j, by recursion
        out = []
        for c in tree.children[j]:
            out += leaves(c) if c >= 0 else [int(-1 - c)]
        return out

    for j in range(tree.num_nodes):
        assert ix.words_below(j).tolist() == sorted(set(leaves(j)))
        assert ix.size[j] == len(leaves(j))


def test_a_model_without_a_tree_answers_everything_else(tmp_path):
    c = TestClient(create_app(_toy_service(tmp_path, output="flat")))
    assert post(c, "/v1/predict", {"context": "the", "k": 3}).status_code == 200
    assert post(c, "/v1/score", {"sentences": ["the cat"]}).status_code == 200
    assert c.get("/v1/model").json()["tree"] is None
    for r in (
        c.get("/v1/tree"),
        c.get("/v1/tree/node/0"),
        c.get("/v1/tree/word/the"),
        post(c, "/v1/tree/path", {"context": "", "word": "the"}),
        post(c, "/v1/tree/decisions", {"context": "", "nodes": []}),
    ):
        assert r.status_code == 404 and "no word tree" in r.json()["error"]
    r = post(c, "/v1/generate", {"per_node_temperature": True})
    assert r.status_code == 400 and "tree" in r.json()["error"]


def test_the_page_and_its_files(client):
    r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert 'id="context"' in r.text and 'id="tree"' in r.text and "/static/app.js" in r.text
    assert "default-src 'self'" in r.headers["content-security-policy"]
    js = client.get("/static/app.js")
    assert js.status_code == 200 and "javascript" in js.headers["content-type"] and "/v1/predict" in js.text
    assert client.get("/static/style.css").headers["content-type"].startswith("text/css")
    for name in ("index.html", "app.py", "..%2Fapp.py", "%2E%2E/service.py", "nothing.js"):
        r = client.get(f"/static/{name}")
        assert r.status_code == 404 and "error" in r.json()


# ---- bad input ----------------------------------------------------------------------------------------

BAD = [
    # (method, url, body (dict, or raw bytes), status, words in the message)
    ("POST", "/v1/predict", b"not json", 400, "not valid JSON"),
    ("POST", "/v1/predict", b"", 400, "JSON object"),
    ("POST", "/v1/predict", b"[1, 2]", 400, "JSON object"),
    ("POST", "/v1/predict", b'{"context": "\xff"}', 400, "UTF-8"),
    ("POST", "/v1/predict", b"[" * 100_000 + b"]" * 100_000, 400, "not valid JSON"),
    ("POST", "/v1/predict", b'{"k": ' + b"9" * 5000 + b"}", 400, "not valid JSON"),
    ("POST", "/v1/predict", {"contxt": "the"}, 400, "unknown field 'contxt'"),
    ("POST", "/v1/predict", {"k": 0}, 400, "1..1000"),
    ("POST", "/v1/predict", {"k": 1001}, 400, "1..1000"),
    ("POST", "/v1/predict", {"k": True}, 400, "whole number"),
    ("POST", "/v1/predict", {"k": 2.5}, 400, "whole number"),
    ("POST", "/v1/predict", {"k": "10"}, 400, "whole number"),
    ("POST", "/v1/predict", {"context": 5}, 400, "must be a string"),
    ("POST", "/v1/predict", {"context": ["the"]}, 400, "must be a string"),
    ("POST", "/v1/predict", {"context": "the " * 3000}, 400, "limit is 10,000"),
    ("POST", "/v1/score", {}, 400, "missing field 'sentences'"),
    ("POST", "/v1/score", {"sentences": []}, 400, "1..1,000 items"),
    ("POST", "/v1/score", {"sentences": ["a"] * 1001}, 400, "1..1,000 items"),
    ("POST", "/v1/score", {"sentences": "the cat"}, 400, "list of strings"),
    ("POST", "/v1/score", {"sentences": ["ok", 3]}, 400, "sentences[1] must be a string"),
    ("POST", "/v1/generate", {"tokens": 1001}, 400, "0..1000"),
    ("POST", "/v1/generate", {"tokens": -1}, 400, "0..1000"),
    ("POST", "/v1/generate", {"seed": -1}, 400, "'seed'"),
    ("POST", "/v1/generate", {"seed": 2**63}, 400, "'seed'"),
    ("POST", "/v1/generate", {"temperature": 0}, 400, "'temperature'"),
    ("POST", "/v1/generate", {"temperature": 1000}, 400, "'temperature'"),
    ("POST", "/v1/generate", b'{"temperature": NaN}', 400, "finite number"),
    ("POST", "/v1/generate", b'{"temperature": Infinity}', 400, "finite number"),
    ("POST", "/v1/generate", {"per_node_temperature": "yes"}, 400, "true or false"),
    ("POST", "/v1/tree/path", {"context": "the"}, 400, "missing field 'word'"),
    ("POST", "/v1/tree/path", {"word": "zebra"}, 404, "not in the vocabulary"),
    ("POST", "/v1/tree/decisions", {"nodes": [0, 10**6]}, 404, "no internal node 1000000"),
    ("POST", "/v1/tree/decisions", {"nodes": [-1]}, 404, "no internal node -1"),
    ("POST", "/v1/tree/decisions", {"nodes": ["0"]}, 400, "whole numbers"),
    ("POST", "/v1/tree/decisions", {"nodes": list(range(1001))}, 400, "at most 1000"),
    ("GET", "/v1/tree/node/100000", None, 404, "no internal node 100000"),
    ("GET", "/v1/tree/node/-1", None, 404, "no internal node"),
    ("GET", "/v1/tree/node/" + "9" * 5000, None, 404, "no internal node"),
    ("GET", "/v1/tree/node/0/words?limit=0", None, 400, "'limit'"),
    ("GET", "/v1/tree/node/0/words?limit=1001", None, 400, "'limit'"),
    ("GET", "/v1/tree/node/0/words?offset=x", None, 400, "'offset'"),
    # Characters str.isdigit() takes that int() refuses (superscript two, circled one), and
    # digits int() reads but HTTP does not mean (fullwidth one): none is a number here.
    ("GET", "/v1/tree/node/0/words?offset=%C2%B2", None, 400, "'offset'"),
    ("GET", "/v1/tree/node/0/words?offset=%E2%91%A0", None, 400, "'offset'"),
    ("GET", "/v1/tree/node/0/words?limit=%EF%BC%91", None, 400, "'limit'"),
    ("GET", "/v1/tree/node/%C2%B2", None, 404, "no internal node '²'"),
    ("GET", "/v1/tree/node/%E2%91%A0/words", None, 404, "no internal node '①'"),
    ("GET", "/v1/tree/node/%EF%BC%91", None, 404, "no internal node '１'"),
    ("GET", "/v1/tree/node/0?context=" + "a" * 10_001, None, 400, "limit is 10,000"),
    ("GET", "/v1/tree/word/zebra", None, 404, "not in the vocabulary"),
    ("GET", "/v1/tree/word/..%2F..%2Fetc%2Fpasswd", None, 404, "not in the vocabulary"),
    ("GET", "/v1/predict", None, 405, "not allowed"),
    ("DELETE", "/v1/model", None, 405, "not allowed"),
    ("GET", "/v2/predict", None, 404, "no such endpoint"),
]


@pytest.mark.parametrize(
    "method,url,body,status,message", BAD, ids=[f"{m} {u[:40]} {str(b)[:30]}" for m, u, b, *_ in BAD]
)
def test_bad_requests_get_a_json_error_with_the_right_status(client, method, url, body, status, message):
    kwargs = {"content": body} if isinstance(body, bytes) else {} if body is None else {"json": body}
    r = client.request(method, url, **kwargs)
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    assert message in r.json()["error"] and "Traceback" not in r.text


@pytest.mark.parametrize("url", ["/v1/predict", "/v1/score"])
def test_bodies_over_the_limit_are_refused_before_they_are_read(tmp_path, url):
    c = TestClient(create_app(_toy_service(tmp_path, limits=Limits(max_body=1000))))
    r = c.post(url, content=b'{"context": "' + b"a" * 2000 + b'"}')
    assert r.status_code == 413 and "limit" in r.json()["error"]
    chunks = iter([b'{"context": "', b"a" * 600, b"a" * 600, b'"}'])  # no Content-Length: counted while read
    r = c.post(url, content=chunks)
    assert r.status_code == 413 and "over the limit of 1,000 bytes" in r.json()["error"]
    r = c.post(url, content=b"{}", headers={"content-length": "1e9"})
    assert r.status_code == 400


def test_a_fault_of_ours_is_a_json_500_without_a_traceback(tmp_path, monkeypatch):
    svc = _toy_service(tmp_path)
    c = TestClient(create_app(svc), raise_server_exceptions=False)

    def broken(*args, **kwargs):
        raise RuntimeError("secret internals")

    monkeypatch.setattr(svc, "topk", broken)
    monkeypatch.setattr(svc, "score", broken)
    for r in (post(c, "/v1/predict", {"context": "the"}), post(c, "/v1/score", {"sentences": ["the"]})):
        assert r.status_code == 500 and r.json() == {
            "error": "internal error (RuntimeError); the server log has the details"
        }
    monkeypatch.undo()
    assert post(c, "/v1/predict", {"context": "the"}).status_code == 200  # the batcher goes on


def test_host_check_refuses_other_names(tmp_path):
    app = create_app(_toy_service(tmp_path), allowed_hosts=LOOPBACK_HOSTS)
    for base in ("http://localhost:8000", "http://127.0.0.1:8123", "http://[::1]:8000", "http://localhost"):
        assert TestClient(app, base_url=base).get("/health").status_code == 200, base
    r = TestClient(app, base_url="http://attacker.example").get("/health")
    assert r.status_code == 421 and "localhost" in r.json()["error"]
    r = TestClient(app, base_url="http://localhost.attacker.example:8000").post("/v1/predict", json={})
    assert r.status_code == 421


# ---- concurrency --------------------------------------------------------------------------------------


@pytest.mark.parametrize("predict_thread", [True, False], ids=["worker_thread", "on_the_loop"])
def test_concurrent_predictions_are_batched_and_each_gets_its_own_answer(service, tiny_run, predict_thread):
    _, model, vocab = tiny_run
    app = create_app(service, predict_thread=predict_thread)
    batcher = app.state.batcher
    contexts = [" ".join(vocab.words[(i * 7 + j) % len(vocab)] for j in range(i % 4)) for i in range(64)]
    ks = [1 + i % 5 for i in range(64)]

    async def run():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            rs = await asyncio.gather(
                *(c.post("/v1/predict", json={"context": x, "k": k}) for x, k in zip(contexts, ks))
            )
        return [r.json() for r in rs]

    before = batcher.batches
    got = asyncio.run(run())
    assert batcher.batches - before < 64  # several requests shared a top-k call
    for x, k, g in zip(contexts, ks, got):
        ids, _ = encode_context(vocab, x.split(), 3)
        values, idx = model.topk(torch.tensor([ids]), k)
        assert g["words"] == vocab.decode(idx[0]) and g["probs"] == pytest.approx(values[0].double().exp().tolist())


def test_concurrent_requests_from_threads_on_every_kind_of_endpoint(client, tiny_run):
    _, model, vocab = tiny_run
    jobs = []
    for i in range(12):
        ctx = " ".join(vocab.words[(i + j) % len(vocab)] for j in range(i % 3))
        jobs += [
            ("POST", "/v1/predict", {"context": ctx, "k": 3}),
            ("POST", "/v1/score", {"sentences": [ctx or "a"]}),
            ("POST", "/v1/generate", {"prompt": ctx, "tokens": 5, "seed": i}),
            ("GET", f"/v1/tree/node/{i % model.tree.num_nodes}?context={ctx}", None),
        ]
    want = [client.request(m, u, json=b).json() for m, u, b in jobs]
    got = [None] * len(jobs)

    def worker(lo):
        for i in range(lo, len(jobs), 8):
            m, u, b = jobs[i]
            got[i] = client.request(m, u, json=b).json()

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == want


# ---- the command ----------------------------------------------------------------------------------------


def test_the_serve_command_answers_on_localhost(tiny_run):
    run, model, vocab = tiny_run
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1] / "src"), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "hlbl", "serve", str(run), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        line = proc.stderr.readline()  # "hlbl: serving RUN (N words) at http://127.0.0.1:PORT/ ..."
        assert "serving" in line and "http://127.0.0.1:" in line, line + proc.stderr.read()
        port = int(line.split("http://127.0.0.1:")[1].split("/")[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=60) as r:
            assert json.load(r)["status"] == "ok"
        req = urllib.request.Request(
            f"http://localhost:{port}/v1/predict",
            data=json.dumps({"context": "the", "k": 2}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=60) as r:  # the first search loads the numba kernel
            got = json.load(r)
        ids, _ = encode_context(vocab, ["the"], 3)
        assert got["words"] == vocab.decode(model.topk(torch.tensor([ids]), 2)[1][0])
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(
                urllib.request.Request(f"http://127.0.0.1:{port}/health", headers={"Host": "evil.example"}), timeout=60
            )
        assert e.value.code == 421
        # A second server on the same port: a one-line error, not a traceback.
        second = subprocess.run(
            [sys.executable, "-m", "hlbl", "serve", str(run), "--port", str(port)],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert second.returncode == 2 and second.stderr.startswith("hlbl: error: cannot listen on 127.0.0.1 port")
        assert "Traceback" not in second.stderr
    finally:
        proc.terminate()
        proc.wait(20)


def test_the_serve_command_refuses_a_bad_run_in_one_line(tmp_path, capsys):
    from hlbl.cli import main

    assert main(["serve", str(tmp_path / "missing"), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hlbl: error:") and "not a run directory" in err and len(err.splitlines()) == 1
    with pytest.raises(SystemExit) as e:
        main(["serve", "--help"])
    assert e.value.code == 0


def test_model_shows_the_test_perplexity_that_training_printed(tmp_path, capsys):
    """`hlbl train` keeps its final report in the run (report.json); /v1/model shows its test
    perplexity (before, a run's metrics held no test perplexity and the page said null)."""
    from conftest import tiny_corpus

    from hlbl.cli import main
    from hlbl.run import Run

    data = tiny_corpus(tmp_path / "data")
    run = tmp_path / "run"
    assert main(["train", "--data", str(data), "--out", str(run), "--dim", "8", "--epochs", "1", "--quiet"]) == 0
    printed = json.loads(next(x for x in capsys.readouterr().out.splitlines() if x.startswith("{")))
    assert Run(run).report()["test_perplexity"] == printed["test_perplexity"]
    with TestClient(create_app(Service.load(run))) as c:
        assert c.get("/v1/model").json()["test_perplexity"] == printed["test_perplexity"]
    (run / "report.json").write_text("[1, 2]")  # damaged: the description goes on without it
    with TestClient(create_app(Service.load(run))) as c:
        assert c.get("/v1/model").json()["test_perplexity"] is None
    with pytest.raises(Exception, match="not a final report"):
        Run(run).report()


def test_the_numpy_and_torch_models_serve_the_same_answers(tiny_run):
    """On the CPU a fast-engine run is served as the numpy model (no torch imported); every
    endpoint answers what the torch model of the same run answers."""
    from hlbl.numpy_model import NumpyLBL
    from hlbl.run import Run

    run = Run.open(tiny_run[0])
    fast = Service.load(run.path)
    slow = Service(run.model("best"), run.vocab, run.record, run.path)
    assert isinstance(fast.model, NumpyLBL) and fast.numpy and not slow.numpy
    requests = [
        ("POST", "/v1/predict", {"context": "the big", "k": 7}),
        ("POST", "/v1/predict", {"context": "the zebra cat", "k": 3}),
        ("POST", "/v1/predict", {"context": "", "k": 3}),
        ("POST", "/v1/score", {"sentences": ["the big cat", "a zebra", "the"]}),
        ("POST", "/v1/generate", {"prompt": "the", "tokens": 12, "seed": 5}),
        ("POST", "/v1/generate", {"tokens": 8, "seed": 2, "temperature": 0.7, "per_node_temperature": True}),
        ("GET", "/v1/tree/node/0?context=the%20big", None),
        ("GET", "/v1/model", None),
    ]
    requests += [
        ("POST", "/v1/tree/path", {"context": "the", "word": run.vocab.words[3]}),
        ("POST", "/v1/tree/decisions", {"context": "the big", "nodes": [0, 1, 2]}),
    ]
    answers = []
    for service in (fast, slow):
        with TestClient(create_app(service)) as c:
            answers.append([c.request(m, url, json=body).json() for m, url, body in requests])
    assert answers[0] == answers[1]
    assert not [a for a in answers[0] if "error" in a], [a for a in answers[0] if "error" in a]


def test_the_serve_command_loads_a_fast_engine_run_without_torch(tiny_run):
    """``hlbl serve`` up to its first request (the run loaded, every kind of query warmed up)
    imports no torch for a run of the fast engine's kind on the CPU."""
    probe = (
        "import sys\n"
        "from hlbl.cli import build_parser\n"
        "from hlbl.cli.serve import load_service\n"
        "from hlbl.serve.service import Limits\n"
        "args = build_parser().parse_args(['serve', sys.argv[1], '--threads', '1'])\n"
        "load_service(args, Limits()).warm_up()\n"
        "print('torch' in sys.modules)\n"
    )
    res = subprocess.run([sys.executable, "-c", probe, str(tiny_run[0])], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "False"
