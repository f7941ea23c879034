"""The memory model against real measurements.

- benchmarks/results/qwen2.5-1.5b-grpo-packed-h200.json: the trial as it runs since
  2026-11-24 (packed micro-batches, flash-attention, the ref resident, the weight sync) on
  one H200 (vLLM 0.24, FSDP2 actor): the physics on every phase those trials finished.
- benchmarks/search/landscapes/cpu-train-mid.json: the same trial on a CPU under a 2 GiB
  cap, 36 configs twice, many of them out of memory: calibration and skipping.
- benchmarks/results/qwen2.5-1.5b-grpo-job-h200.json: the 1.5B job of 2026-11-27 on hosts of four
  and two H200s (a trial per GPU, expandable segments in training, rollouts taken over by trials that
  share their engine side): what those trials measure, and the out-of-memory start-ups.
- benchmarks/results/qwen2.5-1.5b-grpo-h200.json: 22 H200 trials of the trial before
  2026-11-24 (a knob they predate at what they ran with): the shapes of the prediction
  (what grows with what, what is far beyond the GPU).

All of them ran before trials took their train sequences in verl's order and while they
divided the logits by the temperature into a new tensor, so their models take the
prompts' order and the copied logits (``MemoryModel(train_order="prompts",
logits_copied=True)``), on a GPU.
- benchmarks/results/verl-qwen2.5-1.5b-h200x4-layouts-compiled.json: the trial as it runs
  since 2026-11-27 (verl's order, the logits kept, the entropy compiled) on four H200,
  four layouts of the update: the physics of the current trial."""

from __future__ import annotations

import json
import random
import statistics

import optuna
import pytest

from autotuner.knobs import A, R
from autotuner.memory import MemoryModel, fit, measured_phases
from autotuner.records import TrialRecord
from autotuner.space import SearchSpace
from autotuner.spec import JobSpec, parse_job_spec
from benchmarks.gpu.verl_compare import load_job_spec, scaled

from .conftest import REPO, dumped_job

H200_RESULTS = REPO / "benchmarks" / "results" / "qwen2.5-1.5b-grpo-h200.json"
PACKED_RESULTS = REPO / "benchmarks" / "results" / "qwen2.5-1.5b-grpo-packed-h200.json"
CPU_LANDSCAPE = REPO / "benchmarks" / "search" / "landscapes" / "cpu-train-mid.json"
JOB_RESULTS = REPO / "benchmarks" / "results" / "qwen2.5-1.5b-grpo-job-h200.json"
LAYOUTS_COMPILED = REPO / "benchmarks" / "results" / "verl-qwen2.5-1.5b-h200x4-layouts-compiled.json"
H200_GIB = 140.4  # NVML's total for the H200 those trials ran on


@pytest.fixture(scope="module")
def h200():
    job = json.loads(H200_RESULTS.read_text())["jobs"][0]
    spec = JobSpec.model_validate(job["spec"])
    trials = [TrialRecord(**t) for t in job["trials"] if t.get("config") and t["status"] in ("ok", "oom")]
    assert len([t for t in trials if t.status == "ok"]) >= 4
    assert len([t for t in trials if t.status == "oom"]) >= 10
    return spec, spec.validate_model(), trials


def _errors_pct(model: MemoryModel, trial: TrialRecord, engine: bool = True) -> dict[str, float]:
    predicted = model.predict(trial.config).phases
    return {
        p: 100 * (predicted[p] - m) / m for p, m in measured_phases(trial, engine).items() if p in predicted
    }


