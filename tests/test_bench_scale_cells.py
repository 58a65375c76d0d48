"""bench/scale.py's grid cells of several vocabularies, as bench/gutenberg.py reads them: each
vocabulary's figures come from its own cells only (the long runs are benchmarks, so this checks
the bookkeeping on made-up cells)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


def bench_module(name: str):
    sys.path.insert(0, str(BENCH))  # the scripts import their shared _common
    try:
        spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(BENCH))


def cell(vocab_flag: str, test: float, mix: float) -> dict:
    return {"command": f"hlbl train --data gutenberg --threads 1{vocab_flag} --tree T --dim 300 --context 10",
            "dim": 300, "context": 10, "tree": "x4", "vocab_size": 0, "test_ppl": test, "mixture_test_ppl": mix,
            "mixture_command": "hlbl eval R --interpolate K"}  # fmt: skip


def test_grid_keys_name_the_vocabulary_beside_the_50k_cells():
    scale = bench_module("scale")
    assert [scale.vocab_suffix(v) for v in (50000, 0, 18000)] == ["", "-all", "-v18000"]


def test_each_vocabulary_counts_its_own_grid_cells_only(tmp_path):
    gutenberg = bench_module("gutenberg")
    cells = {"300x10-x4": cell(" --max-vocab 50000", 113.4, 94.2), "300x10-x4-all": cell("", 135.0, 110.0)}
    (tmp_path / "scale_grid.json").write_text(json.dumps({"cells": cells}))
    assert [c["test_ppl"] for c in gutenberg.grid_cells(tmp_path, "50k")] == [113.4]
    assert [c["test_ppl"] for c in gutenberg.grid_cells(tmp_path, "default")] == [135.0]
    keys = gutenberg.scale_keys(tmp_path, {}, {"rows": {"50k": {"test_ppl": 116.55}}})
    assert keys["best_50k_test_ppl"] == pytest.approx(113.4) and keys["mixture_50k_test_ppl"] == pytest.approx(94.2)
    assert keys["best_tree"]["vocab"] == "50k"
    cells["300x10-x4"]["test_ppl"] = 140.0  # now the default vocabulary's cell is the best model
    (tmp_path / "scale_grid.json").write_text(json.dumps({"cells": cells}))
    keys = gutenberg.scale_keys(tmp_path, {}, {"rows": {"50k": {"test_ppl": 116.55}}})
    assert keys["best_tree"]["vocab"] == "default" and keys["best_50k_test_ppl"] == pytest.approx(140.0)
