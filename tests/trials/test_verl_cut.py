"""verl's own cut of a rank's batch into micro-batches, timed in verl's environment, and a
trial counting it in the phases verl spends it in."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import yaml
from trial_helpers import make_spec
from verl_helpers import GPU_JOBS, verl_python

from trials import run_trial
from trials.lengths import step_lengths
from trials.memory import process_tree_rss_bytes
from trials.train import run_train
from trials.types import BatchDraw
from trials.verl.cut import PARTS, PHASES, REPEAT_BUDGET_S, CutPlan, PreparedCut, measure

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]

JOB = next(path for path in GPU_JOBS if path.name == "qwen2.5-1.5b-grpo.yaml")


def _plan(budget: int, use_ref: bool = True) -> CutPlan:
    """The job's first 256 sequences (its 32 x 8 step) cut at ``budget`` tokens."""
    w = yaml.safe_load(Path(JOB).read_text())["workload"]
    draw = BatchDraw(w["prompt_length"], w["response_length"], w["max_prompt_length"],
                     w["max_response_length"], 32, 8, 0, 256, 256)  # fmt: skip
    prompts, responses = step_lengths(draw)
    return CutPlan(
        prompt_lengths=prompts,
        response_lengths=responses,
        max_prompt_length=w["max_prompt_length"],
        max_response_length=w["max_response_length"],
        use_dynamic_bsz=True,
        log_prob_max_token_len=budget,
        ppo_max_token_len=budget,
        log_prob_micro_batch_size=2,
        ref_log_prob_micro_batch_size=2,
        ppo_micro_batch_size=2,
        mini_batch_size=64,
        use_ref=use_ref,
    )


@pytest.fixture(scope="module")
def timed_cut(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PreparedCut]:
    """verl's cut of ``_plan(3584)`` timed once for the module's tests that read it, in verl's
    environment, into a host cache of its own (``timed_cut.env["cache_dir"]``): one verl
    process, not one per test. The tests on readying, cancelling and a trial's own cut start
    their own."""
    env = {"python": verl_python(), "cache_dir": str(tmp_path_factory.mktemp("timed-cut") / "cuts")}
    cut = PreparedCut(_plan(3584), env)
    try:
        cut.result()
        yield cut
    finally:
        cut.cancel()


def test_more_micro_batches_cost_verl_more_to_cut(timed_cut: PreparedCut) -> None:
    env = {"python": verl_python()}
    many = timed_cut.value  # 67 micro-batches per log-prob pass
    few = measure(_plan(65536, use_ref=False), env)  # 4
    assert many is not None and few is not None
    assert set(PHASES) <= set(many) and {"old_log_prob", "update_actor"} <= set(few)
    assert "ref_log_prob" not in few and "ref_log_prob_cuts" not in few
    assert all(many[p] > 0 for p in PHASES) and few["old_log_prob"] > 0 and few["update_actor"] > 0
    assert many["old_log_prob"] > 4 * few["old_log_prob"]


def test_a_cut_records_the_collectors_share_and_the_heap(timed_cut: PreparedCut) -> None:
    """Each phase is cut up to three times (a full collection lands in some cuts only) and
    its seconds are their mean; beside them the collector's seconds and collections and the
    process's heap."""
    cut = timed_cut.value
    assert cut is not None
    for phase in PHASES:
        assert 1 <= cut[f"{phase}_cuts"] <= 3
        assert 0 <= cut[f"{phase}_gc_s"] < cut[phase]
        assert cut[f"{phase}_full_gcs"] >= 0
    # A phase's seconds are its cut and the rest of verl's work around its micro-batches:
    # the update's mini-batch selection, a log-prob pass's outputs gathered.
    shares = {"old_log_prob": ("prepare_s", "outputs_s"), "ref_log_prob": ("prepare_s", "outputs_s"),
              "update_actor": ("prepare_s", "select_s")}  # fmt: skip
    for phase, parts in shares.items():
        assert all(cut[f"{phase}_{part}"] > 0 for part in parts), phase
        assert sum(cut[f"{phase}_{part}"] for part in parts) == pytest.approx(cut[phase])
        assert not any(f"{phase}_{part}" in cut for part in PARTS if part not in parts)
    # A phase is cut again unless its first cut alone took the budget (a log-prob cut of 67
    # micro-batches takes about a second on an idle 2-core machine, several on a loaded one).
    for phase in PHASES:
        assert cut[f"{phase}_cuts"] >= 2 or cut[phase] >= REPEAT_BUDGET_S, phase
    assert cut["heap_objects"] > 100_000 and cut["gc_enabled"] == 1