def test_physics_alone_is_close_on_every_phase_the_packed_trials_finished() -> None:
    job = json.loads(PACKED_RESULTS.read_text())["jobs"][0]
    spec = JobSpec.model_validate(job["spec"])
    model = MemoryModel(
        spec, spec.validate_model(), "cuda", H200_GIB, train_order="prompts", logits_copied=True
    )
    trials = [TrialRecord(**t) for t in job["trials"] if t.get("config")]
    errors = {t.number: _errors_pct(model, t) for t in trials}
    finished = [t for t in trials if t.status == "ok"]
    assert len(finished) >= 2
    assert all(
        {"startup", "train_probe", "rollout", "train", "wake"} <= errors[t.number].keys() for t in finished
    )
    every = [abs(e) for per in errors.values() for e in per.values()]
    assert statistics.fmean(every) < 6.0 and max(every) < 13.0, errors
    # The actor at engine start: fp32 master weights + AdamW (12 B/param), or less where
    # offloaded; the ref is in pinned CPU memory, as verl's FSDP engine keeps it. These
    # trials kept the bf16 ref on the GPU unless ref_param_offload (measured 2026-11-24,
    # before the trial followed verl there): that is taken off what they measured.
    ref_gib = 2 * model.arch.num_parameters / 2**30
    for t in trials:
        actor = model.physics_of(t.config).components["actor_gib"]
        resident_ref = 0.0 if t.metrics.get("ref_param_offload") else ref_gib
        # (measured: what the allocator reserved, its cached blocks included)
        assert actor == pytest.approx(t.metrics["actor_resident_gib"] - resident_ref, abs=2.0), t.number


@pytest.fixture(scope="module")
def cpu_landscape():
    data = json.loads(CPU_LANDSCAPE.read_text())
    spec = JobSpec.model_validate(data["spec"])
    trials = []
    for k, point in enumerate(data["points"]):
        run = point["runs"][0]
        if run["status"] not in ("ok", "oom"):
            continue
        trials.append(
            TrialRecord(
                number=k,
                status=run["status"],
                config=point["config"],
                metrics=run["metrics"],
                phase=run.get("phase"),
            )
        )
    random.Random(0).shuffle(trials)  # the order a search might meet them in
    assert len([t for t in trials if t.status == "ok"]) >= 8
    assert len([t for t in trials if t.status == "oom"]) >= 8
    return spec, spec.validate_model(), trials


def test_calibrated_on_the_earlier_trials_it_predicts_the_next_within_12_percent(cpu_landscape) -> None:
    spec, arch, trials = cpu_landscape
    model = MemoryModel(spec, arch, "cpu", 2.0, train_order="prompts")
    every = []
    for i, trial in enumerate(trials):
        model.calibrate(trials[:i])
        if i >= 3:
            every += [abs(e) for e in _errors_pct(model, trial, engine=False).values()]
    # A process's RSS on a CPU moves with its allocator's arenas: a few outliers, a tight mean.
    assert every and statistics.fmean(every) < 12.0 and max(every) < 50.0, every


@pytest.mark.parametrize("calibrated", [False, True])
def test_it_skips_the_measured_ooms_and_never_a_trial_that_fit(cpu_landscape, calibrated) -> None:
    spec, arch, trials = cpu_landscape
    model = MemoryModel(spec, arch, "cpu", 2.0, train_order="prompts")
    skipped = {}
    for i, trial in enumerate(trials):
        if calibrated:
            model.calibrate(trials[:i])
        skipped[trial.number] = model.predict(trial.config).exceeds(0.15) is not None
    ooms = [t.number for t in trials if t.status == "oom"]
    assert not [t.number for t in trials if t.status == "ok" and skipped[t.number]]
    caught = sum(skipped[n] for n in ooms)
    assert caught >= len(ooms) // 2, (caught, len(ooms))


def test_micro_batch_128_is_predicted_far_beyond_the_gpu(h200) -> None:
    spec, arch, trials = h200
    model = MemoryModel(spec, arch, "cuda", H200_GIB, train_order="prompts", logits_copied=True)
    (trial,) = [
        t
        for t in trials
        if t.config.get(A + "ppo_micro_batch_size_per_gpu") == 128 and t.phase == "update_actor"
    ]
    prediction = model.predict(trial.config)
    # Micro-batch 128 of up to 2806-token response windows: ~100 GiB of bf16 logits alone
    # (the allocation the real trial failed on), then their fp32 copy and gradients.
    assert prediction.worst_check()[0] in ("train", "wake")
    assert prediction.components["update_actor_gib"] > 2 * H200_GIB


