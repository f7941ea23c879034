"""Spec builders for the trial worker's tests (the tiny model on CPU)."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

from autotuner.knobs import engine_arguments
from trials.types import RolloutKnobs, TrainKnobs, TrialSpec

REPO = Path(__file__).resolve().parents[2]
TINY_CONFIG = REPO / "autotuner" / "catalog" / "tiny.json"
QWEN_05B_CONFIG = REPO / "autotuner" / "catalog" / "qwen2.5-0.5b.json"


def make_spec(config: dict, trial_id: str = "t", requests: int = 32, **overrides) -> TrialSpec:
    """A CPU spec for the tiny model: ``requests`` requests/sequences of 16-64 tokens each side."""
    rng = random.Random(0)
    prompts = [rng.randrange(16, 64) for _ in range(requests)]
    responses = [rng.randrange(16, 64) for _ in range(requests)]
    spec = TrialSpec(
        trial_id=trial_id,
        model_name="tiny",
        model_config=config,
        device="cpu",
        rollout=RolloutKnobs(
            gpu_memory_utilization=0.25,
            max_num_seqs=32,
            max_num_batched_tokens=1024,
            enforce_eager=True,
            max_model_len=256,
            engine_args=engine_arguments("vllm"),
        ),
        train=TrainKnobs(
            ppo_micro_batch_size_per_gpu=4,
            log_prob_micro_batch_size_per_gpu=8,
            ref_log_prob_micro_batch_size_per_gpu=8,
        ),
        prompt_lengths=prompts,
        response_lengths=responses,
        train_prompt_lengths=list(prompts),
        train_response_lengths=list(responses),
        local_mini_batch_size=16,
        device_memory_cap_gib=2.0,
    )
    for key, value in overrides.items():
        setattr(spec, key, value)
    return spec


def with_engine(spec: TrialSpec, engine: str) -> TrialSpec:
    """``spec`` on ``engine``, its knobs passed as the knob table names them for that engine."""
    spec.rollout.engine = engine
    spec.rollout.engine_args = engine_arguments(engine)
    return spec


def wait_for_phase(pid: int, past: tuple[str, ...] = (), deadline_s: float = 120) -> None:
    """Wait until the trial (or rank) process ``pid`` reports a phase other than those in
    ``past``: its ``--progress`` file, rewritten at each phase entry."""
    import psutil  # the worker extra: imported where a test needs it

    argv = psutil.Process(pid).cmdline()
    progress = argv[argv.index("--progress") + 1]
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            phase = json.loads(Path(progress).read_text()).get("phase")
        except (OSError, ValueError):  # not written yet, or caught mid-write
            phase = None
        if phase is not None and phase not in past:
            return
        time.sleep(0.02)
    raise AssertionError(f"trial process {pid} reported no phase beyond {past} in {deadline_s:g} s")
