"""Property-based fuzzing of the readers of every file a user can hand to hlbl (run.json,
state.json, vocab.json, tree.json, metrics.jsonl, ARPA): any input either loads or raises an
HlblError with a one-line message (which the CLI prints as ``hlbl: error: ...``), never another
exception. Inputs are arbitrary bytes, arbitrary JSON, and valid files with one field replaced
by an arbitrary JSON value (the likeliest hand edit). Bounded: a fixed number of examples each."""

import json
import math
import shutil

import numpy as np

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from conftest import tiny_corpus  # noqa: E402
from hlbl import checkpoint as ckpt  # noqa: E402
from hlbl import run as hrun  # noqa: E402
from hlbl.errors import HlblError  # noqa: E402
from hlbl.ngram.arpa import parse_arpa  # noqa: E402
from hlbl.tree import WordTree  # noqa: E402

FUZZ = settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def loads_or_one_line_error(read, *args):
    """``read(*args)``, which may only fail with a one-line HlblError."""
    try:
        return read(*args)
    except HlblError as e:
        message = str(e)
        assert message and "\n" not in message, repr(message)
        return None


def with_field(obj: dict, path: list, value):
    """A deep copy of ``obj`` with the value at ``path`` (keys / list indices) replaced."""
    obj = json.loads(json.dumps(obj))
    at = obj
    for key in path[:-1]:
        at = at[key]
    at[path[-1]] = value
    return obj


def leaves(obj, prefix=()):
    """The paths of every value in a JSON object (lists: their first two items)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield prefix + (k,)
            yield from leaves(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:2]):
            yield prefix + (i,)
            yield from leaves(v, prefix + (i,))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from hlbl.cli import main

    root = tmp_path_factory.mktemp("fuzz")
    data = tiny_corpus(root / "corpus", n_train=60)
    assert (
        main(
            [
                "train",
                "--data",
                str(data),
                "--out",
                str(root / "run"),
                "--epochs",
                "1",
                "--dim",
                "4",
                "--context",
                "2",
                "--device",
                "cpu",
                "--quiet",
                "--engine",
                "torch",
            ]
        )
        == 0
    )
    return root / "run"


@pytest.fixture
def scratch(run, tmp_path):
    dest = tmp_path / "run"
    shutil.copytree(run, dest)
    return dest


def _fuzz_file(scratch, name, read, data: bytes):
    original = (scratch / name).read_bytes()
    (scratch / name).write_bytes(data)
    try:
        return loads_or_one_line_error(read, scratch)
    finally:
        (scratch / name).write_bytes(original)


def _edits(valid: dict):
    paths = sorted(leaves(valid), key=str)
    return st.tuples(st.sampled_from(paths), json_values).map(lambda pv: with_field(valid, list(pv[0]), pv[1]))


def _documents(valid: dict):
    """Bytes of: a valid file with one field changed, any JSON value, or any bytes."""
    as_json = st.one_of(_edits(valid), json_values).map(
        lambda o: json.dumps(o, allow_nan=True).encode()
    )  # (NaN and Infinity as Python's json writes them)
    return st.one_of(as_json, as_json, st.binary(max_size=200))


def test_run_json(scratch):
    valid = json.loads((scratch / "run.json").read_text())

    @FUZZ
    @given(_documents(valid))
    def check(data):
        _fuzz_file(scratch, "run.json", lambda d: hrun.load_model(d), data)

    check()


def test_state_json(scratch):
    valid = json.loads((scratch / "checkpoints" / "epoch-000001" / "state.json").read_text())
    model, _, _ = hrun.load_model(scratch)
    from hlbl.config import TrainConfig
    from hlbl.optim import make_optimizer

    tensors = ckpt.load_tensors(scratch / "checkpoints" / "epoch-000001" / "optimizer.safetensors", "hlbl-optimizer")

    def read(d):
        state = ckpt.read_state(d / "checkpoints" / "epoch-000001" / "state.json")
        assert isinstance(state["epoch"], int) and state["lr"] > 0 and math.isfinite(state["lr"])
        assert state["done"] in (True, False)
        optimizer = make_optimizer(model, TrainConfig(), state["lr"])
        ckpt.restore_optimizer(optimizer, tensors, state["optimizer"])
        for group in optimizer.param_groups:  # what the first step would use
            assert type(group["lr"]) in (int, float) and math.isfinite(group["lr"]) and group["lr"] > 0, group
            assert type(group["momentum"]) in (int, float) and math.isfinite(group["momentum"]), group

    @FUZZ
    @given(_documents(valid))
    def check(data):
        _fuzz_file(scratch, "checkpoints/epoch-000001/state.json", read, data)

    check()


def test_vocab_json(scratch):
    valid = json.loads((scratch / "vocab.json").read_text())

    @FUZZ
    @given(_documents(valid))
    def check(data):
        _fuzz_file(scratch, "vocab.json", lambda d: hrun.load_model(d), data)

    check()


def test_tree_json(scratch):
    valid = json.loads((scratch / "tree.json").read_text())

    @FUZZ
    @given(_documents(valid))
    def check(data):
        _fuzz_file(scratch, "tree.json", lambda d: (WordTree.load(d / "tree.json"), hrun.load_model(d)), data)

    check()


def test_metrics_jsonl(scratch):
    line = (scratch / "metrics.jsonl").read_text().splitlines()[0]
    valid = json.loads(line)
    lines = st.one_of(_edits(valid).map(lambda o: json.dumps(o).encode()), st.binary(max_size=60))

    @FUZZ
    @given(st.lists(lines, max_size=3), st.booleans())
    def check(chosen, ended):
        data = b"\n".join(chosen) + (b"\n" if ended and chosen else b"")
        _fuzz_file(scratch, "metrics.jsonl", lambda d: ckpt.read_metrics(d / "metrics.jsonl"), data)

    check()


ARPA = """\\data\\
ngram 1=4
ngram 2=2