def test_verl_defaults_fit_and_a_too_large_engine_budget_does_not(h200) -> None:
    spec, arch, trials = h200
    model = MemoryModel(spec, arch, "cuda", H200_GIB, train_order="prompts", logits_copied=True)
    base = dict(next(t for t in trials if t.baseline == "verl-v0.9-defaults").config)
    assert model.predict(base).exceeds(0.0) is None
    # gmu 0.95 beside a resident actor (17 GiB, no offload): vLLM refuses at start-up.
    refused = model.predict(base | {R + "gpu_memory_utilization": 0.95})
    assert refused.exceeds(0.0) is not None and refused.worst_check()[0] in ("startup", "wake")


@pytest.mark.parametrize(
    "knob",
    [
        R + "gpu_memory_utilization",
        A + "ppo_micro_batch_size_per_gpu",
        R + "log_prob_micro_batch_size_per_gpu",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
    ],
)
def test_every_phase_grows_with_a_memory_knob_the_rest_fixed(h200, knob) -> None:
    spec, arch, _ = h200
    space = SearchSpace.build(spec, arch, "cuda")
    model = MemoryModel(spec, arch, "cuda", H200_GIB, train_order="prompts", logits_copied=True)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    values = space.searched[knob]
    checked = 0
    for _ in range(30):
        config = space.suggest(study.ask()).config
        if knob not in config:
            continue
        low, high = sorted(random.Random(checked).sample(values, 2))
        small = model.physics_of(config | {knob: low}).phases
        large = model.physics_of(config | {knob: high}).phases
        assert all(large[p] >= small[p] - 1e-9 for p in small), (knob, low, high, small, large)
        checked += 1
    assert checked >= 5


def test_the_compiled_entropy_holds_no_vocabulary_wide_temporary_on_packed_rows(h200) -> None:
    """verl's engine computes the old-log-prob forward's entropy through torch.compile on
    packed rows (``use_torch_compile``, its default), fused into its reductions: that forward
    holds the logits alone. Eager (compile off, or padded rows) adds a softmax and its
    product with the logits, two positions-by-vocab tensors in the compute dtype."""
    spec, arch, trials = h200
    model = MemoryModel(spec, arch, "cuda", H200_GIB, train_order="prompts", logits_copied=True)
    base = dict(next(t for t in trials if t.baseline == "verl-v0.9-defaults").config)
    compile_ = A + "fsdp_config.use_torch_compile"
    packed = base | {"actor_rollout_ref.model.use_remove_padding": True}
    old = {
        (pack, on): model.physics_of(
            base | {"actor_rollout_ref.model.use_remove_padding": pack, compile_: on}
        ).components["old_log_prob_gib"]
        for pack in (True, False)
        for on in (True, False)
    }
    shape = model._worst(  # the old-log-prob pass's largest packed micro-batch
        model._rank_sequences(model.trial_spec(packed)),
        1,
        int(base[R + "log_prob_micro_batch_size_per_gpu"]),
        16384,
        False,
        True,
    )
    eager = 2 * shape.positions * arch.vocab_size * 2 / 2**30  # bfloat16
    assert old[True, False] - old[True, True] == pytest.approx(
        eager * (1 + model.k.allocator_slack), rel=1e-6
    )
    assert old[False, True] == old[False, False] > old[True, False]  # padded rows: eager either way


def test_the_current_trials_sub_phase_peaks_follow_the_physics_on_every_layout() -> None:
    """The trial as it runs now (the logits kept, the entropy compiled, verl's order), four
    layouts of the update at 32 prompts x 8 on four H200: each sub-phase's peak allocated
    memory against the physics alone, which counts the logits once (flash-attn's
    cross-entropy writes its gradient into them). Counted as the trials before 2026-11-27
    held them (a quotient and its gradient beside them), the larger micro-batches are
    over-predicted by far. The padded update is set against verl's own peak: those trials
    gathered its real positions with a mask, which let the padded logits go before the
    backward; verl's gather keeps them, and so does the trial's since
    (``trials.actor.real_positions``), which the physics counts."""
    doc = json.loads(LAYOUTS_COMPILED.read_text())
    run = doc["run"]
    spec = scaled(load_job_spec(REPO / run["job"]), 32, 8)
    arch = spec.validate_model()
    now = MemoryModel(spec, arch, "cuda", H200_GIB)
    copied = MemoryModel(spec, arch, "cuda", H200_GIB, logits_copied=True)
    errors, copied_errors = {}, {}
    for config, knobs in run["configs"].items():
        (trial, *_) = [r for r in run["runs"] if r["config"] == config and r["kind"] == "trial"]
        verl = [
            s for r in run["runs"] if r["config"] == config and r["kind"] == "verl" for s in r["steps"][1:]
        ]
        for phase in ("old_log_prob", "ref_log_prob", "update_actor"):
            measured = trial["metrics"][f"{phase}_max_allocated_gib"]
            if phase == "update_actor" and not knobs["actor_rollout_ref.model.use_remove_padding"]:
                measured = statistics.median(s["actor/perf/max_memory_allocated_gb"] for s in verl)
            for model, into in ((now, errors), (copied, copied_errors)):
                predicted = model.physics_of(knobs).components[f"{phase}_gib"]
                into[config, phase] = 100 * (predicted / measured - 1)
    assert len(errors) == 12
    every = [abs(e) for e in errors.values()]
    assert statistics.fmean(every) < 10.0 and max(every) < 15.0, errors
    assert copied_errors["p16", "update_actor"] > 30.0 < copied_errors["dyn16384", "update_actor"]