_LAYOUTS = """
import json, sys
from trials.verl.cut import REF_ENTRIES, UPDATE_ENTRIES, verl_batch, with_entries, worker_batch
from trials.verl.trace import _keys

p = json.loads(sys.argv[1])
worker = worker_batch(p["prompt_lengths"], p["response_lengths"])
legacy = verl_batch(p["prompt_lengths"], p["response_lengths"], p["max_prompt_length"],
                    p["max_response_length"])
later = with_entries(with_entries(worker, REF_ENTRIES), UPDATE_ENTRIES)
lengths = [int(n) for n in worker["input_ids"].offsets().diff()]
print("layouts", json.dumps({"keys": _keys(worker), "legacy": _keys(legacy), "later": _keys(later)["nested"],
                             "lengths": lengths}))
"""


def test_the_cut_slices_the_batch_verls_worker_holds(verl_scripts: dict[str, dict]) -> None:
    """verl's worker holds every per-sequence tensor nested (its cut unbinds and rebuilds each
    of them for every micro-batch), more of them for each later pass, as its trace shows;
    the legacy trainer's batch, two."""
    plan = _plan(3584)
    out = verl_scripts["layouts"]
    assert out["keys"]["dense"] == [] and len(out["keys"]["nested"]) == 9
    assert len(out["later"]) == 15 and {"advantages", "old_log_probs"} <= set(out["later"])
    assert sorted(out["legacy"]["nested"]) == ["input_ids", "position_ids"]
    assert out["lengths"] == [p + r for p, r in zip(plan.prompt_lengths, plan.response_lengths, strict=True)]


