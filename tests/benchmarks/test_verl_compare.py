"""Comparisons put together after the fact: a verl run rebuilt from the folder it left when
its host went away, and comparisons run side by side on one host's GPUs merged into one."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from benchmarks.gpu.verl_compare import main, merge, table

ROOT = Path(__file__).resolve().parents[2]
LANES = ROOT / "benchmarks" / "results" / "verl-qwen2.5-1.5b-h100x2-cut.json"


def _run_folder(tmp_path: Path, steps: list[dict[str, float]], trace: list[dict]) -> Path:
    """A verl run folder as the runner leaves it: verl's file logger's metrics.jsonl and the
    workers' trace files."""
    run = tmp_path / "run"
    (run / "trace").mkdir(parents=True)
    lines = [json.dumps({"step": n, "data": data}) for n, data in enumerate(steps, start=1)]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (run / "trace" / "trace-7.jsonl").write_text("".join(json.dumps(r) + "\n" for r in trace))
    return run


def _lane(doc: dict, gpus: str) -> dict:
    return {k: doc[k] for k in ("job", "workload", "host")} | {
        "command": doc["commands"][0],
        "started": doc["lanes"][0]["started"],
        "configs": doc["configs"],
        "gpus": gpus,
        "runs": [],
    }


def test_a_run_cut_short_comes_back_with_the_steps_it_logged(tmp_path: Path, capsys) -> None:
    lanes = json.loads(LANES.read_text())["run"]
    (verl,) = [r for r in lanes["runs"] if r["kind"] == "verl"]
    run = _run_folder(tmp_path, verl["steps"], verl["trace"])
    like = tmp_path / "lane-1.json"
    like.write_text(json.dumps(_lane(lanes, "1")))
    out = tmp_path / "lane-0.json"
    argv = ["recover", str(run), "--config", "example", "--like", str(like), "--gpus", "0"]
    argv += ["--command", "verl_compare --config example", "--version", "verl=0.9.1", "--out", str(out)]
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    (row,) = doc["runs"]
    assert row["status"] == "partial" and row["kind"] == "verl" and row["gpus"] == "0"
    assert row["versions"] == {"verl": "0.9.1"}
    assert len(row["steps"]) == len(verl["steps"])
    measured = [s["perf/throughput"] for s in verl["steps"][1:]]
    assert row["measured"]["perf/throughput"] == pytest.approx(statistics.median(measured))
    assert len(row["trace"]) == len(verl["trace"])
    assert doc["configs"] == {"example": lanes["configs"]["example"]}
    assert "example" in capsys.readouterr().out

    only_warmup = _run_folder(tmp_path / "short", verl["steps"][:1], [])
    with pytest.raises(ValueError, match="none after the warm-up"):
        main([*argv[:1], str(only_warmup), *argv[2:]])
    with pytest.raises(SystemExit, match="not among"):
        main(["recover", str(run), "--config", "defaults", *argv[4:]])


def test_lanes_of_one_host_merge_into_one_table_and_others_do_not() -> None:
    lanes = json.loads(LANES.read_text())["run"]
    a = _lane(lanes, "0") | {"runs": [r for r in lanes["runs"] if r["kind"] == "verl"]}
    b = _lane(lanes, "1") | {"runs": [r for r in lanes["runs"] if r["kind"] == "trial"]}
    speed = {
        "start": {"median_us_per_op": {"torch_cuda": 8.1}},
        "end": {"error": "host_speed.py exited with 1"},
    }
    merged = merge([a | {"host_speed": speed}, b])
    assert len(merged["runs"]) == len(lanes["runs"])
    assert [lane["host_speed"] for lane in merged["lanes"]] == [speed, None]  # each lane's own
    assert {r["gpus"] for r in merged["runs"]} == {"0", "1"}
    # The example's trial (GPU 1) sits beside verl's run of it (GPU 0) in one row set.
    example = [
        line for line in merged["table"].splitlines() if line.startswith("example") and "throughput" in line
    ]
    (line,) = example
    assert line.split()[-1] == "2" and "%" in line

    with pytest.raises(ValueError, match="different hosts"):
        merge([a, b | {"host": "elsewhere"}])
    other = json.loads(json.dumps(b))
    other["configs"]["example"] = dict(other["configs"]["example"], extra=1)
    with pytest.raises(ValueError, match="differs"):
        merge([a, other])
    with pytest.raises(ValueError, match="workloads"):
        merge([a, b | {"workload": {"train_batch_size": 1}}])


