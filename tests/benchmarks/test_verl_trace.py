"""A traced verl run read back: the trace's records in the order their calls ended, cut into
steps that account for every token verl logged, inside the times verl's driver took."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.gpu.verl_trace import main, rows, steps_of
from trials.verl.trace import read_trace

ROOT = Path(__file__).resolve().parents[2]
TRACED = ROOT / "benchmarks" / "results" / "verl-qwen2.5-1.5b-h100-trace.json"


def test_records_come_back_in_the_order_their_calls_ended(tmp_path: Path) -> None:
    (tmp_path / "trace-2.jsonl").write_text(json.dumps({"call": "infer_batch", "end": 3.0}) + "\n")
    (tmp_path / "trace-1.jsonl").write_text(
        json.dumps({"call": "train_mini_batch", "end": 5.0})
        + "\n"
        + json.dumps({"call": "forward_backward_batch", "end": 1.0})
        + "\n"
        + '{"call": "infer_b'  # a worker killed mid-line
    )
    (tmp_path / "other.jsonl").write_text(json.dumps({"call": "not a trace file", "end": 0.0}) + "\n")
    assert [r["call"] for r in read_trace(tmp_path)] == [
        "forward_backward_batch",
        "infer_batch",
        "train_mini_batch",
    ]
    assert read_trace(tmp_path / "missing") == []


def test_a_traced_run_accounts_for_every_token_of_every_step(capsys) -> None:
    run = json.loads(TRACED.read_text())["run"]
    (verl,) = [r for r in run["runs"] if r["kind"] == "verl" and r.get("trace")]
    steps = steps_of(verl["trace"])
    assert len(steps) == len(verl["steps"]) >= 4
    assert all(
        set(step) == {"timing_s/old_log_prob", "timing_s/ref", "timing_s/update_actor"} for step in steps
    )
    for row in rows(verl):
        logged = verl["steps"][row["step"] - 1]
        assert row["tokens"] == logged["perf/total_num_tokens"], row
        # Nested: verl's driver timing holds the worker's call, which holds its passes,
        # which hold their micro-batches and their cut.
        assert (
            row["micro_batches_s"] + row["prepare_s"] <= row["passes_s"] <= row["worker_s"] <= row["verl_s"]
        )
        assert row["micro_batches"] >= 1
    assert main([str(TRACED), "--run", "run"]) == 0
    table = capsys.readouterr().out
    assert table.count("| winner |") == 3 * len(steps)
