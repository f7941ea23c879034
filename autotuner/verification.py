"""After the search, the baselines and the fastest front trials run in verl itself.

The tuner's trials re-create verl's step; verl (``trials.verl``: ``main_ppo`` for a few real
steps) is the measurement that decides. A job verifies ``budget.verify_in_verl`` trials (its
default resolved where the job runs: ``resolve_verify_in_verl``), each config a
``launch_verl`` run of ``budget.verify_steps`` steps (the first a warm-up) in a Ray task
holding verl's world of GPUs, as trials hold theirs (verl's own Ray stays private to the run:
``trials.verl.launch``). Runs are one at a time, interleaved and repeated (A-B-C-A-B-C,
``budget.verify_rounds`` rounds), so a drift of the machine spreads over every config. Each
run is recorded as it ends (``storage.VerlRunStore``); the job's winner is then the best
verl-measured median (``autotuner.summary``).

A cancelled job stops verifying at once (the run in flight is killed, not recorded); a run
still going at its timeout (``budget.verify_timeout_s``, or what is left of ``max_minutes``)
is killed and recorded ``timeout``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import ray

from autotuner.errors import SpecError
from autotuner.proposals import Proposal, ProposalSource, SearchState
from autotuner.records import TrialRecord, records
from autotuner.settings import Settings
from autotuner.spec import VERIFY_ON_CPU, JobSpec, ModelArch
from autotuner.summary import front, runs_of
from autotuner.verl_results import VerlVerdict, verdicts_of
from autotuner.verl_run import verl_run_spec
from storage import VerlRunStore
from trials.launcher import engine_importable
from trials.verl import VERL
from trials.verl.launch import launch_verl
from trials.verl.types import VerlRunResult, VerlRunSpec

log = logging.getLogger(__name__)

# The study's user attribute holding ``budget.verify_in_verl`` as the job's runner resolved it.
VERIFY_IN_VERL = "verify_in_verl"
DEFAULT_VERIFIED = 2  # front trials verified when the job leaves budget.verify_in_verl unset
OUTER_GRACE_S = 60.0  # a Ray task this long past its run's timeout is cancelled
WAIT_S = 1.0


class Launch(Protocol):
    """Runs one ``VerlRunSpec`` in verl and always comes back: ``trials.verl.launch.launch_verl``'s
    signature (the default; a test passes its own)."""

    def __call__(
        self, spec: VerlRunSpec, timeout_s: float, cache_dir: Path, python: str, env: dict[str, str] | None
    ) -> VerlRunResult: ...


# --------------------------------------------------------------------------- the knob


def verl_environment(settings: Settings) -> str | None:
    """The Python of verl's environment when it finds verl (``Settings.verl_python``), else None."""
    python = settings.verl_python()
    if engine_importable(VERL, python, settings.trial_env_for(VERL)) is not None:
        return None
    return python


def verl_cut_env(python: str | None, settings: Settings) -> dict[str, str]:
    """What a trial needs to time verl's cut of its batch (``TrialSpec.verl_cut_env``): verl's
    Python, where set its ``PYTHONPATH``, and the folder of cuts already timed (beside the
    compile caches); empty without verl's environment."""
    if python is None:
        return {}
    env = {"python": python, "cache_dir": str(settings.resolved_compile_cache_dir / "verl-cut")}
    pythonpath = settings.trial_env_for(VERL).get("PYTHONPATH")
    return env | ({"PYTHONPATH": pythonpath} if pythonpath else {})


def check_verification(spec: JobSpec, device: str) -> None:
    """Refuse an explicit ``budget.verify_in_verl`` the job's hardware cannot run.

    Raises:
        SpecError: verification asked for on a CPU, or for a world of several nodes.
    """
    n = spec.budget.verify_in_verl
    if not n:
        return
    if device != "cuda":
        raise SpecError("budget.verify_in_verl", VERIFY_ON_CPU.format(n=n))
    if spec.cluster.nnodes > 1:
        raise SpecError(
            "budget.verify_in_verl",
            f"{n} trials to verify in verl, but verl runs the job's whole world on one node and "
            f"cluster.nnodes is {spec.cluster.nnodes}; set budget.verify_in_verl to 0",
        )


def resolve_verify_in_verl(
    spec: JobSpec,
    device: Literal["cuda", "cpu"],
    settings: Settings,
    find: Callable[[Settings], str | None] = verl_environment,
) -> int:
    """How many front trials the job verifies in verl: its ``budget.verify_in_verl`` if given
    (refused where it cannot run: ``check_verification``), else ``DEFAULT_VERIFIED`` on CUDA
    when verl's environment is found (``find``) on one node, else 0."""
    check_verification(spec, device)
    if spec.budget.verify_in_verl is not None:
        return spec.budget.verify_in_verl
    if device != "cuda" or spec.cluster.nnodes > 1 or find(settings) is None:
        return 0
    return DEFAULT_VERIFIED


