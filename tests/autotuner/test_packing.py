"""GPU-count-aware packing: trials ask Ray for their rollout's TP in GPUs, so trials of
different TP sizes share a node without ever sharing a GPU or holding more than it has.

Ray here has 4 logical GPUs on this CPU machine; the trials are real (train-only, tiny
model, on the CPU) and report the GPUs Ray gave them (``CUDA_VISIBLE_DEVICES``) and when
they ran.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from autotuner.executor import RayExecutor, Resources
from autotuner.spec import load_job_spec
from autotuner.trialspec import build_trial_spec

DEMO = Path(__file__).resolve().parents[2] / "autotuner/examples/demo.yaml"
GPUS = 4
TP_SIZES = [2, 1, 1, 4]  # the first three fit together; the fourth needs them gone


@pytest.fixture(scope="module")
def ray_with_4_gpus():
    import ray

    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=8, num_gpus=GPUS, include_dashboard=False,
             log_to_driver=False, configure_logging=False)
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


def test_trials_of_mixed_tp_sizes_never_share_or_oversubscribe_the_gpus(ray_with_4_gpus):
    executor = RayExecutor()
    for i, tp in enumerate(TP_SIZES):
        executor.submit(train_only_spec(f"pack-{i}-tp{tp}"), Resources(num_cpus=1, num_gpus=tp),
                        timeout_s=300)
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
