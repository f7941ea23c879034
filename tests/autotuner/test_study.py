"""The study loop on real trials: OOM is data, never re-run; resumes after a kill -9."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import optuna
import pytest
from optuna.study._constrained_optimization import _get_feasible_trials

from autotuner.executor import RayExecutor
from autotuner.knobs import A, R
from autotuner.records import records
from autotuner.space import SearchSpace
from autotuner.spec import parse_job_spec
from autotuner.study import StudyRunner, open_study, recover_interrupted

from .conftest import REPO, write_job

optuna.logging.set_verbosity(optuna.logging.WARNING)
pytestmark = pytest.mark.engine

# A model big enough that a micro-batch of 32 long sequences needs GiBs (its logits alone:
# 32 x 320 tokens x 32000 vocab x 4 bytes = 1.3 GB, twice over for their gradient), while
# a micro-batch of 1 fits easily under the same cap.
MID_MODEL = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 32000,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
}


def _train_only_job(tmp_path, micro_choices, cap_gib, max_trials, lengths=(64, 256)):
    prompt, response = lengths
    model = tmp_path / "mid" / "config.json"
    model.parent.mkdir(parents=True, exist_ok=True)
    model.write_text(json.dumps(MID_MODEL))
    return parse_job_spec(
        {
            "name": "oom-test",
            "workload": {
                "model": str(model),
                "dtype": "float32",
                "phases": "train",
                "prompt_length": {"kind": "fixed", "value": prompt},
                "response_length": {"kind": "fixed", "value": response},
                "max_prompt_length": prompt,
                "max_response_length": response,
                "train_batch_size": 32,
                "n": 1,
                "ppo_mini_batch_size": 32,
                "use_kl_loss": False,
            },
            "cluster": {"device": "cpu", "device_memory_gib": cap_gib},
            "search": {
                A + "ppo_micro_batch_size_per_gpu": micro_choices,
                R + "log_prob_micro_batch_size_per_gpu": 1,
                A + "use_dynamic_bsz": False,
                "actor_rollout_ref.model.enable_gradient_checkpointing": True,
            },
            "budget": {"max_trials": max_trials, "trial_timeout_s": 240},
            "sampler": "random",
        }
    )


def test_oom_is_an_infeasible_trial_and_never_runs_again(tmp_path, ray_local, monkeypatch) -> None:
    # The loop would end this two-config space as soon as both were measured (it lists small
    # spaces); unlisted, as a large space is, it asks on and tells each repeat a duplicate.
    monkeypatch.setattr("autotuner.study.GRID_LISTED_UP_TO", 0)
    spec = _train_only_job(tmp_path, [1, 32], cap_gib=1.5, max_trials=5)
    arch = spec.validate_model()
    space = SearchSpace.build(spec, arch, "cpu")
    assert list(space.searched) == [A + "ppo_micro_batch_size_per_gpu"]
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    study = open_study(spec, "oom-study", url)
    runner = StudyRunner(spec, study, space, RayExecutor(), "cpu", memory_cap_gib=1.5, cpus_per_trial=2)
    summary = runner.run()

    recs = {r.number: r for r in records(study)}
    measured = [r for r in recs.values() if r.measured]
    by_micro = {r.config[A + "ppo_micro_batch_size_per_gpu"]: r for r in measured}
    assert sorted(by_micro) == [1, 32], [(r.status, r.config) for r in measured]
    ok, oom = by_micro[1], by_micro[32]
    assert ok.status == "ok", (ok.error_type, ok.error_message)
    assert oom.status == "oom", (oom.error_type, oom.error_message)
    assert oom.phase in ("update_actor", "old_log_prob")
    assert oom.error_message
    # Infeasible for the sampler: told COMPLETE with a violated constraint, not dropped.
    frozen = {t.number: t for t in study.get_trials()}
    feasible = {t.number for t in _get_feasible_trials(study.get_trials())}
    assert frozen[oom.number].state == optuna.trial.TrialState.COMPLETE
    assert oom.number not in feasible and ok.number in feasible
    # Only two distinct points exist: the rest of the proposals were duplicates, not runs.
    assert len(measured) == 2
    duplicates = [r for r in recs.values() if r.status == "duplicate"]
    assert duplicates and all(r.duplicate_of in (ok.number, oom.number) for r in duplicates)
    assert "exhausted" in summary.stop_reason


def _study_name(db) -> str | None:
    """The first study's name in the SQLite file ``db``, read-only; None before it exists."""
    if not db.exists():
        return None
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)) as c:
            row = c.execute("SELECT study_name FROM studies ORDER BY study_id LIMIT 1").fetchone()
    except sqlite3.Error:  # no tables yet, or locked for a moment
        return None
    return row[0] if row else None