# --------------------------------------------------------------------------- what runs


def chosen_trials(spec: JobSpec, recs: list[TrialRecord], count: int) -> list[TrialRecord]:
    """The measured baselines (one per config), then the ``count`` fastest front trials by
    their median throughput (re-measurements joined), none twice."""
    runs = runs_of(recs)
    chosen: list[TrialRecord] = []
    for r in recs:
        if r.baseline and r.feasible and r.config not in [c.config for c in chosen]:
            chosen.append(r)
    ranked = sorted(front(spec, recs), key=lambda r: (-runs[r.number].median, r.number))
    taken = {r.number for r in chosen}
    chosen += [r for r in ranked if r.number not in taken][:count]
    return chosen


def interleave(
    chosen: list[TrialRecord], rounds: int, done: dict[int, int], again: bool = False
) -> list[tuple[TrialRecord, int]]:
    """The runs to do, round by round over the chosen trials (A-B-C-A-B-C), as ``(trial,
    round)``: trial ``t`` needs rounds ``done[t]`` to ``rounds - 1`` (a resumed job does only
    what is missing); ``again``: ``rounds`` more of each, numbered after its ``done[t]``."""
    if again:
        return [(rec, done.get(rec.number, 0) + k) for k in range(rounds) for rec in chosen]
    return [(rec, k) for k in range(rounds) for rec in chosen if k >= done.get(rec.number, 0)]


class VerlVerification(ProposalSource):
    """The verification's proposal source: after the search, which trials verl measures.

    ``start`` (after the finalists' re-measurement) picks the baselines and the ``count``
    fastest front trials and plans their runs (``interleave``); ``propose`` never proposes a
    study trial (a verl run is not a trial of the study: it is recorded beside one), so it
    returns None; ``next_run`` hands out the planned ``(trial, round)`` runs in order.
    ``trials`` (``autotuner verify --trial``) replaces the pick; ``done`` holds each trial's
    runs already recorded (a resumed job's); ``again``: run every chosen trial ``rounds``
    more times whatever it has (``autotuner verify``).
    """

    def __init__(
        self,
        count: int,
        rounds: int,
        done: dict[int, int] | None = None,
        trials: list[int] | None = None,
        again: bool = False,
    ) -> None:
        self.count, self.rounds, self.done, self.trials = count, rounds, dict(done or {}), trials
        self.again = again
        self.chosen: list[TrialRecord] = []
        self._queue: list[tuple[TrialRecord, int]] = []

    def start(self, state: SearchState) -> list[Proposal]:
        recs = records(state.study)
        if self.trials is not None:
            by_number = {r.number: r for r in recs}
            self.chosen = [by_number[n] for n in self.trials]
        else:
            self.chosen = chosen_trials(state.spec, recs, self.count)
        self._queue = interleave(self.chosen, self.rounds, self.done, self.again)
        return []

    def propose(self, state: SearchState) -> Proposal | None:
        return None

    def next_run(self) -> tuple[TrialRecord, int] | None:
        return self._queue.pop(0) if self._queue else None

    @property
    def pending(self) -> int:
        return len(self._queue)


# --------------------------------------------------------------------------- running


def _launch_on_node(launch: Launch, spec: VerlRunSpec, timeout_s: float, **kwargs: Any) -> VerlRunResult:
    """``launch`` as a Ray task (it holds verl's GPUs while verl runs)."""
    return launch(spec, timeout_s, **kwargs)