def test_trials_of_two_strategies_each_get_their_own_prediction_against_verl() -> None:
    doc = json.loads((ROOT / "benchmarks" / "results" / "verl-qwen2.5-1.5b-h200-strategy.json").read_text())
    run = doc["run"]
    lines = table(run).splitlines()
    assert "trial fsdp " in lines[0] and "trial fsdp2" in lines[0]
    (line,) = [x for x in lines if x.startswith("defaults") and "throughput" in x]
    cells = line.split()
    trials = {r["strategy"]: r["throughput"] for r in run["runs"] if r["kind"] == "trial"}
    (verl,) = [r for r in run["runs"] if r["kind"] == "verl"]
    measured = statistics.median(s["perf/throughput"] for s in verl["steps"][1:])
    assert [float(cells[2]), float(cells[4])] == pytest.approx([trials["fsdp"], trials["fsdp2"]], rel=1e-3)
    assert float(cells[6]) == pytest.approx(measured, rel=1e-3)
    assert cells[3] == f"{trials['fsdp'] / measured - 1:+.1%}"
    # One strategy: one trial column, as before.
    single = run | {"runs": [r for r in run["runs"] if r.get("strategy") != "fsdp2"]}
    assert "trial fsdp" not in table(single).splitlines()[0]


def test_each_named_config_reaches_the_trial_and_verl_with_the_jobs_own_engine_knobs(tmp_path: Path) -> None:
    """verl's defaults, its example and a recorded trial's config are completed as the study
    completes a proposal: a knob another engine takes (SGLang's chunked_prefill_size in a
    vLLM job) is not in them, and the trial's engine runs the token budget verl passes."""
    from autotuner.jobs import build_space
    from autotuner.knobs import KNOBS
    from autotuner.settings import Settings
    from autotuner.spec import load_job_spec
    from autotuner.trialspec import build_trial_spec
    from autotuner.verl_run import verl_run_spec
    from benchmarks.gpu.verl_compare import named_configs, scaled

    budget = "actor_rollout_ref.rollout.max_num_batched_tokens"
    spec = scaled(load_job_spec(ROOT / "benchmarks" / "jobs" / "qwen2-7b-grpo-4gpu-world.yaml"), 32, 8)
    arch = spec.validate_model()
    space = build_space(spec, "cuda", Settings())
    recorded = space.completed({}) | {budget: 4096, "actor_rollout_ref.rollout.tensor_model_parallel_size": 1}
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"jobs": [{"trials": [{"number": 3, "config": recorded}]}]}))
    configs = named_configs(spec, ["defaults", "example", f"winner={results}#3"], Settings())
    assert configs["winner"][budget] == 4096
    assert configs["winner"]["actor_rollout_ref.rollout.tensor_model_parallel_size"] == 1
    for name, config in configs.items():
        assert all("vllm" in KNOBS[p].engines for p in config if p in KNOBS), name
        trial = build_trial_spec(spec, arch, config, name, "cuda", None)
        assert trial.rollout.max_num_batched_tokens == config[budget], name
        overrides = verl_run_spec(spec, arch, config, name, "cuda", 4).overrides
        assert f"{budget}={config[budget]}" in overrides, name


