"""verl's update on one host at 16 prompts x 8, set against the trials from its trace: the warm-up
step's own peak, read where verl's never-reset process peak passes it, and the order in which
verl hands a step's sequences to the update, read off its micro-batches' tokens."""

from __future__ import annotations

from collections import Counter

import pytest

from benchmarks import claims
from benchmarks.claims.data import load
from benchmarks.claims.layout_verl import _verl_update_peaks, layout_verl_order, layout_verl_warmup_peaks
from benchmarks.claims.padded_logits import drawn_update_micro_batches
from trials.lengths import steps_lengths

RUN = load(claims.LAYOUTS_B16_VERL)["run"]


def _verl(run: dict, config: str) -> dict:
    (verl,) = [r for r in run["runs"] if r["config"] == config and r["kind"] == "verl"]
    return verl


@pytest.mark.parametrize("config", ["p4", "p16", "dyn16384", "pad4"])
def test_the_trials_cut_takes_every_drawn_sequence_once_as_the_config_asks(config: str) -> None:
    knobs = RUN["configs"][config]
    steps = drawn_update_micro_batches(RUN, config, steps=4)
    assert len(steps) == 4
    maxima = [max(max(mb) for mb in micro_batches) for micro_batches in steps]  # each step's longest
    for micro_batches, step in zip(steps, _verl(RUN, config)["steps"], strict=True):
        assert sum(len(mb) for mb in micro_batches) == 128  # 16 prompts x 8
        if "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu" in knobs:
            size = int(knobs["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"])
            assert {len(mb) for mb in micro_batches} == {size}
        else:
            budget = int(knobs["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"])
            assert max(sum(mb) for mb in micro_batches) <= budget
        assert step["response_length/max"] < max(max(mb) for mb in micro_batches) <= 512 + 3072
    assert len(set(maxima)) > 1


def test_the_draws_the_cut_takes_are_the_jobs_steps_in_order() -> None:
    """The cut's sequences of a step are that step's drawn prompts and responses, each once; verl
    ran the same draws (each step's longest response is the one verl logged for that step)."""
    from autotuner.spec import load_job_spec
    from autotuner.trialspec import build_trial_spec
    from benchmarks.claims.data import HERE
    from benchmarks.gpu.verl_compare import scaled

    w = RUN["workload"]
    spec = scaled(load_job_spec(HERE.parent / RUN["job"]), w["train_batch_size"], w["ppo_mini_batch_size"])
    batch = build_trial_spec(
        spec, spec.validate_model(), RUN["configs"]["p4"], "lengths", "cuda", 100.0
    ).batch
    assert batch is not None
    prompts, responses = steps_lengths(batch, 4)
    logged = [s["response_length/max"] for s in _verl(RUN, "p4")["steps"]]
    for k, micro_batches in enumerate(drawn_update_micro_batches(RUN, "p4", steps=4)):
        drawn = range(k * batch.prompts, (k + 1) * batch.prompts)
        want = Counter(prompts[i] + n for i in drawn for n in responses[i])
        assert Counter(n for mb in micro_batches for n in mb) == want
        assert max(n for i in drawn for n in responses[i]) == logged[k]


@pytest.mark.parametrize("config", ["p4", "p16", "dyn16384", "pad4"])
def test_the_warm_up_steps_peak_is_the_process_peak_at_its_last_update_pass(config: str) -> None:
    verl = _verl(RUN, config)
    warm_peak, warm_largest, run_peak, run_largest = _verl_update_peaks(verl)
    passes = [r for r in verl["trace"] if r["call"] == "forward_backward_batch" and not r.get("forward_only")]
    peaks = [r["max_allocated_gib"] for r in passes]
    assert peaks == sorted(peaks)  # never reset: it only rises
    assert warm_peak == peaks[len(passes) // 4 - 1] <= run_peak == peaks[-1]
    assert warm_largest <= run_largest
    # the peak verl logs for a step is its process's so far: the warm-up step's own, then the run's
    logged = [s["actor/perf/max_memory_allocated_gb"] for s in verl["steps"]]
    assert logged == sorted(logged)
    assert logged[0] == pytest.approx(warm_peak, abs=0.01)
    assert logged[-1] == pytest.approx(run_peak, abs=0.01)


def test_the_trials_peaks_lie_within_a_tenth_of_verls_warm_up_steps() -> None:
    rows = [
        line.text
        for line in layout_verl_warmup_peaks(claims.LAYOUTS_B16_VERL)()
        if line.text.startswith("| ")
    ]
    offs = [float(row.split(" | ")[5].rstrip("%")) for row in rows[1:]]
    assert len(offs) == 4
    assert all(abs(off) <= 10 for off in offs), offs


def _order_rows(rel: str) -> list[list[int]]:
    rows = [line.text for line in layout_verl_order(rel, "p4")() if line.text.startswith("| ")][1:]
    return [[int(cell) for cell in row.strip("| ").split(" | ")[1:]] for row in rows]


def test_verl_hands_the_update_its_sequences_in_order_of_length_at_16_prompts_not_at_32() -> None:
    """At 16 prompts x 8 verl's largest micro-batch of 4 in each measured step is the step's four
    longest sequences together, and the trial's cut holds less; at 32 prompts x 8 no step's is,
    and the trial's largest over the run lies within a tenth of verl's."""
    small = _order_rows(claims.LAYOUTS_B16_VERL)
    assert len(small) == 4
    assert all(verl == longest > trial for verl, longest, trial in small[1:])
    assert small[0][0] < small[0][1]  # the warm-up step: not in order of length
    large = _order_rows(claims.LAYOUTS)
    assert len(large) == 4
    assert all(verl < 0.8 * longest for verl, longest, _ in large)
    verl_largest, trial_largest = max(r[0] for r in large), max(r[2] for r in large)
    assert abs(trial_largest - verl_largest) <= 0.1 * verl_largest