def test_on_a_cpu_the_engine_is_checked_beside_the_actor() -> None:
    spec = parse_job_spec(
        {
            "workload": {
                "model": "tiny",
                "dtype": "float32",
                "train_batch_size": 8,
                "n": 2,
                "ppo_mini_batch_size": 4,
            },
            "cluster": {"device": "cpu", "device_memory_gib": 2},
        }
    )
    arch = spec.validate_model()
    model = MemoryModel(spec, arch, "cpu", 2.0, train_order="prompts")
    config = SearchSpace.build(spec, arch, "cpu").baseline_config()
    fits = model.predict(config | {R + "gpu_memory_utilization": 0.5})
    assert fits.exceeds(0.0) is None
    assert fits.checks["startup"] == pytest.approx(fits.components["actor_gib"] + 1.0)
    # No CUDA contexts or graphs on a CPU; the rollout phase is not held to the cap there.
    assert fits.components["cuda_context_gib"] == 0 and "rollout" not in fits.checks


def test_the_fit_is_an_offset_until_three_trials_span_a_range() -> None:
    one = fit([(10.0, 12.0)])
    assert (one.scale, one.offset_gib) == (1.0, 2.0)
    same = fit([(10.0, 12.0), (10.5, 12.0), (10.2, 13.0)])
    assert same.scale == 1.0
    line = fit([(1.0, 3.0), (2.0, 5.0), (4.0, 9.0)])
    assert line.scale == pytest.approx(2.0) and line.offset_gib == pytest.approx(1.0)
    assert line.apply(3.0) == pytest.approx(7.0)


def test_sglangs_budget_is_its_fraction_of_the_memory_free_beside_the_actor(h200) -> None:
    spec, arch, _ = h200
    engines = {
        e: spec.model_copy(update={"workload": spec.workload.model_copy(update={"engine": e})})
        for e in ("vllm", "sglang")
    }
    startup, budgets = {}, {}
    for engine, job in engines.items():
        model = MemoryModel(job, arch, "cuda", H200_GIB, train_order="prompts", logits_copied=True)
        config = SearchSpace.build(job, arch, "cuda").baseline_config() | {
            R + "gpu_memory_utilization": 0.9,
            A + "fsdp_config.param_offload": False,
            A + "fsdp_config.optimizer_offload": False,
        }
        physics = model.physics_of(config)
        startup[engine], budgets[engine] = physics.phases["startup"], physics.components
    held = budgets["sglang"]["actor_gib"] + budgets["sglang"]["cuda_context_gib"]
    assert budgets["vllm"]["engine_budget_gib"] == pytest.approx(0.9 * H200_GIB)
    assert budgets["sglang"]["engine_budget_gib"] == pytest.approx(0.9 * (H200_GIB - held))
    # 0.9 beside an 18 GiB actor: vLLM asks for more than the device has, SGLang does not.
    assert startup["sglang"] < H200_GIB < startup["vllm"]


@pytest.fixture(scope="module")
def job_trials():
    spec, trials = dumped_job(JOB_RESULTS)
    return spec, spec.validate_model(), trials


