"""The command line answers at once: building the parser, ``--help`` and argument errors import no
torch, numpy or numba (each costs seconds on a cold start; the commands import them when they run)."""

import json
import subprocess
import sys
import time

import pytest

HEAVY = ("torch", "numpy", "numba", "scipy")

# Every command's help, the top-level help and version, and argument errors (exit 2).
ARGVS = [
    ["--help"],
    ["--version"],
    [],
    ["train", "--data"],
    ["train", "--data", "x", "--out", "r", "--dim", "many"],
    ["tree"],
    ["eval"],
    ["score"],
    ["eval", "--mixture", "m.json", "--with", "R"],
] + [
    [*command, "--help"]
    for command in (
        ["train"],
        ["eval"],
        ["tree", "stats"],
        ["tree", "make"],
        ["tree", "build"],
        ["tree", "refine"],
        ["reproduce"],
        ["generate"],
        ["score"],
        ["predict"],
        ["serve"],
        ["ngram", "train"],
        ["ngram", "eval"],
        ["ngram", "score"],
        ["data", "split"],
    )
]

# Runs main on each argv in one interpreter, then reports the exit codes and the heavy modules loaded.
PROBE = """
import json, sys
from hlbl.cli import main
codes = []
for argv in json.loads(sys.argv[1]):
    try:
        codes.append(main(argv))
    except SystemExit as e:
        codes.append(e.code)
heavy = sorted({m.split(".")[0] for m in sys.modules} & set(json.loads(sys.argv[2])))
sys.__stderr__.write("PROBE " + json.dumps({"codes": codes, "heavy": heavy}) + "\\n")
"""


def _probe(argvs):
    res = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(argvs), json.dumps(HEAVY)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stderr.rsplit("PROBE ", 1)[1])


def test_help_and_argument_errors_import_no_heavy_module():
    report = _probe(ARGVS)
    assert report["heavy"] == []
    assert report["codes"][:4] == [0, 0, 2, 2]  # help, version; no command and a flag without its value: errors
    assert all(code in (0, 2) for code in report["codes"])


def test_the_probe_sees_a_heavy_import(tmp_path):
    """The check above can fail: a command that runs loads torch, and the probe reports it."""
    report = _probe([["train", "--data", str(tmp_path / "none"), "--out", str(tmp_path / "run")]])
    assert report["codes"] == [2] and "torch" in report["heavy"]


@pytest.mark.parametrize("argv", [["--help"], ["train", "--data"]])
def test_the_hlbl_entry_point_answers_without_torch(argv):
    """``python -m hlbl`` itself (the package, its __main__ and the CLI), as a person runs it."""
    t0 = time.perf_counter()
    res = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "hlbl", *argv], capture_output=True, text=True, timeout=120
    )
    seconds = time.perf_counter() - t0
    imported = {line.rsplit("|", 1)[1].strip().split(".")[0] for line in res.stderr.splitlines() if "|" in line}
    assert "hlbl" in imported and imported.isdisjoint(HEAVY), sorted(imported & set(HEAVY))
    assert res.returncode == (0 if argv == ["--help"] else 2)
    if argv != ["--help"]:
        assert res.stderr.splitlines()[-1].startswith("hlbl train: error: argument --data: expected one argument")
    # About 0.3 s; importing torch took 4 s or more. A loose bound, for a loaded machine.
    assert seconds < 3, f"python -m hlbl {' '.join(argv)} took {seconds:.1f} s"