@dataclass
class VerlRunner:
    """Runs one verification run at a time in a Ray task that holds ``gpus`` GPUs.

    ``run`` waits for it, polling ``stop_requested`` each ``WAIT_S``: a stop cancels the task
    (the runner, its verl and verl's Ray die with it) and returns None.
    """

    spec: JobSpec
    arch: ModelArch
    python: str
    cache_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    launch: Launch = launch_verl
    stop_requested: Callable[[], bool] = lambda: False

    @property
    def gpus(self) -> int:
        """verl runs the job's whole world (``trainer.n_gpus_per_node``) on one node."""
        return self.spec.cluster.n_gpus_per_node

    def run(self, rec: TrialRecord, run_id: str, timeout_s: float) -> VerlRunResult | None:
        budget = self.spec.budget
        largest = max(
            (n.get("Resources", {}).get("GPU", 0.0) for n in ray.nodes() if n.get("Alive")), default=0.0
        )
        if largest < self.gpus:
            return VerlRunResult(
                run_id, "error", error_type="NotEnoughGpus",
                error_message=f"verl runs the job's world on {self.gpus} GPUs of one node, but the "
                f"Ray cluster's largest node has {largest:g}; run the job where a node has them",
            )  # fmt: skip
        run_spec = verl_run_spec(self.spec, self.arch, rec.config, run_id, steps=budget.verify_steps)
        remote = ray.remote(_launch_on_node).options(
            num_cpus=1, num_gpus=self.gpus, max_retries=0, name=f"verl-{run_id}"
        )
        kwargs = {"cache_dir": self.cache_dir, "python": self.python, "env": dict(self.env)}
        ref = remote.remote(self.launch, run_spec, timeout_s, **kwargs)
        deadline = time.monotonic() + timeout_s + OUTER_GRACE_S
        while True:
            done, _ = ray.wait([ref], timeout=WAIT_S)
            if done:
                return self._collect(ref, run_id)
            if self.stop_requested():
                ray.cancel(ref, force=True)
                return None
            if time.monotonic() > deadline:
                ray.cancel(ref, force=True)
                return VerlRunResult(
                    run_id, "timeout", error_type="RayTaskDeadline",
                    error_message="the Ray task of the verl run outlived its deadline and was cancelled",
                )  # fmt: skip

    @staticmethod
    def _collect(ref: Any, run_id: str) -> VerlRunResult:
        try:
            result: VerlRunResult = ray.get(ref)
            return result
        except ray.exceptions.RayError as exc:
            return VerlRunResult(
                run_id, "error", error_type=type(exc).__name__, error_message=str(exc)[-2000:]
            )


Record = Callable[[TrialRecord, int, VerlRunResult], None]


@dataclass
class JobVerification:
    """A job's verification: ``source`` plans the runs, ``runner`` runs each, ``record``
    stores it; the study loop calls ``run`` once its finalists are re-measured."""

    source: VerlVerification
    runner: VerlRunner
    record: Record
    run_prefix: str

    def run(self, state: SearchState, deadline: float | None = None) -> str | None:
        """Run what ``source`` plans; a note on what was done (for the job's stop reason),
        or None when the job was cancelled meanwhile (the run in flight is not recorded)."""
        self.source.start(state)
        budget = self.runner.spec.budget
        ran = 0
        while (planned := self.source.next_run()) is not None:
            rec, round_ = planned
            left = budget.verify_timeout_s if deadline is None else deadline - time.monotonic()
            if left <= 0:
                return (
                    f"; verification in verl stopped at max_minutes ({budget.max_minutes:g}) after {ran} runs"
                )
            timeout_s = min(budget.verify_timeout_s, left)
            log.info("verl run of trial %s, round %s (timeout %.0f s)", rec.number, round_ + 1, timeout_s)
            result = self.runner.run(rec, f"{self.run_prefix}-t{rec.number}-r{round_}", timeout_s)
            if result is None:
                return None
            self.record(rec, round_, result)
            ran += 1
        numbers = ", ".join(f"#{r.number}" for r in self.source.chosen)
        return f"; {numbers} verified in verl ({ran} runs)" if ran else ""


def job_verification(
    store: VerlRunStore,
    job_id: str,
    spec: JobSpec,
    arch: ModelArch,
    settings: Settings,
    count: int,
    stop_requested: Callable[[], bool],
    trials: list[int] | None = None,
    again: bool = False,
    launch: Launch = launch_verl,
) -> JobVerification:
    """The verification of job ``job_id`` (``count`` front trials, or ``trials``), recording
    each run in ``store`` as it ends."""
    done: dict[int, int] = {}
    for run in store.list(job_id):
        done[run.trial_number] = max(done.get(run.trial_number, 0), run.round + 1)
    source = VerlVerification(count, spec.budget.verify_rounds, done, trials, again)
    runner = VerlRunner(
        spec,
        arch,
        python=settings.verl_python(),
        cache_dir=settings.data_dir / "verl-cache",
        env=settings.trial_env_for(VERL),
        launch=launch,
        stop_requested=stop_requested,
    )

    def record(rec: TrialRecord, round_: int, result: VerlRunResult) -> None:
        result.log_tail = result.log_tail[-4000:]
        store.add(job_id, rec.number, round_, result.status, result.to_json())

    return JobVerification(source, runner, record, run_prefix=job_id[:8])


def stored_verdicts(store: VerlRunStore, job_id: str) -> dict[int, VerlVerdict]:
    """The job's verl runs, read back, as each verified trial's verdict."""
    return verdicts_of(
        [(run.trial_number, VerlRunResult.from_json(run.result_json)) for run in store.list(job_id)]
    )