def _measured(url: str, study_name: str) -> list:
    """The measured trials the tuner has told the study about (a result written but not told
    yet reads as running: a trial killed in between is interrupted, and run again, on resume)."""
    try:
        study = optuna.load_study(study_name=study_name, storage=url)
    except KeyError:
        return []
    return [r for r in records(study) if r.measured]


def test_a_killed_study_resumes_without_repeating_finished_trials(tmp_path, cli_env) -> None:
    job = write_job(
        tmp_path / "job.json",
        {
            "name": "resume-test",
            "workload": {
                "model": "tiny",
                "dtype": "float32",
                "phases": "train",
                "prompt_length": {"kind": "uniform", "low": 16, "high": 48},
                "response_length": {"kind": "uniform", "low": 16, "high": 64},
                "max_prompt_length": 48,
                "max_response_length": 64,
                "train_batch_size": 16,
                "n": 2,
                "ppo_mini_batch_size": 8,
                "use_kl_loss": False,
            },
            "cluster": {"device": "cpu"},
            "search": {A + "use_dynamic_bsz": False},
            "budget": {"max_trials": 4, "trial_timeout_s": 120, "baseline_runs": 1},
            "sampler": "random",
        },
    )
    db = tmp_path / "data" / "autotuner.db"
    url = f"sqlite:///{db}"
    log = tmp_path / "tune.log"
    with open(log, "w") as out:  # a file, not a pipe nobody reads while it runs
        proc = subprocess.Popen(
            [sys.executable, "-m", "autotuner.cli", "tune", str(job), "-o", str(tmp_path / "out")],
            env=cli_env,
            cwd=REPO,
            start_new_session=True,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    study_name = None
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(1)
            if study_name is None:
                # Read-only: Optuna's storage would create its tables here, racing the tuner's.
                study_name = _study_name(db)
                continue
            if len(_measured(url, study_name)) >= 2:
                break
        assert proc.poll() is None, f"the tuner exited early:\n{log.read_text()}"
        assert study_name is not None, f"the tuner never created its study:\n{log.read_text()}"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    before = {r.number: r for r in _measured(url, study_name)}
    assert 2 <= len(before) < 4
    cut_off = {
        t.number
        for t in optuna.load_study(study_name=study_name, storage=url).get_trials(
            states=(optuna.trial.TrialState.RUNNING,)
        )
    }

    job_id = study_name.removeprefix("job-")
    resumed = subprocess.run(
        [sys.executable, "-m", "autotuner.cli", "resume", job_id, "-o", str(tmp_path / "out")],
        env=cli_env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr

    study = optuna.load_study(study_name=study_name, storage=url)
    recs = records(study)
    after = [r for r in recs if r.measured]
    assert len(after) == 4
    # Finished trials were kept as they were, not measured again.
    for number, rec in before.items():
        same = next(r for r in after if r.number == number)
        assert same.metrics == rec.metrics and same.status == rec.status
    configs = [json.dumps(r.config, sort_keys=True) for r in after]
    assert len(set(configs)) == len(configs)
    # Nothing is left running; a trial cut off by the kill is marked as such.
    assert not [t for t in study.get_trials() if t.state == optuna.trial.TrialState.RUNNING]
    assert all(r.status != "running" for r in recs)
    assert {r.number for r in recs if r.status == "interrupted"} == cut_off
    assert recover_interrupted(study) == []


def test_baselines_are_enqueued_first_with_their_names(tmp_path) -> None:
    spec = parse_job_spec(
        {
            "workload": {"model": "qwen2.5-1.5b", "train_batch_size": 64, "n": 8, "ppo_mini_batch_size": 16},
            "cluster": {"device": "cuda", "n_gpus_per_node": 1},
            "baselines": {
                "production": {
                    R + "gpu_memory_utilization": 0.8,
                    R + "max_num_batched_tokens": 32768,
                    R + "max_num_seqs": 1024,
                    R + "enforce_eager": True,
                    A + "ppo_micro_batch_size_per_gpu": 4,
                    R + "log_prob_micro_batch_size_per_gpu": 8,
                    A + "fsdp_config.param_offload": True,
                }
            },
        }
    )
    space = SearchSpace.build(spec, spec.validate_model(), "cuda")
    study = open_study(spec, "baselines", f"sqlite:///{tmp_path / 'db.sqlite'}")
    runner = StudyRunner(spec, study, space, RayExecutor(), "cuda", memory_cap_gib=None)
    runner.enqueue_baseline()
    runner.enqueue_baseline()  # idempotent: a resumed study does not enqueue them again
    first, second, third = study.ask(), study.ask(), study.ask()
    defaults, example = space.suggest(first).config, space.suggest(second).config
    production = space.suggest(third).config
    assert first.user_attrs["baseline"] == "verl-v0.9-defaults"
    assert second.user_attrs["baseline"] == "verl-v0.9-example"
    assert third.user_attrs["baseline"] == "production"
    assert defaults[R + "gpu_memory_utilization"] == 0.5 and defaults[R + "max_num_seqs"] == 256
    assert defaults[R + "tensor_model_parallel_size"] == 1
    # verl's defaults leave the micro-batches unset; their value is the example's.
    assert defaults[A + "ppo_micro_batch_size_per_gpu"] == 2 and defaults[A + "use_dynamic_bsz"] is False
    assert defaults["actor_rollout_ref.model.use_remove_padding"] is True
    # The 1.5B model takes run_qwen3_4b_fsdp.sh's knobs: dynamic batches, gmu 0.6; its TP 2
    # does not fit one GPU and is moved to 1. Its ref offload is not searched (verl's FSDP
    # engine offloads the ref whatever it says), so the job's fixed value stands.
    assert example[A + "use_dynamic_bsz"] is True and example[R + "gpu_memory_utilization"] == 0.6
    assert example["actor_rollout_ref.ref.fsdp_config.param_offload"] is False
    assert example[R + "tensor_model_parallel_size"] == 1
    assert production[R + "gpu_memory_utilization"] == 0.8
    assert production[R + "max_num_batched_tokens"] == 32768
    assert production[A + "fsdp_config.param_offload"] is True
    assert production[R + "log_prob_micro_batch_size_per_gpu"] == 8
    # Knobs the baseline does not name keep verl's defaults.
    assert production[A + "fsdp_config.optimizer_offload"] is False


def test_a_failure_loop_outside_the_configs_trips_the_circuit_breaker(tmp_path, ray_local) -> None:
    # Every trial fails the same way for a reason no config can fix: the engine's Python
    # is missing. The job must stop after a few, count none, and say why.
    spec = _train_only_job(tmp_path, [1, 2, 4, 8], cap_gib=4, max_trials=20)
    space = SearchSpace.build(spec, spec.validate_model(), "cpu")
    study = open_study(spec, "breaker", f"sqlite:///{tmp_path / 'db.sqlite'}")
    runner = StudyRunner(
        spec,
        study,
        space,
        RayExecutor(trial_python=str(tmp_path / "no-python")),
        "cpu",
        memory_cap_gib=4,
        cpus_per_trial=1,
    )
    summary = runner.run()
    assert summary.stop_reason.startswith("circuit breaker: 3 trials in a row")
    assert "TrialLaunchError" in summary.stop_reason and "no-python" in summary.stop_reason
    assert summary.measured == 0
    recs = records(study)
    assert [r.status for r in recs] == ["infra_error"] * 3
    assert not [r for r in recs if r.measured]


@pytest.mark.timeout(1200)
def test_a_real_job_runs_its_baselines_first_mid_job_and_last_and_measures_its_noise(
    tmp_path, ray_local
) -> None:
    """Real trials of a 2-layer model on this CPU: verl's defaults run first, again once half
    of max_trials is measured (here: after the first), and last; the summary's noise is the
    spread of those three runs."""
    from autotuner.summary import runs_of, summarize

    spec = _train_only_job(tmp_path, [1, 2, 4], cap_gib=8, max_trials=2, lengths=(32, 64))
    space = SearchSpace.build(spec, spec.validate_model(), "cpu")
    study = open_study(spec, "noise", f"sqlite:///{tmp_path / 'db.sqlite'}")
    runner = StudyRunner(spec, study, space, RayExecutor(), "cpu", memory_cap_gib=8, cpus_per_trial=2)
    runner.enqueue_baseline()
    result = runner.run()
    recs = records(study)
    measured = [r.number for r in recs if r.measured]
    (defaults,) = [r for r in recs if r.baseline and r.measured]
    assert defaults.baseline == "verl-v0.9-defaults" and defaults.feasible, [
        (r.number, r.status, r.error_message) for r in recs
    ]
    assert measured[0] == defaults.number and len(measured) == 2
    again = [r.number for r in recs if r.repeat_of == defaults.number and r.ran]
    assert len(again) == 2 and again[0] < measured[-1] < again[1], (measured, again)  # middle, end
    summary = summarize(spec, recs, result.stop_reason)
    runs = runs_of(recs)[defaults.number]
    assert runs.n == 3 and all(v > 0 for v in runs.throughputs)
    assert summary.noise_runs == 3 and summary.noise_pct == pytest.approx(runs.spread_pct)
    assert summary.tie_band_pct == max(2.0, summary.noise_pct)
    assert summary.baselines["verl-v0.9-defaults"]["runs"] == 3
