"""GPU-count-aware packing: trials ask Ray for their rollout's TP in GPUs, so trials of
different TP sizes share a node without ever sharing a GPU or holding more than it has.

Ray here has 4 logical GPUs on this CPU machine; the trials are real (train-only, tiny
model, on the CPU) and report the GPUs Ray gave them (``CUDA_VISIBLE_DEVICES``) and when
they ran.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest

from autotuner.executor import RayExecutor, Resources
from autotuner.spec import load_job_spec, parse_job_spec
from autotuner.trialspec import build_trial_spec

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "autotuner/examples/demo.yaml"
STANDIN = Path(__file__).resolve().parent / "gpu_standin.py"
GPUS = 4
TP_SIZES = [2, 1, 1, 4]  # the first three fit together; the fourth needs them gone


@pytest.fixture(scope="module")
def ray_with_4_gpus():
    import ray

    if ray.is_initialized():
        ray.shutdown()
    ray.init(
        address="local",
        num_cpus=8,
        num_gpus=GPUS,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    yield ray
    ray.shutdown()


def train_only_spec(trial_id: str):
    spec = load_job_spec(DEMO)
    spec = spec.model_copy(update={"workload": spec.workload.model_copy(update={"phases": "train"})})
    arch = spec.validate_model(None)
    from autotuner.jobs import build_space
    from autotuner.settings import Settings

    space = build_space(spec, "cpu", Settings())
    return build_trial_spec(spec, arch, space.baseline_config(), trial_id, "cpu", 2.0)


@pytest.mark.slow
def test_trials_of_mixed_tp_sizes_never_share_or_oversubscribe_the_gpus(ray_with_4_gpus):
    executor = RayExecutor()
    for i, tp in enumerate(TP_SIZES):
        executor.submit(
            train_only_spec(f"pack-{i}-tp{tp}"), Resources(num_cpus=1, num_gpus=tp), timeout_s=300
        )
    results = []
    while executor.in_flight:
        results += executor.wait(timeout_s=5)
    assert len(results) == len(TP_SIZES)
    runs = []
    for result in results:
        assert result.status == "ok", (result.error_message, result.log_tail[-2000:])
        tp = int(result.trial_id.rsplit("tp", 1)[1])
        gpus = set(result.visible_gpus.split(","))
        assert len(gpus) == tp and gpus <= {str(g) for g in range(GPUS)}, result.visible_gpus
        runs.append((result.started_at, result.started_at + result.wall_s, gpus))
    for (s1, e1, g1), (s2, e2, g2) in itertools.combinations(runs, 2):
        if s1 < e2 and s2 < e1:  # ran at the same time: never on the same GPU
            assert not g1 & g2, (g1, g2)
    for start, _, _ in runs:  # at no moment more GPUs in use than the node has
        assert sum(len(g) for s, e, g in runs if s <= start < e) <= GPUS
    # and they did run side by side (Ray packed them), not one after another
    assert any(s1 < e2 and s2 < e1 for (s1, e1, _), (s2, e2, _) in itertools.combinations(runs, 2))


def test_the_study_admits_trials_by_their_gpus_and_refuses_those_no_node_holds(ray_with_4_gpus, tmp_path):
    """A study on 4 (logical) GPUs whose space has TP 1/2/4/8: it never has more GPUs' worth
    of trials in flight than the cluster has, runs small ones side by side, and records a
    TP-8 proposal as invalid instead of leaving it in Ray's queue."""
    from autotuner.executor import RayExecutor
    from autotuner.records import records
    from autotuner.space import SearchSpace
    from autotuner.study import StudyRunner, open_study

    R = "actor_rollout_ref.rollout."
    doc = load_job_spec(REPO / "benchmarks/jobs/qwen2-7b-grpo-8gpu-tp.yaml").model_dump()
    doc["workload"]["model"] = "llama-3.1-8b"  # 32 heads: TP 8 is a valid config
    doc.update(
        search={R + "tensor_model_parallel_size": {"choices": [1, 2, 4, 8]}},
        baselines={f"tp{tp}": {R + "tensor_model_parallel_size": tp} for tp in (8, 4)},
        sampler="random",
        memory_model={"enabled": False},
    )
    doc["budget"].update(
        max_trials=10, max_concurrent_trials=8, max_minutes=5, remeasure_finalists=0, baseline_runs=1
    )
    spec = parse_job_spec(doc)
    standin = tmp_path / "gpu-trial"
    standin.write_text(  # a trial goes to the stand-in; anything else (probes) to Python
        f"#!{sys.executable}\nimport os, runpy, sys\n"
        "if sys.argv[1:3] != ['-m', 'trials']:\n"
        "    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n"
        f"sys.argv = [{str(STANDIN)!r}, *sys.argv[1:]]\n"
        f"runpy.run_path({str(STANDIN)!r}, run_name='__main__')\n"
    )
    standin.chmod(0o755)
    study = open_study(spec, "admission", f"sqlite:///{tmp_path / 'db.sqlite'}")
    space = SearchSpace.build(spec, spec.validate_model(), "cuda")
    runner = StudyRunner(
        spec, study, space, RayExecutor(trial_python=str(standin)), "cuda", memory_cap_gib=None
    )
    runner.enqueue_baseline()  # verl's defaults (TP 1), then TP 8 and TP 4
    summary = runner.run()
    recs = records(study)
    ran = [r for r in recs if r.status == "ok"]
    assert summary.measured == len(ran) == 10, [(r.status, r.error_message) for r in recs]
    too_big = [r for r in recs if r.config.get(R + "tensor_model_parallel_size") == 8]
    assert too_big and {r.status for r in too_big} == {"invalid"}
    assert "needs 8 GPUs on one node" in too_big[0].error_message
    assert {r.gpus for r in ran} <= {1, 2, 4} and len({r.gpus for r in ran}) > 1
    spans = [(r.metrics["standin_started_at"], r.metrics["standin_ended_at"], r.gpus) for r in ran]
    for start, _, _ in spans:  # GPUs reserved by the trials in flight at each start
        assert sum(g for s, e, g in spans if s <= start < e) <= GPUS
    assert any(s1 < e2 and s2 < e1 for (s1, e1, _), (s2, e2, _) in itertools.combinations(spans, 2))
