"""Feasibility by monotonicity: memory only grows with the memory knobs, the rest fixed.

With every other knob equal, a larger value of a knob whose row says ``memory="grows"``
(``autotuner.knobs``): ``gpu_memory_utilization`` (the engine's budget
beside the actor, less headroom outside it), ``max_num_seqs`` and
``max_num_batched_tokens`` or SGLang's ``chunked_prefill_size`` (more of that budget for
activations and the sampler), a
larger micro-batch or token budget (more activations and logits) never need less memory
in any phase. So a measured OOM rules out every config at least as large in all of them
("its larger neighbours"), and a success rules in every config at most as large.

One kind of OOM runs the other way: the engine's KV cache too *small* (a budget that
leaves no room for the cache blocks, or for one sequence of ``max_model_len``) gets
better with a larger budget. Those failures are not used to rule anything out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from autotuner.knobs import memory_knobs
from autotuner.records import TrialRecord, TrialStatus

# OOMs of a KV cache too small for the engine's needs: a larger budget would help. vLLM
# refuses to start; SGLang refuses (its weights fill the budget), aborts a request it
# cannot fit, refuses a prompt longer than its pool, or cuts requests short
# (``KvCacheExhausted``).
KV_SHORTAGE = re.compile(
    r"No available memory for the cache blocks|larger than the available KV cache memory|"
    r"Cannot auto-fit max_model_len|insufficient KV cache|less than requested memory for kv|"
    r"KvCacheExhausted|Not enough memory\. Please try to increase --mem-fraction-static|"
    r"Loaded weights leave no GPU memory for the KV cache|Out of memory even after retracting|"
    r"exceeds the maximum allowed length|Memory pool size is too small",
    re.IGNORECASE,
)


def at_most(small: dict[str, Any], large: dict[str, Any]) -> bool:
    """Whether ``small`` needs no more memory than ``large``: the same knobs, equal except
    the memory knobs, and each of those no larger."""
    if small.keys() != large.keys():
        return False
    grows = memory_knobs("grows")
    for key, value in small.items():
        other = large[key]
        if key in grows:
            if float(value) > float(other):
                return False
        elif value != other:
            return False
    return True


def rules_out(record: TrialRecord) -> bool:
    """Whether a trial's outcome says its larger neighbours cannot fit either."""
    if record.status != TrialStatus.OOM or not record.config:
        return False
    return not KV_SHORTAGE.search(f"{record.error_type or ''} {record.error_message or ''}")


@dataclass
class Feasibility:
    """The measured OOMs and successes of a job, and what they imply for a proposal."""

    ooms: list[TrialRecord] = field(default_factory=list)
    fits: list[TrialRecord] = field(default_factory=list)

    def add(self, record: TrialRecord) -> None:
        if rules_out(record):
            self.ooms.append(record)
        elif record.status == TrialStatus.OK and record.config:
            self.fits.append(record)

    def ruled_out_by(self, config: dict[str, Any]) -> TrialRecord | None:
        """A measured OOM no larger than ``config`` in any memory knob (else None)."""
        return next((r for r in self.ooms if at_most(r.config, config)), None)

    def ruled_in_by(self, config: dict[str, Any]) -> TrialRecord | None:
        """A measured success no smaller than ``config`` in any memory knob (else None)."""
        return next((r for r in self.fits if at_most(config, r.config)), None)
