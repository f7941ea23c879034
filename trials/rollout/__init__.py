"""Rollout engines by name. Importing this package imports no engine.

``get_backend("vllm")`` imports vLLM's adapter only when asked (``sglang``: SGLang's); a
name that is not in ``BACKENDS`` raises ``UnknownBackend`` listing the valid ones. Adding
an engine means one module implementing ``RolloutBackend`` and one row here (the job spec's
``workload.engine`` accepts the names here), plus the control plane's knob rows for it: the
argument it takes each knob as (``Knob.engine_args`` in ``autotuner.knobs``). Each engine
is also the name of the Python package a trial's environment must import for it.
"""

from __future__ import annotations

import importlib

from trials.errors import UnknownBackend
from trials.rollout.base import EngineFacts, Generation, RolloutBackend

# name -> "module:class", imported on first use.
BACKENDS: dict[str, str] = {
    "vllm": "trials.rollout.vllm:VllmBackend",
    "sglang": "trials.rollout.sglang:SglangBackend",
}

__all__ = ["BACKENDS", "EngineFacts", "Generation", "RolloutBackend", "get_backend"]


def get_backend(name: str) -> RolloutBackend:
    """A fresh, unstarted backend for the engine called ``name``."""
    target = BACKENDS.get(name)
    if target is None:
        valid = ", ".join(sorted(BACKENDS))
        raise UnknownBackend(f"unknown rollout engine {name!r}; valid engines: {valid}")
    module_name, class_name = target.split(":")
    backend_cls = getattr(importlib.import_module(module_name), class_name)
    backend: RolloutBackend = backend_cls()
    return backend
