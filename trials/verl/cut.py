"""verl's cut of a rank's batch into micro-batches, timed by verl's own code (CPU only).

verl v0.9's FSDP engine starts every log-prob pass, and every mini-batch of the update,
with ``verl.workers.engine.utils.prepare_micro_batches``; with ``use_dynamic_bsz`` its
Karmarkar-Karp partition and per-micro-batch ``index_select_tensor_dict`` cost CPU time
that grows faster than the square of a rank's sequences (``benchmarks/verl_batching.py``).
A trial's own micro-batching costs nothing like it, so a trial whose spec names verl's
environment (``TrialSpec.verl_cut_env``) has that environment time verl's cut of the
trial's own batch on the trial's host (``measure``), and counts it in the phases verl spends
it in (``trials.train``).

``verl_batch`` builds a rank's batch as verl's trainer hands it to the old-log-prob pass:
the tensors verl's agent loop returns and the fields of the verl runner's dataset, turned
into verl's no-padding layout by verl's ``left_right_2_no_padding``. ``cut_seconds`` (run
in verl's environment: ``python -m trials.verl cut``) times the cut of each phase once,
after one untimed cut.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

PHASES = ("old_log_prob", "ref_log_prob", "update_actor")


@dataclass(frozen=True)
class CutPlan:
    """One rank's sequences and the knobs verl cuts them by."""

    prompt_lengths: list[int]
    response_lengths: list[int]
    max_prompt_length: int
    max_response_length: int
    use_dynamic_bsz: bool
    log_prob_max_token_len: int
    ppo_max_token_len: int
    log_prob_micro_batch_size: int
    ref_log_prob_micro_batch_size: int
    ppo_micro_batch_size: int
    mini_batch_size: int  # sequences per optimizer step on this rank
    use_ref: bool = True


def verl_batch(prompts: list[int], responses: list[int], max_prompt: int, max_response: int) -> Any:
    """The rank's batch as verl's trainer passes it to the old-log-prob pass (imports verl)."""
    import numpy as np
    import torch
    from verl import DataProto
    from verl.workers.utils.padding import left_right_2_no_padding

    size = len(prompts)
    attention = torch.zeros(size, max_prompt + max_response, dtype=torch.long)
    response_mask = torch.zeros(size, max_response, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        attention[i, max_prompt - p : max_prompt + r] = 1
        response_mask[i, :r] = 1
    ids = torch.randint(0, 1000, attention.shape)
    tensors = {
        "prompts": ids[:, :max_prompt].clone(),
        "responses": ids[:, max_prompt:].clone(),
        "input_ids": ids,
        "attention_mask": attention,
        "position_ids": (attention.cumsum(-1) - 1).clamp(min=0),
        "response_mask": response_mask,
        "token_level_scores": torch.zeros(size, max_response),
    }
    rows = range(size)
    non_tensors = {
        "data_source": np.array(["autotuner"] * size, dtype=object),
        "ability": np.array(["synthetic"] * size, dtype=object),
        "reward_model": np.array([{"style": "rule", "ground_truth": ""} for _ in rows], dtype=object),
        "extra_info": np.array([{"index": i} for i in rows], dtype=object),
        "raw_prompt": np.array([[{"role": "user", "content": "x"}] for _ in rows], dtype=object),
        "index": np.arange(size),
        "uid": np.array([str(i) for i in rows], dtype=object),
        "agent_name": np.array(["autotuner_workload"] * size, dtype=object),
        "__num_turns__": np.full(size, 2, dtype=np.int32),
    }
    batch = DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)
    return left_right_2_no_padding(batch.to_tensordict())


