"""A tuning job on one GPU that verifies in verl itself (``budget.verify_in_verl``), end to end
through the CLI: real trials, then the chosen ones each run in real verl (``main_ppo``, 4
steps), recorded beside the trials, and the winner picked by verl's measurement. Its two
trials are its baselines (verl's defaults and verl's example for the size), so the fastest
front trial is one of them and both are verified: two runs in verl. On a CPU a job refuses
``verify_in_verl`` (tests/autotuner/test_verification.py), so this path runs only here
(benchmarks/gpu/gpu-tests.sh)."""

from __future__ import annotations

import json
import re

import pytest
from sqlalchemy import create_engine, text
from verl_helpers import SMALL_GPU_WORKLOAD, verl_python  # tests/trials: on sys.path by conftest

from autotuner.knobs import A, R
from autotuner.spec import parse_job_spec
from autotuner.trialspec import batch_draw
from trials.lengths import step_lengths

from .conftest import run_cli, write_job

JOB = {
    "name": "gpu-verify",
    "workload": SMALL_GPU_WORKLOAD,
    "cluster": {"device": "cuda", "n_gpus_per_node": 1},
    "search": {
        R + "enforce_eager": True,  # no CUDA graphs to capture: short engine start-ups
        R + "gpu_memory_utilization": 0.5,
        A + "use_dynamic_bsz": False,
        A + "ppo_micro_batch_size_per_gpu": [2, 4],
    },
    "budget": {
        "max_trials": 2,
        "baseline_runs": 1,
        "remeasure_finalists": 0,
        "trial_timeout_s": 600,
        "verify_in_verl": 1,
        "verify_rounds": 1,
        "verify_steps": 4,
        "verify_timeout_s": 900,
    },
    "sampler": "random",
    "seed": 0,
}


@pytest.mark.gpu
@pytest.mark.timeout(2400)  # two trials and two runs in verl (about 6 minutes each on an H100)
def test_a_job_verifies_its_trials_in_verl_and_verl_picks_the_winner(tmp_path, cli_env) -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU with CUDA")
    verl_python()  # skips without verl's environment
    job = write_job(tmp_path / "job.json", JOB)
    done = run_cli(["tune", str(job), "-o", str(tmp_path / "out")], cli_env, timeout=2400)
    out = done.stdout
    print(out)  # the job's report, kept in the GPU host's log (pytest -rP)
    assert done.returncode == 0, out[-6000:] + done.stderr[-6000:]
    lines = re.findall(r"trial\s+(\d+)\s+verl\s+([\d.]+) tok/s/GPU \(1 run\); trial off by: (.+)", out)
    verified = {int(number): float(median) for number, median, _ in lines}
    assert sorted(verified) == [0, 1], out  # verl's defaults and verl's example
    assert all(median > 0 for median in verified.values())
    # Each verified trial's prediction error, per phase and for the step.
    assert all("rollout" in errors and "step" in errors for *_, errors in lines), lines
    winner = re.search(r"winner picked by (\w+)", out)
    assert winner is not None and winner.group(1) == "verl", out
    assert "measured in verl" in out

    database = create_engine(f"sqlite:///{cli_env['AUTOTUNER_DATA_DIR']}/autotuner.db")
    with database.connect() as conn:
        rows = conn.execute(text("SELECT trial_number, status, result FROM verl_runs ORDER BY id")).all()
    assert sorted(n for n, *_ in rows) == sorted(verified)
    assert {status for _, status, _ in rows} == {"ok"}
    # Every verl step ran the batch the trials ran: one response length, the draw's.
    _, responses = step_lengths(batch_draw(parse_job_spec(JOB)))
    for *_, result in rows:
        means = [step["response_length/mean"] for step in json.loads(result)["steps"]]
        assert len(means) == JOB["budget"]["verify_steps"]
        assert all(abs(m - sum(responses) / len(responses)) < 1e-6 for m in means), means

    job_id = re.search(r"job ([0-9a-f]{32})", out).group(1)
    shown = run_cli(["jobs", job_id], cli_env).stdout
    assert shown.count("[verl]") == len(verified) and "picked by verl" in shown
