"""A training process that never compiles does not import ``torch._dynamo`` (about 1.3 CPU-s):
its optimiser is built, saved and restored through ``hlbl.eager``, and the result is the same
optimiser torch's own constructor and methods give."""

import json
import subprocess
import sys

import pytest
import torch

from hlbl.eager import build_optimizer, load_state_dict, state_dict, undecorated

# Trains a tiny corpus with the fast engine (a checkpoint each epoch: the optimiser's state_dict),
# resumes it (load_state_dict), then reports whether the compiler was imported; last, with
# torch._dynamo loaded, undecorated must leave torch's methods alone.
PROBE = """
import json, sys
from hlbl.cli import main
data, out = sys.argv[1], sys.argv[2]
common = ["--out", out, "--quiet"]
codes = [main(["train", "--data", data, *common, "--epochs", "1", "--dim", "8", "--context", "2", "--engine", "fast"]),
         main(["train", *common, "--resume", "--epochs", "2", "--engine", "fast"])]
dynamo = "torch._dynamo" in sys.modules
import torch, torch._dynamo
from hlbl.eager import undecorated
kept = undecorated(torch.optim.Optimizer.state_dict) is torch.optim.Optimizer.state_dict
sys.__stderr__.write("PROBE " + json.dumps({"codes": codes, "dynamo": dynamo, "kept": kept}) + "\\n")
"""


def _corpus(root):
    words = [f"w{i}" for i in range(30)]
    for split, n in (("train", 400), ("valid", 40), ("test", 40)):
        lines = [" ".join(words[(i * 7 + j * 3) % 30] for j in range(8)) for i in range(n)]
        (root / f"{split}.txt").write_text("\n".join(lines) + "\n")


def test_fast_engine_training_does_not_import_the_compiler(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    _corpus(data)
    res = subprocess.run(
        [sys.executable, "-c", PROBE, str(data), str(tmp_path / "run")], capture_output=True, text=True, timeout=600
    )
    line = [x for x in res.stderr.splitlines() if x.startswith("PROBE ")]
    assert line, res.stderr[-3000:]
    probe = json.loads(line[-1][len("PROBE ") :])
    assert probe["codes"] == [0, 0], res.stderr[-3000:]
    assert probe["dynamo"] is False  # the fast engine's process never loads the compiler
    assert probe["kept"] is True  # once it is loaded (a process that compiles), torch's methods are used as they are


def _params():
    gen = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(5, 3, generator=gen)), torch.nn.Parameter(torch.randn(3, generator=gen))]


@pytest.mark.parametrize(
    "cls,options",
    [
        (torch.optim.SGD, {"lr": 0.1}),
        (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-3}),
        (torch.optim.Adam, {"lr": 0.01}),
        (torch.optim.Adagrad, {"lr": 0.1}),
    ],
)
def test_build_optimizer_is_torchs_optimizer(cls, options):
    mine, theirs = _params(), _params()
    groups = lambda ps: [{"params": [ps[0]], "weight_decay": 0.5}, {"params": [ps[1]]}]  # noqa: E731
    a, b = build_optimizer(cls, groups(mine), **options), cls(groups(theirs), **options)
    assert type(a) is cls and "add_param_group" not in vars(a)  # the shadowing attribute is gone
    assert a.param_groups[0]["weight_decay"] == 0.5 and a.param_groups[1]["weight_decay"] == options.get(
        "weight_decay", 0
    )
    for _ in range(3):
        for opt, ps in ((a, mine), (b, theirs)):
            opt.zero_grad()
            sum((p**2).sum() for p in ps).backward()
            opt.step()
    for p, q in zip(mine, theirs):
        assert torch.equal(p, q)
    sa, sb = state_dict(a), b.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    assert sa["state"].keys() == sb["state"].keys()
    for k in sa["state"]:
        for name, v in sa["state"][k].items():
            assert torch.equal(torch.as_tensor(v), torch.as_tensor(sb["state"][k][name]))
    c = build_optimizer(cls, groups(_params()), **options)
    load_state_dict(c, sb)
    assert state_dict(c)["param_groups"] == sb["param_groups"]


def test_undecorated_leaves_other_functions_alone():
    def f():
        return 1

    assert undecorated(f) is f
    wrapped = torch._disable_dynamo(f)
    assert undecorated(wrapped) is f or "torch._dynamo" in sys.modules
