"""A job run on an existing Ray cluster (AUTOTUNER_RAY_ADDRESS) of two nodes, its trials and
job in PostgreSQL: the trials in flight together ran on different nodes, and each trial's
record names the Ray node that ran it.

The cluster is Ray's own multi-node test cluster (``ray.cluster_utils.Cluster``): a head and
a worker node on this machine, each a raylet of its own with one CPU, so two trials of one
CPU each can only run side by side on different nodes."""

from __future__ import annotations

import optuna
import pytest

from autotuner.records import records
from storage import Database, JobStore

from .conftest import run_cli, write_job

pytestmark = pytest.mark.postgres

JOB = {
    "name": "on-a-cluster",
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
    # verl's defaults and one proposal, launched together: one per node.
    "budget": {
        "max_trials": 2,
        "max_concurrent_trials": 2,
        "trial_timeout_s": 180,
        "remeasure_finalists": 0,
        "baseline_runs": 1,
    },
    "sampler": "random",
}


@pytest.fixture
def two_nodes():
    from ray.cluster_utils import Cluster

    store = 100 * 2**20
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "num_gpus": 0,
            "include_dashboard": False,
            "object_store_memory": store,
        },
    )
    try:
        cluster.add_node(num_cpus=1, num_gpus=0, object_store_memory=store)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        cluster.shutdown()


@pytest.mark.slow
def test_a_job_on_a_two_node_cluster_spreads_its_trials_and_records_them_in_postgres(
    tmp_path, cli_env, two_nodes, postgres_url
):
    nodes = {two_nodes.head_node.node_id} | {n.node_id for n in two_nodes.worker_nodes}
    assert len(nodes) == 2
    env = cli_env | {"AUTOTUNER_RAY_ADDRESS": two_nodes.address, "AUTOTUNER_DATABASE_URL": postgres_url}
    env.pop("AUTOTUNER_RAY_NUM_CPUS")
    job = write_job(tmp_path / "job.json", JOB)

    out = run_cli(["tune", str(job), "--out", str(tmp_path / "out")], env, timeout=400)

    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    database = Database(postgres_url)
    try:
        (stored,), _ = JobStore(database).list(limit=10)
    finally:
        database.dispose()
    assert stored.status == "succeeded", (stored.status, stored.error)
    trials = records(optuna.load_study(study_name=stored.study_name, storage=postgres_url))
    assert [t.status for t in trials] == ["ok", "ok"], [(t.status, t.error_message) for t in trials]
    # Each node ran one of the two trials, and says so in the record.
    assert {t.node for t in trials} == nodes
    assert all(t.hostname for t in trials)
