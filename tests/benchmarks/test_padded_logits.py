"""The padded layout's update peak, taken apart on the data it was measured in: verl's runs and
the trials that gather as verl does hold the padded logits twice beside the gathered rows at
the backward, the trials that gathered with a mask once; counted that way, each leaves the
same memory per padded position beside the logits."""

from __future__ import annotations

import pytest

from benchmarks import claims
from benchmarks.claims.data import load
from benchmarks.claims.padded_logits import PAD4, decompose, padded_micro_batches

VERL = decompose(claims.LAYOUTS, None, "verl")
MASK = decompose(claims.LAYOUTS_COMPILED, None, "trial")
NESTED = [decompose(claims.LAYOUTS_B16, host, "trial") for host in ("host 1", "host 2")]


def test_each_gather_leaves_the_same_per_padded_position_when_its_logits_are_counted() -> None:
    fitting = [VERL.left_if_nested, MASK.left_if_mask, *(d.left_if_nested for d in NESTED)]
    assert max(fitting) / min(fitting) < 1.1, fitting
    # The other count leaves what no layout could: several times as much, or less than nothing.
    assert VERL.left_if_mask > 3 * VERL.left_if_nested
    assert MASK.left_if_nested < 0
    assert all(d.left_if_mask > 3 * d.left_if_nested for d in NESTED)


def test_verls_peak_is_its_warm_up_steps_the_trials_batch() -> None:
    """verl's peak is its process's since the start; the decomposition takes the widest padded
    micro-batch of the job's first draw, the batch of verl's warm-up step and of every trial.
    No later step verl ran holds a wider one, and its measured steps read one peak."""
    run = load(claims.LAYOUTS)["run"]
    (verl,) = [r for r in run["runs"] if r["config"] == PAD4 and r["kind"] == "verl"]
    widest = padded_micro_batches(run, PAD4, steps=len(verl["steps"]))
    assert len(widest) == 4
    assert all(later[2] < widest[0][2] for later in widest[1:])
    assert len({step["actor/perf/max_memory_allocated_gb"] for step in verl["steps"][1:]}) == 1


@pytest.mark.parametrize("host", ["host 1", "host 2"])
def test_the_trials_gathering_as_verl_hold_their_widest_micro_batch_of_the_smaller_batch(host) -> None:
    """At 16 prompts x 8 the first draw's widest padded micro-batch is narrower than at 32 x 8,
    so the trials that hold it twice still peak no higher than the mask-gathered ones did."""
    (small,) = padded_micro_batches(load(claims.LAYOUTS_B16)["hosts"][0]["run"], PAD4)
    (large,) = padded_micro_batches(load(claims.LAYOUTS_COMPILED)["run"], PAD4)
    assert small[2] < large[2]
    nested = decompose(claims.LAYOUTS_B16, host, "trial")
    assert nested.peak <= MASK.peak and 2 * nested.p + nested.r > MASK.p + MASK.r