def prepare_seconds(td: Any, dynamic: bool, max_tokens: int, micro_batch_size: int) -> tuple[float, int]:
    """Seconds of verl's ``prepare_micro_batches`` on ``td``, and how many micro-batches."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine.utils import prepare_micro_batches

    tu.assign_non_tensor(
        td,
        use_dynamic_bsz=dynamic,
        max_token_len_per_gpu=max_tokens,
        micro_batch_size_per_gpu=micro_batch_size,
    )
    t0 = time.perf_counter()
    micro_batches, _ = prepare_micro_batches(td)
    return time.perf_counter() - t0, len(micro_batches)


def cut_seconds(plan: CutPlan) -> dict[str, float]:
    """Per phase, the seconds verl cuts ``plan``'s batch in (the update: over its mini-batches)."""
    from verl.utils import tensordict_utils as tu

    td = verl_batch(
        plan.prompt_lengths, plan.response_lengths, plan.max_prompt_length, plan.max_response_length
    )
    dynamic, budget = plan.use_dynamic_bsz, plan.log_prob_max_token_len
    prepare_seconds(td, dynamic, budget, plan.log_prob_micro_batch_size)  # untimed: lazy set-up
    seconds = {"old_log_prob": prepare_seconds(td, dynamic, budget, plan.log_prob_micro_batch_size)[0]}
    if plan.use_ref:
        seconds["ref_log_prob"] = prepare_seconds(td, dynamic, budget, plan.ref_log_prob_micro_batch_size)[0]
    size = len(plan.prompt_lengths)
    update = 0.0
    for start in range(0, size, plan.mini_batch_size):
        mini = tu.index_select_tensor_dict(td, list(range(start, min(start + plan.mini_batch_size, size))))
        update += prepare_seconds(mini, dynamic, plan.ppo_max_token_len, plan.ppo_micro_batch_size)[0]
    seconds["update_actor"] = update
    return seconds


def measure(plan: CutPlan, env: dict[str, str], timeout_s: float = 900.0) -> dict[str, float] | None:
    """``cut_seconds(plan)`` in verl's environment (``env``: its ``python`` and, where set, its
    ``PYTHONPATH``), or None when that fails (logged: the trial then goes on without it).

    With ``env["cache_dir"]``, a cut already timed on this host for the same plan by the same
    Python is read back instead of timed again (trials of one job share their batch, and
    many of them the knobs the cut depends on)."""
    cached = _cache_file(plan, env)
    if cached is not None and cached.exists():
        try:
            return {k: float(v) for k, v in json.loads(cached.read_text()).items()}
        except (OSError, ValueError):
            pass
    seconds = _timed_in_verl(plan, env, timeout_s)
    if seconds is not None and cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(seconds))
        os.replace(tmp, cached)
    return seconds


def _cache_file(plan: CutPlan, env: dict[str, str]) -> Path | None:
    if not env.get("cache_dir"):
        return None
    identity = json.dumps(
        [asdict(plan), env["python"], env.get("PYTHONPATH"), socket.gethostname()], sort_keys=True
    )
    return Path(env["cache_dir"]) / f"{hashlib.sha256(identity.encode()).hexdigest()[:32]}.json"


def _timed_in_verl(plan: CutPlan, env: dict[str, str], timeout_s: float) -> dict[str, float] | None:
    root = str(Path(__file__).resolve().parents[2])
    child = dict(os.environ)
    child["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    with tempfile.TemporaryDirectory(prefix="verl-cut-") as folder:
        spec, out = Path(folder) / "plan.json", Path(folder) / "cut.json"
        spec.write_text(json.dumps(asdict(plan)))
        command = [env["python"], "-m", "trials.verl", "cut", "--spec", str(spec), "--out", str(out)]
        try:
            done = subprocess.run(command, env=child, capture_output=True, text=True, timeout=timeout_s)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("verl's cut was not timed: %s", exc)
            return None
        if done.returncode != 0 or not out.exists():
            log.warning("verl's cut was not timed (exit %s): %s", done.returncode, done.stderr[-2000:])
            return None
        return {k: float(v) for k, v in json.loads(out.read_text()).items()}
