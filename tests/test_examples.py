"""The examples run: each in its quick mode, as a user would start it."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_example(script: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, env=env, timeout=600)


def test_the_lstm_example_trains_every_output_layer_in_quick_mode(tmp_path):
    out = tmp_path / "results.json"
    proc = run_example(ROOT / "examples" / "lstm_lm" / "lstm_lm.py", "--quick", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = {r["output"]: r for r in json.loads(out.read_text())}
    assert set(results) == {"full", "adaptive", "tree", "learned-tree", "sampled"}
    for r in results.values():
        # exact evaluation of a toy grammar over ~60 words: far below the uniform model's perplexity
        assert 1.0 < r["test_ppl"] < 40, r
        assert len(r["sample"].split()) == 8
    assert results["learned-tree"]["tree"]["words"] == 58 and "learned tree from hidden features" in proc.stderr


def test_the_lstm_example_refuses_an_unknown_output():
    proc = run_example(ROOT / "examples" / "lstm_lm" / "lstm_lm.py", "--output", "tree,nope")
    assert proc.returncode == 2 and "unknown output 'nope'" in proc.stderr
