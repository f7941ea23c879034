"""verl runs for tests that cannot run verl (it does not train on a CPU): each step's metrics
written as verl's console logger prints them (``verl.utils.logger.aggregate_logger.
LocalLogger``: ``step:N - key:pprint(value) - ...``, verl's numpy scalars as ``np.float64(..)``),
then read back by the runner's own parser (``trials.verl.metrics``) into the
``VerlRunResult`` a real run returns. ``tests/autotuner/test_verification.py`` checks these
lines against verl's own logger where verl's environment is present."""

from __future__ import annotations

import pprint
from typing import Any

import numpy as np

from trials.verl.metrics import parse_console, summarize
from trials.verl.types import VerlRunResult

# verl's trainer computes its timings and throughput with numpy (np.mean, np.float64) and
# logs plain Python numbers beside them: both forms, as pprint writes them.
_NUMPY_KEYS = ("perf/throughput", "timing_s/gen", "response_length/mean")


def step_metrics(throughput: float, phase_s: dict[str, float]) -> dict[str, Any]:
    """One step's metrics as verl's trainer hands them to its logger (numpy or float)."""
    step_s = sum(phase_s.values())
    data: dict[str, Any] = {f"timing_s/{k}": v for k, v in phase_s.items()}
    data |= {
        "timing_s/step": step_s,
        "perf/throughput": throughput,
        "perf/time_per_step": step_s,
        "perf/max_memory_allocated_gb": 30.5,
        "perf/max_memory_reserved_gb": 34.0,
        "response_length/mean": 48,
    }
    return {k: np.float64(v) if k in _NUMPY_KEYS else v for k, v in data.items()}


def console_line(step: int, data: dict[str, Any]) -> str:
    """What ``LocalLogger.log(data, step)`` prints (``concat_dict_to_str``)."""
    return " - ".join([f"step:{step}", *(f"{k}:{pprint.pformat(v)}" for k, v in data.items())])


def verl_result(run_id: str, steps: list[dict[str, Any]], warmup_steps: int = 1) -> VerlRunResult:
    """A finished run whose steps verl logged as ``steps``, parsed as the runner parses them."""
    lines = [console_line(i, data) for i, data in enumerate(steps, start=1)]
    ordered, measured = summarize(parse_console(lines), warmup_steps)
    return VerlRunResult(
        run_id,
        "ok",
        steps=ordered,
        measured=measured,
        warmup_steps=warmup_steps,
        versions={"verl": "0.9.1", "vllm": "0.24.0", "torch": "2.9.0"},
        device="NVIDIA H200",
    )
