"""verl's cut of a rank's batch into micro-batches, timed by verl's own code (CPU only).

verl v0.9's FSDP engine starts every log-prob pass, and every mini-batch of the update,
with ``verl.workers.engine.utils.prepare_micro_batches``; with ``use_dynamic_bsz`` its
Karmarkar-Karp partition and per-micro-batch ``index_select_tensor_dict`` cost CPU time
that grows faster than the square of a rank's sequences (``benchmarks/verl_batching.py``).
A trial's own micro-batching costs nothing like it, so a trial whose spec names verl's
environment (``TrialSpec.verl_cut_env``) has that environment time verl's cut of the
trial's own batch on the trial's host (``measure``), and counts it in the phases verl spends
it in (``trials.train``). The same cut says which sequences each of verl's micro-batches
holds (``PreparedCut.partitions``): a one-rank trial runs those micro-batches, in verl's
order, rather than its own (``trials.train.verls_plans``).

Beside the cut, the same environment times the rest of the host work verl's worker does
around its micro-batches on a batch of this shape, with verl's own functions: the update
takes each mini-batch out of the rank's batch (``mini_batch_timed``), and a log-prob pass
gathers its micro-batches' outputs back into the batch's order (``outputs_timed``). A
phase's seconds are the sum (``PARTS`` names each share). What runs on the GPU inside a
micro-batch is the trial's own to measure.

``worker_batch`` builds a rank's batch as verl v0.9's default trainer hands it to the
old-log-prob pass (every per-sequence tensor nested); ``verl_batch`` as its legacy trainer
does. ``cut_seconds`` (run in verl's environment: ``python -m trials.verl cut``) times the cut
of each phase up to three times, after one untimed cut (``prepared_batch``), with Python's
collector's share (``trials.verl.gcclock``). A trial readies that process while it starts
(``PreparedCut``: verl imported, the batch built and cut once) and has it time the cut
when the trial reaches its train phase, its own work stopped: the seconds verl's
environment takes to start cost the trial no GPU time, and the timed cut runs on a host as
quiet as verl's worker is when it cuts (a cut timed beside other work would time the load).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import select
import socket
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from trials.memory import not_the_trials
from trials.verl.gcclock import CLOCK, heap

log = logging.getLogger(__name__)

PHASES = ("old_log_prob", "ref_log_prob", "update_actor")
BATCH_LAYOUT = 4  # the batch ``worker_batch`` builds and the file a cut writes: another is timed again
# What a phase's seconds hold beside its cut (``prepare_s``): the update's mini-batch
# selection (``select_s``), a log-prob pass's outputs gathered (``outputs_s``).
PARTS = ("prepare_s", "select_s", "outputs_s")
REPEATS = 3  # cuts of one phase, at most
REPEAT_BUDGET_S = 3.0  # no further cut of a phase once its cuts took this long
# The per-sequence tensors of a rank's batch in verl's worker, by the pass that cuts it
# (verl v0.9's default trainer, ``trainer.use_v1``: its agent loop's fields, each a jagged
# nested tensor; the entries verl's worker trace records): the old-log-prob pass cuts
# ``ENTRIES``, the reference's pass those and ``REF_ENTRIES``, each update mini-batch all.
ENTRIES = ("input_ids", "position_ids", "prompts", "responses", "response_mask", "loss_mask",
           "rm_scores", "rollout_log_probs", "dummy_tensor")  # fmt: skip
REF_ENTRIES = ("log_probs", "old_log_probs", "entropy")
UPDATE_ENTRIES = ("ref_log_prob", "advantages", "returns")
# Its per-sequence non-tensor fields (the dataset's row and the agent loop's output).
FIELDS = ("data_source", "ability", "reward_model", "extra_info", "raw_prompt", "index", "uid",
          "tools_kwargs", "interaction_kwargs", "session_id", "num_turns", "metrics", "extra_fields",
          "multi_modal_inputs", "prompt")  # fmt: skip


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


def worker_batch(prompts: list[int], responses: list[int]) -> Any:
    """The rank's batch as verl v0.9's default trainer hands it to the old-log-prob pass:
    every per-sequence tensor of ``ENTRIES`` a jagged nested tensor (verl's cut unbinds and
    rebuilds each of them for every micro-batch), the fields of ``FIELDS`` beside them
    (imports verl)."""
    import torch
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    rows = list(zip(prompts, responses, strict=True))
    ids = [torch.randint(0, 1000, (p + r,)) for p, r in rows]
    per_row = {
        "input_ids": ids,
        "position_ids": [torch.arange(p + r) for p, r in rows],
        "prompts": [row[:p] for row, (p, _) in zip(ids, rows, strict=True)],
        "responses": [row[p:] for row, (p, _) in zip(ids, rows, strict=True)],
        "response_mask": [torch.ones(r, dtype=torch.int64) for _, r in rows],
        "loss_mask": [torch.ones(r, dtype=torch.int64) for _, r in rows],
        "rm_scores": [torch.zeros(r) for _, r in rows],
        "rollout_log_probs": [torch.zeros(r) for _, r in rows],
        "dummy_tensor": [torch.zeros(1, dtype=torch.uint8) for _ in rows],
    }
    fields = list_of_dict_to_tensordict([sequence_fields(i) for i in range(len(rows))])
    for name in ENTRIES:
        fields[name] = torch.nested.as_nested_tensor(per_row[name], layout=torch.jagged)
    return fields


def with_entries(td: Any, names: tuple[str, ...]) -> Any:
    """``td`` (a copy) with the per-response float entries ``names`` that a later pass's batch
    holds (``REF_ENTRIES``, ``UPDATE_ENTRIES``), shaped as its responses."""
    import torch

    out = td.clone(recurse=False)
    responses = td["response_mask"].unbind()
    for name in names:
        out[name] = torch.nested.as_nested_tensor(
            [torch.zeros(len(r)) for r in responses], layout=torch.jagged
        )
    return out


def sequence_fields(i: int) -> dict[str, Any]:
    """Sequence ``i``'s per-sequence objects (``FIELDS``), as verl's dataset row and agent
    loop give them."""
    values: dict[str, Any] = {
        "data_source": "autotuner",
        "ability": "synthetic",
        "reward_model": {"style": "rule", "ground_truth": ""},
        "extra_info": {"index": i},
        "raw_prompt": [{"role": "user", "content": "x"}],
        "index": i,
        "uid": str(i // 8),
        "tools_kwargs": {},
        "interaction_kwargs": {},
        "session_id": str(i),
        "num_turns": 2,
        "metrics": {"generate_sequences": 0.0, "tool_calls": 0.0},
        "extra_fields": {},
        "multi_modal_inputs": {},
        "prompt": "x",
    }
    return {name: values[name] for name in FIELDS}


def verl_batch(prompts: list[int], responses: list[int], max_prompt: int, max_response: int) -> Any:
    """The rank's batch as verl's legacy trainer (``trainer.use_v1=False``) passes it to the
    old-log-prob pass: padded tensors turned into verl's no-padding layout, two of them
    nested (``benchmarks/verl_batching.py`` times verl's cut on it) (imports verl)."""
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
    timed, count = prepare_timed(td, dynamic, max_tokens, micro_batch_size)
    return timed["wall_s"], count


def prepare_timed(
    td: Any,
    dynamic: bool,
    max_tokens: int,
    micro_batch_size: int,
    parts: list[list[int]] | None = None,
    cut: dict[str, Any] | None = None,
) -> tuple[dict[str, float], int]:
    """verl's ``prepare_micro_batches`` on ``td``: its wall, CPU and garbage-collector seconds
    and collections (``GcClock.window``), and how many micro-batches it cut; ``parts``, where
    given, gets the rows of each micro-batch in the order verl runs them; ``cut``, where
    given, what it returned (``micro_batches``, and ``indices``: the order dynamic batches
    restore, else None)."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine.utils import prepare_micro_batches

    tu.assign_non_tensor(
        td,
        use_dynamic_bsz=dynamic,
        max_token_len_per_gpu=max_tokens,
        micro_batch_size_per_gpu=micro_batch_size,
    )
    timed: dict[str, float] = {}
    with CLOCK.install().window(timed):
        micro_batches, rows = prepare_micro_batches(td)
    if parts is not None:
        size = len(td)
        chunks = rows or [range(i, i + micro_batch_size) for i in range(0, size, micro_batch_size)]
        parts.extend([int(r) for r in chunk if r < size] for chunk in chunks)
    if cut is not None:
        cut.update(micro_batches=micro_batches, indices=rows)
    return timed, len(micro_batches)


def pass_outputs(micro_batches: list[Any], entropy: bool) -> list[dict[str, Any]]:
    """What verl v0.9's ``FSDPEngineWithLMHead.forward_step`` hands back for each micro-batch
    of a forward-only pass (``workers/engine/fsdp/transformer_impl.py``): the log-prob of every
    position (with ``entropy``: its entropy too) nested by the micro-batch's sequences, as
    ``prepare_model_outputs`` nests them (``nested_tensor_from_jagged`` over its
    ``input_ids``' offsets), the placeholder loss read to a float, no metrics."""
    import torch

    outputs = []
    for mb in micro_batches:
        offsets = mb["input_ids"].offsets()
        values = {"log_probs": torch.nested.nested_tensor_from_jagged(torch.zeros(int(offsets[-1])), offsets)}
        if entropy:
            values["entropy"] = torch.nested.nested_tensor_from_jagged(torch.zeros(int(offsets[-1])), offsets)
        outputs.append({"model_output": values, "loss": 1.0, "metrics": {}})
    return outputs


def outputs_timed(td: Any, cut: dict[str, Any], entropy: bool) -> dict[str, float]:
    """verl's work on a forward-only pass's outputs once its micro-batches ran, timed as
    ``prepare_timed`` times the cut: ``postprocess_batch_func`` (``workers/engine/utils.py``:
    every micro-batch's nested outputs unbound and rebuilt into one nested tensor per output,
    put back in the batch's order under dynamic batches) and the worker's wrapping of them
    with the pass's metrics into a TensorDict (``engine_workers.py``, ``_postprocess_output``).
    The outputs (``pass_outputs``) are built first, untimed: in verl the forward makes them."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine.utils import postprocess_batch_func

    outputs = pass_outputs(cut["micro_batches"], entropy)
    timed: dict[str, float] = {}
    with CLOCK.install().window(timed):
        output = postprocess_batch_func(output_lst=outputs, indices=cut["indices"], data=td)
        tu.get_tensordict(tensor_dict=output["model_output"], non_tensor_dict={"metrics": output["metrics"]})
    return timed


def mini_batch_timed(update: Any, rows: list[int], last: bool) -> tuple[Any, dict[str, float]]:
    """One mini-batch of the update taken from the rank's batch as verl v0.9's
    ``TrainingWorker.train_mini_batch`` (``workers/engine_workers.py``) takes it, timed:
    ``make_iterator``'s ``index_select_tensor_dict`` (every nested field unbound and rebuilt,
    every non-tensor field indexed), its sequences' token counts read back, the step's
    settings assigned. (With several data-parallel ranks verl also gathers the token counts
    from every rank; a rank's cut has no other ranks.)"""
    import torch
    from tensordict import NonTensorData
    from verl.utils import tensordict_utils as tu

    timed: dict[str, float] = {}
    with CLOCK.install().window(timed):
        mini = tu.index_select_tensor_dict(update, torch.tensor(rows))
        tokens = mini["input_ids"].offsets().diff().tolist()
        tu.assign_non_tensor(
            mini,
            global_token_num=NonTensorData(tokens),
            update_lr_scheduler=last,
            disable_auto_offload=True,
        )
    return mini, timed


def prepared_batch(plan: CutPlan) -> Any:
    """``plan``'s batch (``worker_batch``), cut once untimed (verl's lazy imports and set-up
    paid here)."""
    td = worker_batch(plan.prompt_lengths, plan.response_lengths)
    prepare_seconds(td, plan.use_dynamic_bsz, plan.log_prob_max_token_len, plan.log_prob_micro_batch_size)
    return td


def cut_seconds(
    plan: CutPlan,
    td: Any = None,
    budget_s: float = REPEAT_BUDGET_S,
    partitions: dict[str, list[list[list[int]]]] | None = None,
) -> dict[str, float]:
    """Per phase, the seconds verl's worker spends on ``plan``'s batch around its
    micro-batches: the cut (the update: over its mini-batches), the update's mini-batch
    selection, a log-prob pass's outputs gathered (``PARTS``, each also on its own as
    ``<phase>_<part>``); ``td``: the batch ``prepared_batch`` made, else made here.

    A collection of the whole heap lands in some cuts and not in others, so each phase is cut
    up to ``REPEATS`` times, while its cuts so far took under ``budget_s``, and its seconds are
    their mean. Beside the phases (``PHASES``) the result holds, per phase, the cuts' mean
    collector seconds, collections of the whole heap and count (``<phase>_gc_s``,
    ``<phase>_full_gcs``, ``<phase>_cuts``), and the process's heap (``gcclock.heap``).

    ``partitions``, where given, gets verl's micro-batches of each phase: per phase a list of
    groups (one for a log-prob pass, one per mini-batch for the update), each a list of
    micro-batches, each the rank's sequence indices in it, in the order verl runs them."""
    td = prepared_batch(plan) if td is None else td
    dynamic, budget = plan.use_dynamic_bsz, plan.log_prob_max_token_len
    size = len(plan.prompt_lengths)
    ref = with_entries(td, REF_ENTRIES)
    update = with_entries(ref, UPDATE_ENTRIES)
    minis = [
        list(range(start, min(start + plan.mini_batch_size, size)))
        for start in range(0, size, plan.mini_batch_size)
    ]

    seen: dict[str, list[list[list[int]]]] = {}

    def add(total: dict[str, float], timed: dict[str, float], part: str) -> None:
        for key, value in timed.items():
            total[key] = total.get(key, 0.0) + value
        total[f"{part}_s"] = total.get(f"{part}_s", 0.0) + timed["wall_s"]

    def update_cut() -> dict[str, float]:
        total: dict[str, float] = {"select_s": 0.0}
        groups = []
        for j, rows in enumerate(minis):
            mini, picked = mini_batch_timed(update, rows, last=j == len(minis) - 1)
            add(total, picked, "select")
            parts: list[list[int]] = []
            timed, _ = prepare_timed(mini, dynamic, plan.ppo_max_token_len, plan.ppo_micro_batch_size, parts)
            add(total, timed, "prepare")
            groups.append([[rows[i] for i in part] for part in parts])
        seen.setdefault("update_actor", groups)
        return total

    def log_prob_cut(phase: str, batch: Any, micro_batch_size: int, entropy: bool) -> dict[str, float]:
        parts: list[list[int]] = []
        cut: dict[str, Any] = {}
        total: dict[str, float] = {}
        timed, _ = prepare_timed(batch, dynamic, budget, micro_batch_size, parts, cut)
        add(total, timed, "prepare")
        add(total, outputs_timed(batch, cut, entropy), "outputs")
        seen.setdefault(phase, [parts])
        return total

    cuts: dict[str, Any] = {
        "old_log_prob": lambda: log_prob_cut("old_log_prob", td, plan.log_prob_micro_batch_size, True),
        "update_actor": update_cut,
    }
    if plan.use_ref:
        cuts["ref_log_prob"] = lambda: log_prob_cut(
            "ref_log_prob", ref, plan.ref_log_prob_micro_batch_size, False
        )
    result: dict[str, float] = {}
    for phase in (phase for phase in PHASES if phase in cuts):
        runs = [cuts[phase]()]
        while len(runs) < REPEATS and sum(r["wall_s"] for r in runs) < budget_s:
            runs.append(cuts[phase]())
        mean = {key: sum(r[key] for r in runs) / len(runs) for key in runs[0]}
        result[phase] = mean["wall_s"]
        result.update({f"{phase}_gc_s": mean["gc_s"], f"{phase}_full_gcs": mean["full_gcs"]})
        result.update({f"{phase}_{part}": mean[part] for part in PARTS if part in mean})
        result[f"{phase}_cuts"] = float(len(runs))
    result.update(heap())
    if partitions is not None:
        partitions.update(seen)
    return result


def measure(plan: CutPlan, env: dict[str, str], timeout_s: float = 900.0) -> dict[str, float] | None:
    """``cut_seconds(plan)`` in verl's environment (``env``: its ``python`` and, where set, its
    ``PYTHONPATH``), or None when that fails (logged: the trial then goes on without it).

    With ``env["cache_dir"]``, a cut already timed on this host for the same plan by the same
    Python is read back instead of timed again (trials of one job share their batch, and
    many of them the knobs the cut depends on)."""
    cut = PreparedCut(plan, env)
    try:
        return cut.result(timeout_s)
    finally:
        cut.cancel()


class PreparedCut:
    """verl's cut of one plan, made ready ahead of its timing.

    Started, it reads the plan's cut from the host's cache, or starts verl's environment on
    it (``python -m trials.verl cut --wait``): that process imports verl, builds the batch and
    cuts it once untimed, says ``ready`` and waits. A trial starts it before its own
    start-up, so those seconds pass while its actor and engine start, and waits until it is
    ready (``ready``) before any phase it measures. ``result`` then has the cuts timed,
    the trial's own work stopped meanwhile, so the host is as quiet as verl's worker is when
    it cuts; ``cancel`` ends the process (a trial that failed first). Beside the seconds,
    ``partitions`` holds verl's micro-batches of each phase once known (``cut_seconds``)."""

    def __init__(self, plan: CutPlan, env: dict[str, str]) -> None:
        self.plan, self.env = plan, env
        self.cache = _cache_file(plan, env)
        self.partitions: dict[str, list[list[list[int]]]] = {}
        self.value: dict[str, float] | None = self._load(self.cache)
        self.proc: subprocess.Popen[str] | None = None
        self.folder: tempfile.TemporaryDirectory[str] | None = None
        self.is_ready = self.value is not None
        self.failed = False
        if self.value is None:
            self._start()

    def _start(self) -> None:
        root = str(Path(__file__).resolve().parents[2])
        child = dict(os.environ)
        child["PYTHONPATH"] = os.pathsep.join(p for p in (root, self.env.get("PYTHONPATH")) if p)
        self.folder = tempfile.TemporaryDirectory(prefix="verl-cut-")
        folder = Path(self.folder.name)
        (folder / "plan.json").write_text(json.dumps(asdict(self.plan)))
        command = [self.env["python"], "-m", "trials.verl", "cut", "--wait"]
        command += ["--spec", str(folder / "plan.json"), "--out", str(folder / "cut.json")]
        try:
            with open(folder / "stderr.log", "w") as err:
                self.proc = subprocess.Popen(
                    command, env=child, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True
                )
            not_the_trials(self.proc.pid)  # its memory is verl's environment's, not the trial's
        except OSError as exc:
            log.warning("verl's cut was not timed: %s", exc)
            self.failed = True

    def ready(self, timeout_s: float = 900.0) -> float:
        """Seconds spent waiting for the process to be ready (0 where it was, or is gone)."""
        if self.is_ready or self.failed or self.proc is None or self.proc.stdout is None:
            return 0.0
        start = time.monotonic()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        line = self.proc.stdout.readline() if ready else ""
        if line.strip() == "ready":
            self.is_ready = True
        else:
            self._fail(f"not ready after {time.monotonic() - start:.0f} s" if not ready else "it exited")
        return time.monotonic() - start

    def result(self, timeout_s: float = 900.0) -> dict[str, float] | None:
        """The cut's seconds per phase, timed now (or read from the cache), or None."""
        if self.value is not None or self.failed:
            return self.value
        self.ready(timeout_s)
        if self.failed or self.proc is None or self.proc.stdin is None or self.folder is None:
            return None
        try:
            self.proc.stdin.write("go\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=timeout_s)
        except (OSError, subprocess.TimeoutExpired) as exc:
            self._fail(str(exc))
            return None
        out = Path(self.folder.name) / "cut.json"
        if self.proc.returncode != 0 or not out.exists():
            self._fail(f"exit {self.proc.returncode}")
            return None
        self.value = self._load(out)
        if self.cache is not None and self.value is not None:
            self.cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.cache.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(out.read_text())
            os.replace(tmp, self.cache)
        self.cancel()
        return self.value

    def _load(self, path: Path | None) -> dict[str, float] | None:
        """The seconds a cut's file holds (its partitions into ``partitions``), or None."""
        if path is None or not path.exists():
            return None
        try:
            done = json.loads(path.read_text())
            seconds = {k: float(v) for k, v in done["seconds"].items()}
            self.partitions = {
                k: [[[int(i) for i in mb] for mb in g] for g in v] for k, v in done["partitions"].items()
            }
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return seconds

    def _fail(self, why: str) -> None:
        err = ""
        if self.folder is not None:
            with contextlib.suppress(OSError):
                err = (Path(self.folder.name) / "stderr.log").read_text(errors="replace")[-2000:]
        log.warning("verl's cut was not timed (%s): %s", why, err)
        self.failed = True
        self.cancel()

    def cancel(self) -> None:
        """End the process, if any, and remove its files."""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            not_the_trials(self.proc.pid, leaves=True)
        for stream in (self.proc.stdin, self.proc.stdout) if self.proc is not None else ():
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        if self.folder is not None:
            self.folder.cleanup()
            self.folder = None


def _cache_file(plan: CutPlan, env: dict[str, str]) -> Path | None:
    if not env.get("cache_dir"):
        return None
    identity = json.dumps(
        [asdict(plan), env["python"], env.get("PYTHONPATH"), socket.gethostname(), BATCH_LAYOUT],
        sort_keys=True,
    )
    return Path(env["cache_dir"]) / f"{hashlib.sha256(identity.encode()).hexdigest()[:32]}.json"