def test_the_four_gpu_world_and_its_replica_scope_twin_run_one_workload() -> None:
    """jobs/qwen2-7b-grpo-4gpu.yaml differs from the world job only in its trials' scope: for
    each config the comparison runs, the replica-scope trial is one TP group of the same
    world (its replica's requests, its ranks' sequences) and the world trial is all of it,
    while verl runs the same command for both."""
    from autotuner.settings import Settings
    from autotuner.spec import load_job_spec
    from autotuner.trialspec import build_trial_spec
    from autotuner.verl_run import verl_run_spec
    from benchmarks.gpu.verl_compare import named_configs, scaled

    jobs = ROOT / "benchmarks" / "jobs"
    world = scaled(load_job_spec(jobs / "qwen2-7b-grpo-4gpu-world.yaml"), 32, 8)
    replica = scaled(load_job_spec(jobs / "qwen2-7b-grpo-4gpu.yaml"), 32, 8)
    assert world.workload == replica.workload
    assert (world.cluster.trial_scope, replica.cluster.trial_scope) == ("world", "replica")
    arch = world.validate_model()
    winner = "replica=" + str(ROOT / "benchmarks" / "results" / "qwen2-7b-grpo-8gpu-job-h200.json") + "#18"
    configs = named_configs(world, ["defaults", "example", winner], Settings())
    assert configs == named_configs(replica, ["defaults", "example", winner], Settings())
    for name, config in configs.items():
        whole = build_trial_spec(world, arch, config, name, "cuda", None)
        one = build_trial_spec(replica, arch, config, name, "cuda", None)
        tp = config["actor_rollout_ref.rollout.tensor_model_parallel_size"]
        assert (whole.trial_gpus, one.trial_gpus) == (4, tp), name
        assert whole.batch.rollout_requests == 32 * 8, name
        assert one.batch.rollout_requests * (4 // tp) == whole.batch.rollout_requests, name
        assert one.batch.train_sequences * (4 // tp) == whole.batch.train_sequences, name
        assert one.n_gpus == whole.n_gpus == 4, name
        ours = verl_run_spec(replica, arch, config, name, "cuda", 4).overrides
        assert ours == verl_run_spec(world, arch, config, name, "cuda", 4).overrides, name


def test_a_failed_trial_keeps_where_and_how_it_failed_and_its_logs_end() -> None:
    from benchmarks.gpu.verl_compare import trial_row
    from trials.types import TrialResult

    log = "".join(f"line {i}\n" for i in range(2000))
    failed = TrialResult("t", "error", phase="weight_sync", error_type="EngineError", log_tail=log)
    row = trial_row(failed)
    assert (row["phase"], row["error_type"]) == ("weight_sync", "EngineError")
    assert log.endswith(row["log_tail"]) and 0 < len(row["log_tail"]) <= 6000
    ok = trial_row(TrialResult("t", "ok", phase="train", log_tail=log))
    assert (ok["phase"], ok["error_type"], ok["log_tail"]) == (None, None, "")


def test_a_baseline_runs_with_one_knob_moved_and_a_setting_verl_would_refuse_is_named() -> None:
    """Rollout TP 1, 2 and 4 on the 4-GPU world, everything else verl's defaults; a TP that
    does not divide the world, a knob the tuner does not know or a value of the wrong type
    is refused before anything runs, naming the setting."""
    from autotuner.settings import Settings
    from autotuner.spec import load_job_spec
    from benchmarks.gpu.verl_compare import TP_KEY, named_configs, scaled

    spec = scaled(load_job_spec(ROOT / "benchmarks" / "jobs" / "qwen2-7b-grpo-4gpu-world.yaml"), 32, 8)
    names = ["defaults", "tp1=defaults", "tp4=defaults"]
    configs = named_configs(spec, names, Settings(), [f"tp1:{TP_KEY}=1", f"tp4:{TP_KEY}=4"])
    assert [configs[n][TP_KEY] for n in ("defaults", "tp1", "tp4")] == [2, 1, 4]
    for name in ("tp1", "tp4"):
        moved = {k for k in configs[name] if configs[name][k] != configs["defaults"].get(k)}
        assert moved == {TP_KEY}, name
    # Dynamic batching on: the fixed micro-batch knobs leave, the token budgets come in.
    dyn = named_configs(
        spec, ["dyn=defaults"], Settings(), ["dyn:actor_rollout_ref.actor.use_dynamic_bsz=true"]
    )
    assert "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu" not in dyn["dyn"]
    assert "actor_rollout_ref.actor.ppo_max_token_len_per_gpu" in dyn["dyn"]
    for sets, words in (
        ([f"tp3:{TP_KEY}=3"], ["tp3", "no config"]),
        ([f"tp3x:{TP_KEY}"], ["NAME:KEY=VALUE"]),
        (["tp1:actor_rollout_ref.rollout.no_such_knob=1"], ["no_such_knob", "not a knob"]),
        ([f"tp1:{TP_KEY}=two"], ["'two'", "not of type int"]),
        ([f"tp1:{TP_KEY}=3"], ["verl would refuse", TP_KEY]),
    ):
        with pytest.raises(ValueError) as refused:
            named_configs(spec, ["tp1=defaults"], Settings(), sets)
        assert all(w in str(refused.value) for w in words), (sets, str(refused.value))
    with pytest.raises(ValueError, match="give defaults, example"):
        named_configs(spec, ["tp1=default"], Settings())


def test_each_sub_phase_sets_the_trials_micro_batch_beside_verls_traced_ones() -> None:
    doc = json.loads((ROOT / "benchmarks" / "results" / "verl-qwen2.5-1.5b-h200-clock.json").read_text())
    run = doc["run"]
    (verl,) = [r for r in run["runs"] if r["kind"] == "verl"]
    trials = [r for r in run["runs"] if r["kind"] == "trial"]
    rows = {line.split()[1]: line.split() for line in table(run).splitlines() if " s/mb " in line}
    assert set(rows) == {"old_log_prob", "ref_log_prob", "update_actor"}
    # verl's side: its update passes of the three steps after the warm-up (one pass per
    # mini-batch), every micro-batch of them.
    updates = [
        r for r in verl["trace"] if r.get("call") == "forward_backward_batch" and not r["forward_only"]
    ]
    measured = [s for r in updates[len(updates) // 4 :] for s in r["micro_batch_s"]]
    mine = statistics.median(t["metrics"]["update_actor_micro_batch_s_mean"] for t in trials)
    cells = rows["update_actor"]
    assert float(cells[3]) == pytest.approx(mine, rel=1e-3)
    assert float(cells[4]) == pytest.approx(statistics.mean(measured), rel=1e-3)
    assert cells[5] == f"{mine / statistics.mean(measured) - 1:+.1%}"
    # Trials that did not time their micro-batches, beside a run that was not traced: no such rows.
    bare = run | {
        "runs": [
            {**r, "metrics": {k: v for k, v in r["metrics"].items() if "_micro_batch_s_" not in k}}
            if r["kind"] == "trial"
            else {**r, "trace": []}
            for r in run["runs"]
        ]
    }
    assert " s/mb " not in table(bare)


def test_profiles_come_through_verls_trace_so_profile_asks_for_trace(capsys) -> None:
    with pytest.raises(SystemExit):
        main(
            [
                "--job",
                "benchmarks/jobs/qwen2.5-1.5b-grpo.yaml",
                "--config",
                "defaults",
                "--profile",
                "p",
                "--out",
                "o",
            ]
        )
    assert "give --trace too" in capsys.readouterr().err


def test_a_job_file_that_cannot_be_read_is_a_usage_error(tmp_path: Path, capsys) -> None:
    missing = tmp_path / "missing.yaml"
    with pytest.raises(SystemExit) as refused:
        main(["--job", str(missing), "--config", "defaults", "--out", str(tmp_path / "o")])
    assert refused.value.code == 2
    assert f"(file): cannot read {missing}" in capsys.readouterr().err


def test_the_hosts_speed_is_measured_in_a_process_of_its_own_and_a_failure_is_named(monkeypatch) -> None:
    """The comparison holds no GPU: host_speed.py runs as a child, and what it measured (here
    the CPU's paths: no CUDA) comes back with its time; a child that fails is an ``error``,
    never the comparison's end."""
    import os

    from benchmarks.gpu.verl_compare import host_speed_now

    found = host_speed_now(ops=1000)
    assert set(found["median_us_per_op"]) == {"python_loop", "torch_cpu"}
    assert found["ops"] == 1000 and found["host"]["cpu_cores"] == str(len(os.sched_getaffinity(0)))
    assert found["measured_at"].endswith("Z")
    assert found["torch"] and found["device"].startswith("cpu: ")  # the child's torch and device

    # A child that cannot run the probe: the error says how it exited and why.
    monkeypatch.setattr("sys.executable", "/bin/false")
    failed = host_speed_now(ops=1000)
    assert set(failed) == {"error"} and "exited with 1" in failed["error"]
