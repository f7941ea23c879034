"""Names of the trial metrics that the rest of the project reads by name (a trial's
``TrialResult.metrics`` keys; units in the names). Objectives, the Pareto front, the
composition model, exports and the web page all read these two."""

from __future__ import annotations

# Step throughput, verl's definition: tokens of one PPO/GRPO step / step time / GPUs.
THROUGHPUT = "throughput_tokens_per_s_per_gpu"
# The trial's peak device memory over its phases, GiB.
PEAK_MEMORY = "peak_memory_gib"