def test_verls_cut_hands_the_trial_its_micro_batches(timed_cut: PreparedCut) -> None:
    """verl's cut says which sequences each of its micro-batches holds, in verl's order: every
    sequence once per pass, within the token budget (verl adds micro-batches until each fits),
    the update's within each mini-batch; read back from the host's cache alike."""
    env = timed_cut.env
    plan = _plan(3584)
    lengths = [p + r for p, r in zip(plan.prompt_lengths, plan.response_lengths, strict=True)]
    cut = timed_cut
    assert cut.result() is not None
    assert set(cut.partitions) == set(PHASES)
    for phase in ("old_log_prob", "ref_log_prob"):
        [micro_batches] = cut.partitions[phase]
        assert sorted(i for mb in micro_batches for i in mb) == list(range(len(lengths)))
        assert max(sum(lengths[i] for i in mb) for mb in micro_batches) <= 3584
        assert len(micro_batches) >= -(-sum(lengths) // 3584)
    minis = cut.partitions["update_actor"]
    assert len(minis) == len(lengths) // plan.mini_batch_size
    for j, micro_batches in enumerate(minis):
        rows = sorted(i for mb in micro_batches for i in mb)
        assert rows == list(range(j * plan.mini_batch_size, (j + 1) * plan.mini_batch_size))
        assert max(sum(lengths[i] for i in mb) for mb in micro_batches) <= 3584
    again = PreparedCut(plan, env)  # from the cache: the same micro-batches
    assert again.proc is None and again.partitions == cut.partitions


def test_a_trial_runs_verls_micro_batches(tiny_config) -> None:
    """With verl's environment, a one-rank trial runs the micro-batches verl's cut made."""
    from trials.train import cut_plan, train_plans

    spec = make_spec(tiny_config, phases=["train"], verl_cut_env={"python": verl_python()})
    lengths = [p + r for p, r in zip(spec.train_prompt_lengths, spec.train_response_lengths, strict=True)]
    budget = max(lengths)  # the longest sequence fits, no more: many micro-batches
    spec.train.use_dynamic_bsz = True
    spec.train.log_prob_max_token_len_per_gpu = spec.train.ppo_max_token_len_per_gpu = budget

    cut = PreparedCut(cut_plan(spec), spec.verl_cut_env)
    try:
        assert cut.result() is not None
    finally:
        cut.cancel()
    metrics: dict[str, float] = {}
    run_train(spec, "float32", metrics, {})
    assert metrics["train_plans_from_verl"] == 1
    for phase, groups in cut.partitions.items():
        assert metrics[f"{phase}_micro_batches"] == sum(len(g) for g in groups)
    assert metrics["old_log_prob_micro_batches"] > 1
    # verl keeps each micro-batch within the budget; the trial's own greedy plan does too.
    for plan in train_plans(spec).values():
        assert max(sum(lengths[i] for i in mb.indices) for mb in plan) <= budget


def test_without_verl_the_cut_is_not_timed() -> None:
    assert measure(_plan(3584), {"python": "/nonexistent/python"}) is None


def test_a_trial_counts_verls_cut_in_its_phases(tiny_config) -> None:
    spec = make_spec(tiny_config, phases=["train"], verl_cut_env={"python": verl_python()})
    spec.train.use_dynamic_bsz = True
    spec.train.log_prob_max_token_len_per_gpu = spec.train.ppo_max_token_len_per_gpu = 256
    metrics, timings = {}, {}
    run_train(spec, "float32", metrics, timings)
    for phase in PHASES:
        cut = metrics[f"{phase}_verl_cut_s"]
        assert 0 < cut < timings[phase]
        assert metrics[f"verl_cut_{phase}_cuts"] >= 1
        assert metrics[f"{phase}_tokens_per_s"] == pytest.approx(metrics["train_tokens"] / timings[phase])
    # Without verl's environment the trial measures the same phases, with no cut in them.
    plain_metrics: dict[str, float] = {}
    run_train(make_spec(tiny_config, phases=["train"]), "float32", plain_metrics, {})
    assert not any(k.endswith("_verl_cut_s") for k in plain_metrics)


def test_a_cut_timed_on_this_host_is_read_back(timed_cut: PreparedCut, tmp_path: Path) -> None:
    """Trials of one job share their batch: the second trial with the same plan reads the
    first one's timing back instead of timing it again; another plan is timed afresh."""
    first = timed_cut.value  # timed into a cache of its own: one file, copied here
    assert first is not None and len(list(Path(timed_cut.env["cache_dir"]).glob("*.json"))) == 1
    shutil.copytree(timed_cut.env["cache_dir"], tmp_path / "cuts")
    env = {"python": verl_python(), "cache_dir": str(tmp_path / "cuts")}
    assert measure(_plan(3584), env) == first  # timed again, the floats would differ
    other = measure(_plan(7168), env)
    assert other is not None and other != first
    assert len(list((tmp_path / "cuts").glob("*.json"))) == 2


def test_a_readied_cut_is_timed_only_when_the_trial_asks(tmp_path: Path) -> None:
    """Readied while a trial starts: verl imported, the batch built and cut once untimed, then
    the process waits; the timing (and its entry in the host's cache) comes on request."""
    env = {"python": verl_python(), "cache_dir": str(tmp_path / "cuts")}
    before = process_tree_rss_bytes()
    cut = PreparedCut(_plan(3584), env)
    try:
        assert cut.proc is not None and cut.proc.poll() is None
        waited = cut.ready()
        assert waited > 0 and cut.is_ready and not cut.failed
        assert cut.proc.poll() is None  # ready, waiting for the word
        # verl's environment holds its own memory, which is not the trial's.
        held = psutil.Process(cut.proc.pid).memory_info().rss
        assert held > 100 * 2**20
        assert process_tree_rss_bytes() - before < held / 2
        assert not list((tmp_path / "cuts").glob("*.json"))  # nothing timed yet
        seconds = cut.result()
        assert seconds is not None and set(PHASES) <= set(seconds)
        assert cut.proc.poll() is not None
        assert len(list((tmp_path / "cuts").glob("*.json"))) == 1
        assert PreparedCut(_plan(3584), env).result() == seconds  # the next trial reads it back
    finally:
        cut.cancel()


def test_a_cut_given_up_before_its_timing_leaves_nothing(tmp_path: Path) -> None:
    env = {"python": verl_python(), "cache_dir": str(tmp_path / "cuts")}
    cut = PreparedCut(_plan(3584), env)
    assert cut.proc is not None
    folder = Path(cut.folder.name) if cut.folder is not None else None
    cut.cancel()  # the trial failed while starting
    assert cut.proc.poll() is not None
    assert folder is not None and not folder.exists()
    assert not (tmp_path / "cuts").exists()


def test_a_trial_readies_verls_cut_while_it_starts(tiny_config) -> None:
    spec = make_spec(tiny_config, phases=["train"], verl_cut_env={"python": verl_python()})
    spec.train.use_dynamic_bsz = True
    spec.train.log_prob_max_token_len_per_gpu = spec.train.ppo_max_token_len_per_gpu = 256
    result = run_trial(spec)
    assert result.status == "ok", result.error_message
    assert result.metrics["verl_cut_ready_wait_s"] >= 0
    for phase in PHASES:
        assert 0 < result.metrics[f"{phase}_verl_cut_s"] < result.phase_timings_s[phase]


_AROUND = """
import json, sys
from verl.workers.engine.utils import postprocess_batch_func
from trials.verl.cut import (REF_ENTRIES, UPDATE_ENTRIES, mini_batch_timed, pass_outputs, prepare_timed,
                             with_entries, worker_batch)

p = json.loads(sys.argv[1])
td = worker_batch(p["prompt_lengths"], p["response_lengths"])
cut = {}
prepare_timed(td, True, p["log_prob_max_token_len"], 2, cut=cut)
outputs = pass_outputs(cut["micro_batches"], True)
output = postprocess_batch_func(output_lst=outputs, indices=cut["indices"], data=td)
gathered = {k: [int(n) for n in v.offsets().diff()] for k, v in output["model_output"].items()}
update = with_entries(with_entries(td, REF_ENTRIES), UPDATE_ENTRIES)
size = len(p["prompt_lengths"])
mini, _ = mini_batch_timed(update, list(range(64, 128)), last=False)
select = {}
for per in (64, 16):  # the fastest of three passes: a loaded machine's stalls only add
    select[per] = min(sum(mini_batch_timed(update, list(range(i, i + per)), i + per == size)[1]["wall_s"]
                          for i in range(0, size, per)) for _ in range(3))
print("around", json.dumps({"gathered": gathered, "reordered": cut["indices"] is not None,
                            "mini": [int(n) for n in mini["input_ids"].offsets().diff()],
                            "mini_keys": sorted(mini.keys()), "tokens": mini["global_token_num"],
                            "select": select}))
"""


@pytest.fixture(scope="module")
def verl_scripts() -> dict[str, dict]:
    """``_AROUND`` and then ``_LAYOUTS`` on ``_plan(3584)``, in one process of verl's
    environment (verl imported once for both): each script's output by its name."""
    done = subprocess.run(
        [verl_python(), "-c", _AROUND + _LAYOUTS, json.dumps(dataclasses.asdict(_plan(3584)))],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=dict(os.environ) | {"PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    outputs = {}
    for line in done.stdout.splitlines():
        name, _, rest = line.partition(" ")
        if name in ("layouts", "around") and rest.startswith("{"):
            outputs[name] = json.loads(rest)
    assert set(outputs) == {"layouts", "around"}, done.stdout[-3000:]
    return outputs


def test_verls_work_around_its_micro_batches_runs_on_the_trials_batch(verl_scripts: dict[str, dict]) -> None:
    """What the cut's process times beside the cut is verl's own code on the batch's shape: a
    log-prob pass's outputs, nested by sequence as verl's forward makes them, gathered back
    into the batch's order under dynamic batches; each update mini-batch taken out whole,
    its token counts read; a selection's cost grows with the mini-batches taken."""
    plan = _plan(3584)
    out = verl_scripts["around"]
    lengths = [p + r for p, r in zip(plan.prompt_lengths, plan.response_lengths, strict=True)]
    assert out["reordered"]  # dynamic batches: verl's micro-batches are not in the batch's order
    assert out["gathered"] == {"log_probs": lengths, "entropy": lengths}
    assert out["mini"] == lengths[64:128] == out["tokens"]
    assert {"advantages", "old_log_probs", "ref_log_prob", "uid"} <= set(out["mini_keys"])
    # Every selection unbinds and rebuilds every field of the whole batch: four times the
    # mini-batches, about four times the seconds.
    assert out["select"]["16"] > 1.5 * out["select"]["64"]
