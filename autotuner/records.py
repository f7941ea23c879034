"""A trial as the rest of autotuner sees it, read back from the Optuna study.

Optuna keeps params, values and states; everything else a trial measured lives in its
user attributes under the keys written by ``attrs_for``. ``TrialRecord`` is the one
view of that used by the study loop, the CLI, the API and the exporter.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from trials.types import TrialResult


class TrialStatus(str, Enum):
    """What became of a trial: the worker's outcomes, and the study's own.

    Its values are what the study stores (the ``status`` user attribute) and what the API
    returns, so a member's value never changes. A str, so that comparing with a stored
    value and writing it as JSON need no conversion."""

    # Measured by the worker (``trials.types.WorkerStatus``).
    OK = "ok"
    OOM = "oom"
    ERROR = "error"
    TIMEOUT = "timeout"
    # Never run.
    INVALID = "invalid"  # breaks a verl/engine rule
    DUPLICATE = "duplicate"  # same config as an earlier trial; its outcome is reused
    PREDICTED_OOM = "predicted_oom"  # the memory model predicts it does not fit by a margin
    INFERRED_OOM = "inferred_oom"  # at least as large in every memory knob as a measured OOM
    # Not an outcome of the config.
    INFRA_ERROR = "infra_error"  # failed for a reason outside it (GPU not clean, Ray lost)
    INTERRUPTED = "interrupted"  # was running when the tuner process died; failed on resume
    RUNNING = "running"  # in flight now
    QUEUED = "queued"  # enqueued (a baseline, a retry, a composition) and not started yet
    CANCELLED = "cancelled"  # stopped by the job's cancellation (or its end) while it ran or waited

    def __str__(self) -> str:
        return self.value


# A re-measurement of a finalist has the status of its outcome and ``repeat_of`` set; the
# re-run of an interrupted trial, ``retry_of`` (``RETRY_OF``, set by autotuner.recovery).
# Tuples, not sets: membership compares values, so a plain stored string matches too.
INFEASIBLE_STATUSES = (TrialStatus.OOM, TrialStatus.TIMEOUT)
MEASURED_STATUSES = (TrialStatus.OK, TrialStatus.OOM, TrialStatus.ERROR, TrialStatus.TIMEOUT)
SKIPPED_STATUSES = (TrialStatus.PREDICTED_OOM, TrialStatus.INFERRED_OOM)
# User attribute of a trial that re-runs an interrupted one: the interrupted trial's number.
RETRY_OF = "retry_of"
# User attribute of an interrupted trial that died while its knobs were being drawn: it
# chose no config, so nothing of it is retried (``study.recover_interrupted``).
PROPOSAL_CUT_OFF = "proposal_cut_off"
# User attribute of a study: the per-device memory cap (GiB) its trials ran under, as the
# job's runner computed it (the job's cluster.device_memory_gib, else its device's memory).
MEMORY_CAP = "memory_cap_gib"
# The status of a trial Optuna has not been told about yet, whatever its attributes say: the
# tuner writes a result attribute by attribute and tells the study last, so until then a
# ``status`` attribute is an outcome half written (its values and the rest still missing).
UNTOLD_STATUSES = {TrialState.RUNNING: TrialStatus.RUNNING, TrialState.WAITING: TrialStatus.QUEUED}


@dataclass
class TrialRecord:
    number: int
    status: TrialStatus
    config: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    phase_timings_s: dict[str, float] = field(default_factory=dict)
    phase: str | None = None
    error_type: str | None = None
    error_message: str | None = None
    device: str = ""
    # Where it ran: the host, and the Ray node on a cluster ("" where not recorded).
    hostname: str = ""
    node: str = ""
    # What measured it: package versions, attention kernel, CUDA, driver, GPU name
    # (``trials.device.software``; empty where not recorded).
    software: dict[str, str] = field(default_factory=dict)
    # The engines' own timing lines from the trial's log (``trials.launcher.timing_lines``).
    timing_lines: list[str] = field(default_factory=list)
    values: list[float] | None = None
    baseline: str | None = None
    duplicate_of: int | None = None
    wall_s: float = 0.0
    repeat_of: int | None = None
    retry_of: int | None = None
    # Why the study ran it, when not the sampler's proposal: [rollout-side trial, train-side
    # trial] of a phase composition, or the trial whose train side a new engine setting was
    # paired with (``autotuner.compose``).
    composed_from: list[int] | None = None
    explores_with: int | None = None
    # A train side the sampler chose, run behind the rollout of this trial (its rollout
    # reused: ``proposals.TrainExploration``).
    trains_behind: int | None = None
    inferred_from: int | None = None
    # GPUs the trial reserved (CUDA; 0: not recorded, e.g. a CPU trial or an older study).
    gpus: int = 0
    # The memory model's prediction made before the trial ran (GiB per phase, and "peak"),
    # and measured minus predicted for the phases the trial measured.
    predicted_memory_gib: dict[str, float] = field(default_factory=dict)
    memory_error_gib: dict[str, float] = field(default_factory=dict)

    @property
    def feasible(self) -> bool:
        """Measured successfully. Duplicates are not: the trial they repeat stands for them.
        Nor are re-measurements: they count in their finalist's median."""
        return self.status == TrialStatus.OK and self.repeat_of is None

    @property
    def measured(self) -> bool:
        """Ran on hardware to an outcome and counts against the trial budget (a finalist's
        re-measurement ran, but is not a new trial: see ``ran``)."""
        return self.status in MEASURED_STATUSES and self.repeat_of is None

    @property
    def ran(self) -> bool:
        """Ran on hardware to an outcome (its cost was paid): measured trials and re-runs."""
        return self.status in MEASURED_STATUSES

    @property
    def skipped(self) -> bool:
        """Not run because it was known not to fit (``predicted_oom``, ``inferred_oom``)."""
        return self.status in SKIPPED_STATUSES

    def metric(self, name: str) -> float | None:
        value = self.metrics.get(name)
        return None if value is None else float(value)


