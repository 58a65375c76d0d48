"""The README's first command, end to end on PTB (slow: ~1 minute; run with ``-m slow``).

It trains HLBL on a RANDOM tree with the default recipe to its early stop and checks the numbers
the README's results table gives for that row: valid 186.4, test 172.7 on 82,430 test tokens.
One thread is deterministic under the seed; the tolerance covers float rounding that differs
between CPUs (vector widths in the numba kernels), not a different result.
"""

import json
import subprocess
import sys

import pytest

from conftest import ptb_root


@pytest.mark.slow
def test_readme_main_command_reproduces_the_random_tree_row(tmp_path):
    ptb_root()  # $HLBL_DATA's PTB if set, else the default one in this pytest run's cache, as the command finds it
    cmd = [
        sys.executable,
        "-m",
        "hlbl",
        "train",
        "--data",
        "ptb",
        "--tree",
        "random",
        "--out",
        str(tmp_path / "run"),
        "--quiet",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-2000:]
    lines = res.stdout.splitlines()
    report = json.loads(lines[0])
    assert report["test_tokens"] == 82430
    assert report["valid_perplexity"] == pytest.approx(186.4, abs=0.5)
    assert report["test_perplexity"] == pytest.approx(172.7, abs=0.5)
    assert lines[1].startswith("context: ") and lines[2].startswith("sample: ")