\\1-grams:
-1.0\t</s>
-99\t<s>\t-0.5
-0.8\tcat\t-0.3
-1.2\t<unk>

\\2-grams:
-0.2\t<s> cat
-0.1\tcat </s>

\\end\\
"""


def test_arpa():
    base = ARPA.splitlines()
    token = st.sampled_from(
        [
            "-inf",
            "nan",
            "inf",
            "1e400",
            "-0.5",
            "x",
            "",
            "\t",
            " ",
            "\\data\\",
            "ngram 1=9",
            "\\3-grams:",
            "<s>",
            "</s>",
            "cat",
            "\\end\\",
            "-99",
            "ngram 2=-1",
            "\x00",
            "é",
            "1e30",  # a back-off no model has
            "-101",
            "5",
            "0",  # unigrams summing to more than 1
            "-1_0",  # numbers Python reads and ARPA has not
            "NaN",
            "-Infinity",
            "+.5e1",
        ]
    )
    line_edit = st.tuples(st.integers(0, len(base) - 1), st.lists(token, max_size=4).map("\t".join), st.booleans())
    number = st.sampled_from(["1e30", "-101", "5", "0", "-0", "-1_0", "NaN", "-Infinity", "+.5e1", "-inf", "-0.5"])
    field_edit = st.tuples(st.integers(5, 12), number, st.integers(0, 2))  # a number of an n-gram line

    def apply(edits):
        lines = list(base)
        for i, text, how in edits:
            i = min(i, len(lines))
            if how is True:
                lines.insert(i, text)
            elif how is False and lines:
                lines[i % len(lines)] = text
            elif lines:
                fields = lines[i % len(lines)].split("\t")
                fields[min(how, len(fields) - 1)] = text
                lines[i % len(lines)] = "\t".join(fields)
        return "\n".join(lines).encode()

    def read_and_score(data):
        """What loads is a model: values in range, and sentences scored as probabilities (<= 1)."""
        from hlbl.ngram.model import MAX_LOG10_BACKOFF, UNIGRAM_MASS_SLACK, unigram_mass

        model = parse_arpa(data, "lm.arpa")
        for lp, bo in zip(model.log10_prob, model.log10_backoff):
            assert np.all((lp <= 0) | np.isneginf(lp)) and np.all(np.abs(bo) <= MAX_LOG10_BACKOFF)
        assert unigram_mass(model.log10_prob[0]) <= 1 + UNIGRAM_MASS_SLACK
        scores = model.score_sentences([["cat"], ["cat", "cat"], ["x"], []])
        assert np.all((scores <= 0) | np.isneginf(scores)), scores

    @FUZZ
    @given(st.one_of(st.lists(line_edit | field_edit, min_size=1, max_size=3).map(apply), st.binary(max_size=200)))
    def check(data):
        loads_or_one_line_error(read_and_score, data)

    check()


def _lines_as_read(data: bytes, monkeypatch) -> list:
    """Tokens of each line of ``data`` as ``hlbl score`` reads standard input (a too long token: None)."""
    import io

    from hlbl import lines

    class Tokens:
        def __init__(self):
            self.tokens = []

        def feed(self, text):
            self.tokens += text.split()

        def unknown(self):
            self.tokens.append(None)

        def finish(self):
            return self.tokens

    stream = io.BufferedReader(io.BytesIO(data), buffer_size=max(1, lines.READ_BYTES))
    return [x.split() if isinstance(x, str) else x for chunk in lines.read_lines(stream, Tokens) for x in chunk]


def _lines_of_a_corpus_file(path) -> list:
    """Tokens of each line of a corpus file (the text rules), a token over MAX_TOKEN_BYTES as None."""
    from hlbl import lines
    from hlbl.data import iter_sentences

    out, line = [], []
    for tokens, ends_line in iter_sentences(path, blank_lines="keep"):
        line += [t if len(t.encode()) <= lines.MAX_TOKEN_BYTES else None for t in tokens]
        if ends_line:
            out.append(line)
            line = []
    return out


def test_stdin_lines_are_read_by_the_corpus_rules(tmp_path, monkeypatch):
    """Standard input, read in bounded memory (long lines in pieces, too long tokens dropped), gives
    the lines and tokens a corpus file of the same bytes gives; bad UTF-8 is a one-line error in both.
    Bounds and reads are made tiny so that every case (a \\r\\n across two reads, a token across
    many, a long line of blanks) comes up."""
    from hlbl import lines

    piece = st.sampled_from(
        [
            b"a",
            b"bc",
            "\u00e9".encode(),
            b"x" * 9,
            b" ",
            b"\t",
            b"\x0b",
            b"\x0c",
            b"\r",
            b"\n",
            b"\r\n",
            b"\xff",
            b"\xc3",
        ]
    )
    path = tmp_path / "text.txt"

    @settings(FUZZ, max_examples=500)  # cheap, and the cases are many
    @given(st.lists(piece, max_size=40).map(b"".join), st.integers(1, 7), st.integers(2, 12), st.integers(0, 6))
    def check(data, read, long_line, more):
        monkeypatch.setattr(lines, "READ_BYTES", read)
        monkeypatch.setattr(lines, "LONG_LINE_BYTES", long_line)
        monkeypatch.setattr(lines, "MAX_TOKEN_BYTES", long_line + more)  # (a longer token is in a long line)
        path.write_bytes(data)
        want = loads_or_one_line_error(_lines_of_a_corpus_file, path)
        got = loads_or_one_line_error(_lines_as_read, data, monkeypatch)
        assert got == want, (got, want)

    check()


def test_tree_depths_and_stats_without_the_padded_paths_match_them():
    """Depths, leaf words and statistics come from a linear pass (a deep tree's padded paths are
    quadratic): for any shape, the same as the padded paths say."""
    from hlbl.tree import leaf

    @FUZZ
    @given(st.integers(2, 40), st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)), max_size=40))
    def check(V, picks):
        items, children = [leaf(w) for w in range(V)], []
        for j in range(V - 1):  # join two items (random ones, then the last two) into a node
            a, b = picks[j] if j < len(picks) else (len(items) - 2, len(items) - 1)
            first = items.pop(a % len(items))
            second = items.pop(b % len(items))
            children.append([first, second])
            items.append(j)
        tree = WordTree.from_children(children, V - 2, V)
        np.testing.assert_array_equal(tree.leaf_depth, tree.path_mask.sum(1))
        words = np.zeros(len(tree.leaf_word), dtype=np.int64)
        for lf in range(len(words)):  # the word at the end of each padded path
            node, bit = tree.path_nodes[lf, tree.leaf_depth[lf] - 1], tree.path_bits[lf, tree.leaf_depth[lf] - 1]
            words[lf] = -1 - tree.children[node, 0 if bit == 1 else 1]
        np.testing.assert_array_equal(tree.leaf_word, words)
        assert tree.stats()["max_depth"] == tree.path_nodes.shape[1]

    check()


def test_the_fuzzer_sees_a_traceback():
    """The property can fail: a reader raising anything but HlblError is caught."""
    with pytest.raises(AssertionError):
        try:
            loads_or_one_line_error(lambda: {}["missing"])
        except KeyError:
            raise AssertionError("a KeyError escaped") from None
    assert loads_or_one_line_error(lambda: torch.zeros(1)) is not None
