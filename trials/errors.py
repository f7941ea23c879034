"""Errors a trial raises about itself (engine and allocator errors pass through as they are).

The runner turns every exception into a ``TrialResult``; these classes only make the
``error_type`` of the trial's own checks say what went wrong.
"""

from __future__ import annotations


class TrialError(Exception):
    """Root of the errors the trial worker raises itself."""


class InvalidTrialSpec(TrialError):
    """Raised before any phase runs when the spec is inconsistent (lengths, phases, sizes)."""


class UnknownBackend(TrialError):
    """Raised when a rollout engine name is not registered; the message lists the valid ones."""


class GenerationMismatch(TrialError):
    """Raised when the engine generated a different number of tokens than a request asked for."""


class KvCacheExhausted(GenerationMismatch):
    """Raised when requests came back short because the engine's KV cache could not hold
    them: SGLang, short of KV cache, cuts ``max_new_tokens`` to what its pool holds or aborts
    a request, and returns what it has without failing. A budget too small for the
    workload, so it is recorded as ``oom`` (``failures``), never as a fast success; a
    larger ``gpu_memory_utilization`` would help, so it rules out no larger config."""


class ConfigRejected(TrialError):
    """Raised when a knob combination cannot run at all (e.g. a sequence longer than the
    dynamic-batching token budget), mirroring the check verl itself makes."""


class GpuNotClean(TrialError):
    """Raised before a CUDA trial starts when one of its GPUs already holds memory that
    does not drop below the threshold in time (a previous trial's processes, another
    user); the message names the GPU, the memory and the processes holding it."""


class EngineMemoryRefused(TrialError):
    """Raised instead of starting the engine on a capped device (a CPU, or a GPU standing
    in for a smaller one) when the memory left beside the resident actor is less than
    ``gpu_memory_utilization`` asks for: the refusal vLLM itself makes on a real GPU."""


class EngineDied(TrialError):
    """Raised in the trial's main thread when one of the rollout engine's processes dies
    while the engine should be running (killed, crashed); the message names the process
    and its exit code or signal (see ``trials.rollout.watch``)."""


class TrialEnvironmentError(TrialError):
    """Raised when the trial's environment lacks what the config asks verl to run (e.g.
    flash-attention for verl's actor on a GPU): a fault of the host, not of the config;
    the message names the fix."""


class WeightSyncFailed(TrialError):
    """Raised when the engine did not load a bucket of the actor's weights (a vLLM worker
    that handed over fewer tensors than the bucket held, SGLang answering failure); the
    message says what the engine answered."""
