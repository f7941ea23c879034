"""The layout benchmark's rows as real train-only trials of the tiny model on the CPU."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.gpu.layout_bench import main


def test_rows_run_as_trials_of_the_strategy_asked_for(tmp_path: Path, capsys) -> None:
    out = tmp_path / "layout.json"
    argv = ["--device", "cpu", "--model", "tiny", "--prompts", "2", "--repeats", "1"]
    assert main([*argv, "--rows", "packed-4,padded-4", "--strategy", "fsdp2", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [(t["row"], t["status"], t["strategy"]) for t in doc["trials"]] == [
        ("packed-4", "ok", "fsdp2"),
        ("padded-4", "ok", "fsdp2"),
    ]
    rows = doc["rows"]
    assert rows["packed-4"]["ratio_to_packed_4"] == 1.0
    padded = rows["padded-4"]
    assert padded["ratio_to_packed_4"] == padded["median"] / rows["packed-4"]["median"]
    assert "| padded-4 | 1 |" in capsys.readouterr().out
