"""The host-speed probe (benchmarks/gpu/host_speed.py) on this machine's CPU."""

from __future__ import annotations

import json
import os

from benchmarks.gpu.host_speed import main, measure


def test_each_path_is_timed_per_op_every_turn_and_the_cpu_path_costs_more_than_python():
    found = measure(ops=2000, repeats=3)
    assert set(found["us_per_op"]) == {"python_loop", "torch_cpu"}  # no CUDA here
    assert all(len(turns) == 3 and min(turns) > 0 for turns in found["us_per_op"].values())
    # A torch op goes through the dispatcher and a kernel: far more than a Python addition.
    assert found["median_us_per_op"]["torch_cpu"] > 5 * found["median_us_per_op"]["python_loop"]


def test_the_json_names_the_host_and_its_cpus(tmp_path, capsys):
    out = tmp_path / "speed.json"
    assert main(["--ops", "1000", "--repeats", "2", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["host"]["cpu_cores"] == str(len(os.sched_getaffinity(0)))
    assert doc["device"].startswith("cpu: ") and doc["ops"] == 1000
    assert "torch_cpu" in capsys.readouterr().out
