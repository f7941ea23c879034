"""Two profiles of a pass's micro-batches set side by side (``trials.profiling``)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from benchmarks.gpu.profile_compare import compare, main, per_micro_batch
from trials.profiling import COUNT, FIRST, MicroBatchProfiler


def _pass(out: Path, label: str, extra_sort: bool) -> Path:
    """A pass of eight micro-batches, each a few matmuls (and a sort with ``extra_sort``)."""
    profiler = MicroBatchProfiler(out, label)
    x = torch.randn(128, 128)
    for index in range(8):
        profiler.before(index)
        y = x @ x @ x
        if extra_sort:
            torch.sort(y.flatten())
    path = profiler.finish()
    assert path is None  # finished at micro-batch FIRST + COUNT already
    (written,) = out.glob(f"profile-{label}-*.json")
    return written


def test_the_ops_one_pass_runs_and_the_other_does_not_lead_the_table(tmp_path: Path, capsys) -> None:
    a = _pass(tmp_path, "plain", extra_sort=False)
    b = _pass(tmp_path, "sorting", extra_sort=True)
    docs = [json.loads(p.read_text()) for p in (a, b)]
    assert all(d["micro_batches"] == list(range(FIRST, FIRST + COUNT)) for d in docs)
    pa, pb = (per_micro_batch(d) for d in docs)
    assert pa["ops"]["aten::mm"]["calls"] == pb["ops"]["aten::mm"]["calls"] == 2.0  # two matmuls each
    assert "aten::sort" not in pa["ops"] and pb["ops"]["aten::sort"]["calls"] == 1.0
    table = compare(pa, pb, top=5)
    sort_row = next(line for line in table.splitlines() if line.startswith("aten::sort"))
    assert sort_row.split()[1:3] == ["0.0", "1.0"]
    assert main([str(a), str(b), "--top", "5"]) == 0
    assert "aten::sort" in capsys.readouterr().out


def test_a_pass_shorter_than_the_profiled_stretch_is_profiled_to_its_end(tmp_path: Path) -> None:
    profiler = MicroBatchProfiler(tmp_path, "short")
    for index in range(FIRST + 1):
        profiler.before(index)
        torch.ones(4).sum()
    path = profiler.finish()
    assert path is not None and json.loads(path.read_text())["micro_batches"] == [FIRST]
    # A pass that never reached the first profiled micro-batch writes nothing.
    none = MicroBatchProfiler(tmp_path / "none", "none")
    none.before(0)
    assert none.finish() is None and not (tmp_path / "none").exists()
