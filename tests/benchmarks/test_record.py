"""Landscape recorders filling one file at once (benchmarks/search/record.py): real trials on
this CPU, each recorder a process with a local Ray of its own, as one per GPU on a host."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotuner.jobs import build_space
from autotuner.replay import Landscape, LandscapeError, LandscapePoint
from autotuner.settings import Settings
from autotuner.spec import parse_job_spec
from autotuner.study import config_key
from benchmarks.search.compose import SIDE_ONLY
from benchmarks.search.record import Ledger, fits_until, next_config, parse_until
from benchmarks.search.record import main as record_main
from trials.device import host_cpus, host_kind
from trials.types import TrialResult

REPO = Path(__file__).resolve().parents[2]
JOB = {
    "name": "record-test",
    "workload": {
        "model": "tiny",
        "dtype": "float32",
        "phases": "train",
        "prompt_length": {"kind": "fixed", "value": 16},
        "max_prompt_length": 16,
        "response_length": {"kind": "fixed", "value": 16},
        "max_response_length": 16,
        "train_batch_size": 8,
        "n": 1,
        "ppo_mini_batch_size": 4,
        "use_kl_loss": False,
    },
    "cluster": {"device": "cpu", "n_gpus_per_node": 1, "device_memory_gib": 2},
    "search": {
        "actor_rollout_ref.actor.use_dynamic_bsz": False,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": [1, 2],
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 2,
        "actor_rollout_ref.model.enable_gradient_checkpointing": [True, False],
    },
    "budget": {"max_trials": 4, "trial_timeout_s": 120},
}


def _recorder(job: Path, out: Path, tmp: Path, k: int, *args: str) -> subprocess.Popen:
    env = dict(os.environ, AUTOTUNER_DATA_DIR=str(tmp / f"data{k}"), AUTOTUNER_RAY_NUM_CPUS="1")
    env.pop("AUTOTUNER_RAY_ADDRESS", None)
    return subprocess.Popen(
        [sys.executable, "-m", "benchmarks.search.record", str(job), str(out), *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _ran(proc: subprocess.Popen) -> int:
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output
    return int(re.search(r"this recorder ran (\d+)", output).group(1))


@pytest.mark.slow
def test_recorders_share_a_landscape_each_config_once_and_take_over_dead_claims(tmp_path) -> None:
    job = tmp_path / "job.json"
    job.write_text(json.dumps(JOB))
    out = tmp_path / "landscape.json"
    grid = build_space(parse_job_spec(JOB), "cpu", Settings()).grid()
    keys = [config_key(c) for c in grid]
    assert len(keys) == 4
    gone = subprocess.Popen(["true"])
    gone.wait()
    # A recorder that died mid-trial (its claim is taken over) and one still running
    # (this test: its config is left to it).
    claims = {
        "dead-0": {"config": keys[0], "pid": gone.pid, "host": os.uname().nodename},
        "live-0": {"config": keys[1], "pid": os.getpid(), "host": os.uname().nodename},
    }
    Path(f"{out}.claims").write_text(json.dumps(claims))

    first, second = _recorder(job, out, tmp_path, 1), _recorder(job, out, tmp_path, 2)
    assert _ran(first) + _ran(second) == 3
    landscape = Landscape.load(out)
    recorded = {config_key(p.config): p.runs for p in landscape.points}
    assert set(recorded) == {keys[0], keys[2], keys[3]}
    assert all(len(runs) == 1 and runs[0].status == "ok" for runs in recorded.values())
    assert len({runs[0].trial_id for runs in recorded.values()}) == 3
    assert json.loads(Path(f"{out}.claims").read_text()) == {"live-0": claims["live-0"]}
    assert landscape.label.startswith("CPU landscape")
    assert landscape.train_order == "verl"  # the trials took verl's order
    assert not landscape.logits_copied  # and kept the logits at temperature 1.0

    # The live recorder "dies": the next run of the command records what it had claimed.
    Path(f"{out}.claims").write_text(json.dumps({"live-0": {**claims["live-0"], "pid": gone.pid}}))
    assert _ran(_recorder(job, out, tmp_path, 3)) == 1
    landscape = Landscape.load(out)
    assert sorted(config_key(p.config) for p in landscape.points) == sorted(keys)
    assert [len(p.runs) for p in landscape.points] == [1, 1, 1, 1]
    assert json.loads(Path(f"{out}.claims").read_text()) == {}


@pytest.mark.parametrize(
    ("earlier", "why"),
    [
        ({"train_order": "prompts"}, "'prompts' order, and trials now take 'verl': record into a new"),
        # a file without the field was recorded before trials kept the logits at 1.0
        ({"logits_copied": None}, "copied the logits at temperature 1.0.*record into a new file"),
    ],
)
def test_a_landscape_of_earlier_trials_is_not_extended(tmp_path, earlier, why) -> None:
    spec = parse_job_spec(JOB)
    out = tmp_path / "landscape.json"
    data = Landscape(spec, spec.validate_model(), "cpu", 2.0, "old", "record").to_dict()
    for key, value in earlier.items():
        if value is None:
            del data[key]
        else:
            data[key] = value
    out.write_text(json.dumps(data))
    ledger = Ledger(out, spec, spec.validate_model(), "cpu", 2.0, "new", "record")
    with pytest.raises(LandscapeError, match=why), ledger.locked():
        pass
    Landscape(spec, spec.validate_model(), "cpu", 2.0, "new", "record").save(out)
    with ledger.locked() as landscape:
        assert landscape.train_order == "verl" and not landscape.logits_copied


def _recording_order(grid: list[dict], landscape: Landscape, seed: int, runs: int) -> list[str]:
    """The configs ``next_config`` hands out for ``runs`` more runs, each recorded as it runs."""
    order = []
    for _ in range(runs):
        config = next_config(grid, landscape, {}, 2, set(), seed)
        assert config is not None
        point = next((p for p in landscape.points if p.config == config), None)
        if point is None:
            point = LandscapePoint(config, [])
            landscape.points.append(point)
        point.runs.append(TrialResult(trial_id=f"t{len(order)}", status="ok"))
        order.append(config_key(config))
    return order


def test_a_recording_spreads_each_knobs_settings_over_its_hours() -> None:
    spec = parse_job_spec(JOB)
    fresh = lambda: Landscape(spec, spec.validate_model(), "cpu", 2.0, "l", "record")  # noqa: E731
    # In grid order the first hours of a recording would hold one gmu's settings only.
    grid = [{"gmu": g, "mns": m} for g in (0.4, 0.5, 0.6, 0.7, 0.8, 0.9) for m in (256, 512, 1024, 2048)]
    keys = [config_key(c) for c in grid]
    landscape = fresh()
    order = _recording_order(grid, landscape, seed=0, runs=48)
    assert next_config(grid, landscape, {}, 2, set(), 0) is None
    # every config once before any twice, in a shuffled order, then again
    assert sorted(order[:24]) == sorted(order[24:]) == sorted(keys)
    assert order[:24] != keys
    assert len({json.loads(k)["gmu"] for k in order[:6]}) >= 3
    # the same order for a recording resumed, and another for another seed
    resumed = fresh()
    assert _recording_order(grid, resumed, 0, 10) == order[:10]
    assert _recording_order(grid, resumed, 0, 38) == order[10:]
    assert _recording_order(grid, fresh(), 1, 24) != order[:24]
    # a config claimed by a live recorder is left to it; one failing on infrastructure is skipped
    claimed = {"live": {"config": order[0], "pid": os.getpid(), "host": "h"}}
    assert config_key(next_config(grid, fresh(), claimed, 2, set(), 0)) == order[1]
    assert config_key(next_config(grid, fresh(), {}, 2, {order[0], order[1]}, 0)) == order[2]


GMU, MB = (
    "actor_rollout_ref.rollout.gpu_memory_utilization",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
)


def test_a_recording_with_an_end_starts_only_runs_expected_to_end_by_then() -> None:
    spec = parse_job_spec(JOB)
    base = {GMU: 0.6, MB: 4}
    grid = [{GMU: g, MB: m} for g in (0.5, 0.6, 0.7) for m in (2, 4)]
    side, whole = {GMU: 0.5, MB: 4}, {GMU: 0.6, MB: 2}  # an engine side alone; a whole config
    timed = lambda wall, side_only: TrialResult(  # noqa: E731
        trial_id=f"t{wall}", status="ok", wall_s=wall, metrics={SIDE_ONLY: 1.0} if side_only else {}
    )
    landscape = Landscape(spec, spec.validate_model(), "cpu", 2.0, "l", "record")
    # Nothing timed yet: each run may take the trial timeout.
    assert not fits_until(landscape, base, 1000.0 + 119, 120.0, 1000.0)(side)
    assert fits_until(landscape, base, 1000.0 + 120, 120.0, 1000.0)(side)
    assert fits_until(landscape, base, None, 120.0, 1000.0)(whole)  # no end
    # The longest run of each kind times the next of that kind: an engine side's, or a whole
    # trial's (an engine setting's run recorded whole among them).
    landscape.points = [
        LandscapePoint(side, [timed(150.0, True), timed(180.0, True)]),
        LandscapePoint({GMU: 0.7, MB: 4}, [timed(400.0, False)]),
        LandscapePoint(whole, [timed(300.0, False)]),
    ]
    fits = fits_until(landscape, base, 1000.0 + 200, 120.0, 1000.0)
    assert fits({GMU: 0.5, MB: 4}) and fits({GMU: 0.7, MB: 4})  # engine sides: 180 s
    assert not fits(whole) and not fits(base) and not fits({GMU: 0.7, MB: 2})  # whole: 400 s
    assert fits_until(landscape, base, 1000.0 + 400, 120.0, 1000.0)(base)

    # The recorder takes, of the configs with the fewest runs, the first in its order that
    # fits (here an engine side, where whole configs come first), and none when none fits.
    def start() -> Landscape:  # one engine side run, the rest to run
        points = [LandscapePoint(side, [timed(180.0, True)])]
        return Landscape(spec, spec.validate_model(), "cpu", 2.0, "l", "record", points=points)

    order = _recording_order(grid, start(), seed=0, runs=5)  # the configs not yet run
    first_side = next(k for k in order if json.loads(k)[MB] == 4 and json.loads(k) != base)
    assert order[0] != first_side
    assert config_key(next_config(grid, start(), {}, 2, set(), 0, fits)) == first_side
    assert next_config(grid, start(), {}, 2, set(), 0, lambda c: False) is None
    # --until takes epoch seconds or an ISO 8601 time, UTC unless it says otherwise.
    assert parse_until("1796533200") == 1796533200.0
    assert parse_until("2026-12-06T05:00:00Z") == parse_until("2026-12-06T05:00:00") == 1796533200.0
    assert parse_until("2026-12-06T06:00:00+01:00") == 1796533200.0
    with pytest.raises(Exception, match="'tomorrow': want epoch seconds"):
        parse_until("tomorrow")


@pytest.mark.slow
def test_a_recorder_whose_end_has_come_runs_nothing(tmp_path) -> None:
    job = tmp_path / "job.json"
    job.write_text(json.dumps(JOB))
    out = tmp_path / "landscape.json"
    # Nothing is timed yet, so each run may take the job's trial timeout (120 s): none fits.
    done = _recorder(job, out, tmp_path, 1, "--until", f"{time.time() + 60:.0f}")
    said, _ = done.communicate(timeout=600)
    assert done.returncode == 0, said
    assert "(--until): stopping" in said and "this recorder ran 0" in said
    assert not out.exists()  # nothing recorded
    bad = _recorder(job, out, tmp_path, 1, "--until", "soon")
    said, _ = bad.communicate(timeout=120)
    assert bad.returncode == 2 and "--until: 'soon': want epoch seconds" in said


def _on(cpus: str, usable: str | None = None) -> TrialResult:
    """A run recorded on a host of ``cpus`` CPUs (``usable`` of them for the run)."""
    software = {"cpu": "Test CPU", "host_cpus": cpus, "cpu_cores": usable or cpus}
    return TrialResult(trial_id=f"on-{cpus}", status="ok", software=software)


def test_a_landscape_takes_the_runs_of_one_kind_of_host(tmp_path, capsys) -> None:
    spec = parse_job_spec(JOB)
    grid = build_space(spec, "cpu", Settings()).grid()
    out = tmp_path / "landscape.json"
    points = [LandscapePoint(grid[0], [_on("16")]), LandscapePoint(grid[1], [TrialResult("old", "ok")])]
    Landscape(spec, spec.validate_model(), "cpu", 2.0, "old", "record", points=points).save(out)
    sixteen, other = host_kind(_on("16").software), host_kind(_on("32").software)
    assert sixteen == "Test CPU, 16 CPUs"
    assert host_kind(_on("32", usable="16").software) == "Test CPU, 32 CPUs (16 usable)"
    assert host_kind(TrialResult("old", "ok").software) is None  # recorded no host: any

    def ledger(host: str | None) -> Ledger:
        return Ledger(out, spec, spec.validate_model(), "cpu", 2.0, "new", "record", host=host)

    for host in (sixteen, None):  # the same kind of host, or any host (--any-host)
        with ledger(host).locked() as landscape:
            assert len(landscape.points) == 2
    with (
        pytest.raises(
            LandscapeError,
            match=r"another kind of host \(Test CPU, 16 CPUs: 1 runs\) and this host is Test CPU, 32 CPUs: "
            r".*confounds its knobs.*--any-host",
        ),
        ledger(other).locked(),
    ):
        pass
    # The recorder on this machine (no "Test CPU"): a clear error before anything runs;
    # --left says what is left, and that this host could not record it.
    job = tmp_path / "job.json"
    job.write_text(json.dumps(JOB))
    with pytest.raises(SystemExit) as refused:
        record_main([str(job), str(out)])
    assert refused.value.code == 2
    said = capsys.readouterr().err
    assert "Test CPU, 16 CPUs: 1 runs" in said and f"this host is {host_kind(host_cpus())}" in said
    assert record_main([str(job), str(out), "--left"]) == 0
    said = capsys.readouterr().out
    assert "2 runs recorded already" in said and "(not here: " in said and "--any-host" in said
    assert record_main([str(job), str(out), "--left", "--any-host"]) == 0
    assert "not here" not in capsys.readouterr().out


def test_a_job_file_the_recorder_cannot_use_is_a_clear_error(tmp_path, capsys) -> None:
    out = tmp_path / "landscape.json"
    with pytest.raises(SystemExit) as refused:
        record_main([str(tmp_path / "missing.yaml"), str(out), "--left"])
    assert refused.value.code == 2
    assert f"(file): cannot read {tmp_path / 'missing.yaml'}" in capsys.readouterr().err
    job = tmp_path / "job.json"
    job.write_text(json.dumps({**JOB, "budget": {"max_trials": 0}}))
    with pytest.raises(SystemExit) as refused:
        record_main([str(job), str(out), "--left"])
    said = capsys.readouterr().err
    assert refused.value.code == 2 and "budget.max_trials" in said and "Traceback" not in said
    assert not out.exists()