def config_key(config: dict[str, Any]) -> str:
    """A config's identity: two trials with equal keys ran the same config."""
    return json.dumps(config, sort_keys=True, default=str)


def attrs_for(result: TrialResult, config: dict[str, Any]) -> dict[str, Any]:
    return {
        "status": TrialStatus(result.status),
        "config": config,
        "metrics": result.metrics,
        "phase_timings_s": result.phase_timings_s,
        "phase": result.phase,
        "error_type": result.error_type,
        "error_message": (result.error_message or "")[-4000:] or None,
        "device": result.device,
        "hostname": result.hostname,
        "node": result.node,
        "software": result.software,
        "wall_s": result.wall_s,
        "log_tail": result.log_tail[-4000:],
        "timing_lines": result.timing_lines,
    }


def record_of(trial: FrozenTrial) -> TrialRecord:
    a = trial.user_attrs
    status = UNTOLD_STATUSES.get(trial.state)
    if status is None:  # told without a status: its process died before it wrote one
        status = TrialStatus(a.get("status") or TrialStatus.INTERRUPTED)
    return TrialRecord(
        number=trial.number,
        status=status,
        config=a.get("config") or {},
        metrics=a.get("metrics") or {},
        phase_timings_s=a.get("phase_timings_s") or {},
        phase=a.get("phase"),
        error_type=a.get("error_type"),
        error_message=a.get("error_message"),
        device=a.get("device") or "",
        hostname=a.get("hostname") or "",
        node=a.get("node") or "",
        software=a.get("software") or {},
        timing_lines=a.get("timing_lines") or [],
        values=list(trial.values) if trial.values is not None else None,
        baseline=a.get("baseline"),
        duplicate_of=a.get("duplicate_of"),
        wall_s=float(a.get("wall_s") or 0.0),
        repeat_of=a.get("repeat_of"),
        retry_of=a.get(RETRY_OF),
        composed_from=a.get("composed_from"),
        explores_with=a.get("explores_with"),
        trains_behind=a.get("trains_behind"),
        inferred_from=a.get("inferred_from"),
        gpus=int(a.get("gpus") or 0),
        predicted_memory_gib=a.get("predicted_memory_gib") or {},
        memory_error_gib=a.get("memory_error_gib") or {},
    )


def records(study: optuna.Study) -> list[TrialRecord]:
    return [record_of(t) for t in study.get_trials(deepcopy=False)]
