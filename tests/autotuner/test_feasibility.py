"""Feasibility by monotonicity: which measured OOMs rule out their larger neighbours."""

from __future__ import annotations

import pytest

from autotuner.feasibility import Feasibility, rules_out
from autotuner.knobs import SGLANG_KWARGS, R, memory_knobs
from autotuner.records import TrialRecord

CHUNK = SGLANG_KWARGS + "chunked_prefill_size"
CONFIG = {R + "gpu_memory_utilization": 0.5, R + "max_num_seqs": 256, CHUNK: 8192}


def _oom(error_type: str, message: str) -> TrialRecord:
    return TrialRecord(0, "oom", config=dict(CONFIG), error_type=error_type, error_message=message)


@pytest.mark.parametrize(
    ("error_type", "message"),
    [
        # SGLang's KV cache too small for the requests: a larger budget helps, so these rule out
        # nothing (texts of SGLang 0.5.17 and of trials.rollout.phase).
        (
            "KvCacheExhausted",
            "engine returned 310 tokens for a request asking 500 (request 3; 41 of "
            "64 requests came back with other lengths than asked): the KV cache ran out",
        ),
        (
            "EngineDied",
            "an SGLang process failed and signalled the trial (SIGQUIT) (last: RuntimeError: "
            "Not enough memory. Please try to increase --mem-fraction-static.)",
        ),
        (
            "ValueError",
            "Loaded weights leave no GPU memory for the KV cache under "
            "--mem-fraction-static=0.1. Raise --mem-fraction-static above 0.123",
        ),
        (
            "HTTPException",
            "500: Out of memory even after retracting all other requests in the "
            "decode batch. Aborting the last request.",
        ),
        ("ValueError", "Input length (3900 tokens) exceeds the maximum allowed length (3000 tokens)."),
    ],
)
def test_sglangs_kv_shortages_rule_out_no_larger_config(error_type, message) -> None:
    assert not rules_out(_oom(error_type, message))


def test_a_cuda_oom_under_sglang_rules_out_larger_chunks_and_budgets() -> None:
    feasibility = Feasibility()
    feasibility.add(_oom("OutOfMemoryError", "CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert CHUNK in memory_knobs("grows")
    assert feasibility.ruled_out_by(CONFIG | {CHUNK: 16384}) is not None
    assert feasibility.ruled_out_by(CONFIG | {R + "gpu_memory_utilization": 0.6}) is not None
    assert feasibility.ruled_out_by(CONFIG | {CHUNK: 4096}) is None