def test_a_trial_that_took_over_a_rollout_measures_only_its_own_phases(job_trials) -> None:
    _, _, trials = job_trials
    reused = [t for t in trials if t.status == "ok" and "rollout_reused_from_trial" in t.metrics]
    assert reused
    for trial in reused:
        # Its start-up sampled the actor's build alone (no engine started there)...
        assert trial.metrics["startup_peak_memory_gib"] < trial.metrics["rollout_peak_memory_gib"] / 2
        measured = measured_phases(trial, engine=True)
        # ... and its rollout and wake peaks are the donor's: none of them is its own.
        assert not {"startup", "rollout", "wake", "peak"} & measured.keys()
        assert {"train", "train_probe", "actor"} <= measured.keys()


def test_calibrated_on_each_trial_before_it_vllm_refusals_are_skipped_and_no_fitting_trial(
    job_trials,
) -> None:
    spec, arch, trials = job_trials
    model = MemoryModel(spec, arch, "cuda", H200_GIB, train_order="prompts", logits_copied=True)
    ran = [t for t in trials if t.status in ("ok", "oom")]
    refused = {}
    for trial in ran:
        model.calibrate(t for t in ran if t.number < trial.number)
        refused[trial.number] = model.predict(trial.config).refusal
    assert not [t.number for t in ran if t.status == "ok" and refused[t.number]], refused
    # Trial 9: gmu 0.95 asked 133 GiB beside an actor holding 17.6 GiB; vLLM refused to
    # start. It is refused at any margin, while the 15% margin alone let it run.
    (nine,) = [t for t in ran if t.number == 9]
    assert nine.status == "oom" and nine.phase == "startup"
    assert refused[9] is not None and "gpu_memory_utilization 0.95" in refused[9]
    model.calibrate(t for t in ran if t.number < 9)
    assert model.predict(nine.config).exceeds(spec.memory_model.skip_margin) == refused[9]
    # Trial 3 (gmu 0.9 beside 12 GiB) passed vLLM's check and ran out of memory later: no
    # refusal there, only the margin's judgement.
    assert refused[3] is None
    # What the actor holds as the engine starts is measured after the train probe.
    for trial in ran:
        held = measured_phases(trial, engine=True)["actor"]
        assert held == pytest.approx(model.physics_of(trial.config).components["actor_gib"], abs=0.6)


def test_the_wake_after_training_with_expandable_segments_is_the_start_ups_level(job_trials) -> None:
    spec, arch, trials = job_trials
    model = MemoryModel(spec, arch, "cuda", H200_GIB, train_order="prompts", logits_copied=True)
    own = [t for t in trials if t.status == "ok" and "rollout_reused_from_trial" not in t.metrics]
    assert len(own) >= 8 and all(t.metrics["train_expandable_segments"] == 1.0 for t in own)
    for trial in own:
        measured = measured_phases(trial, engine=True)
        physics = model.physics_of(trial.config).phases
        # Training emptied the actor's cache: the hand-over stays at the start-up's level,
        # also where training peaked higher than the engine's start-up did.
        assert measured["wake"] == pytest.approx(physics["wake"], rel=0.08), trial.number
        assert physics["wake"] == pytest.approx(physics["startup"])
    assert any(t.metrics["train_peak_memory_gib"] > t.metrics["wake_peak_memory_gib"] + 20 for t in own)


def test_the_jobs_memory_errors_leave_out_what_a_reused_trial_did_not_measure(job_trials) -> None:
    """Trials recorded errors on the start-up, rollout and wake they took over from another
    trial before that was known; the job's summary of the model's error leaves them out."""
    from autotuner.summary import memory_errors

    _, _, trials = job_trials
    reused = [t for t in trials if "rollout_reused_from_trial" in t.metrics and t.memory_error_gib]
    assert reused and any(abs(t.memory_error_gib.get("startup", 0)) > 40 for t in reused)
    errors = memory_errors(trials)
    own = [t for t in trials if t not in reused and "startup" in t.memory_error_gib]
    assert errors["startup"]["trials"] == len(own)
    assert errors["startup"]["max_abs_error_gib"] == max(abs(t.memory_error_gib["startup"]) for t in own)
    assert errors["train"]["trials"] == len(own) + len(reused)  # its own phases still count
