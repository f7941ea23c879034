"""The rollout-engine plug point: one narrow interface every engine implements."""

from __future__ import annotations

import abc
import dataclasses
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

from trials.errors import InvalidTrialSpec
from trials.types import TrialSpec

# The shared dummy-model directories' names in the temporary folder (``dummy_model_dir``).
DUMMY_MODEL_PREFIX = "autotuner-dummy-model-"


@dataclass
class Generation:
    """What one ``generate`` call produced.

    ``generated_tokens[i]`` is the number of token ids the engine returned for request
    ``i`` (counted from its output, not taken from the request); ``elapsed_s`` is the
    wall time from submitting the first request to receiving the last output.
    ``notes[i]``, where the engine says why request ``i`` ended otherwise than by its
    length limit (SGLang's abort message), is that reason.
    """

    generated_tokens: list[int]
    elapsed_s: float
    notes: dict[int, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TensorSlot:
    """Where one named tensor lies in a ``WeightBucket``'s buffer: ``shape`` and ``dtype``
    (a torch dtype's name, e.g. ``float32``) at ``offset`` bytes from the buffer's start."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    offset: int


@dataclass
class WeightBucket:
    """One bucket of a weight sync (``trials.rollout.weight_sync``): tensors packed back
    to back into ``buffer``, a ``torch.uint8`` tensor owned by the sender.

    On CUDA the buffer is device memory the engine's workers open by CUDA IPC; elsewhere
    (CPU) it lies in the shared-memory block named ``shared_memory``, which the workers
    attach to by that name. ``last``: the sync's final bucket (possibly empty).
    """

    buffer: Any
    tensors: list[TensorSlot]
    last: bool
    shared_memory: str | None = None

    def views(self) -> list[tuple[str, Any]]:
        """The bucket's tensors as ``(name, tensor)`` views into ``buffer`` (no copy)."""
        return [(slot.name, tensor_view(self.buffer, slot)) for slot in self.tensors]


def tensor_view(buffer: Any, slot: TensorSlot) -> Any:
    """``slot``'s tensor: a view into the ``torch.uint8`` tensor ``buffer``."""
    import torch

    dtype = getattr(torch, slot.dtype)
    nbytes = dtype.itemsize * _numel(slot.shape)
    return buffer[slot.offset : slot.offset + nbytes].view(dtype).view(slot.shape)


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


@dataclass
class EngineFacts:
    """What the engine reports about itself; None where the engine does not say."""

    kv_cache_tokens: int | None = None
    preemptions: int | None = None


class RolloutBackend(abc.ABC):
    """A rollout engine serving one replica with dummy weights.

    Call order: ``start`` once, then ``generate`` any number of times (the caller's
    first call is its warm-up), ``facts`` at any time after ``start``, and ``shutdown``
    exactly once, also after a failed ``start`` or ``generate`` (it must tolerate a
    half-started engine). Between generations an engine whose ``can_sleep`` is true may
    be put to ``sleep`` (its device memory released, as verl's hybrid engine does while
    the actor trains) and must then get ``wake_up`` (all tags) before it generates
    again. ``receive_weights`` runs between ``start`` (or ``wake_up``) and ``generate``,
    once per bucket of a weight sync, in order. All calls come from one thread.

    Ownership: the backend owns every process, temporary directory (not the shared
    ``dummy_model_dir``) and environment change it makes; after ``shutdown`` returns, its
    processes have exited and their memory is released, so the train phase measures only
    itself.

    Errors: ``start`` lets the engine's own exceptions through (the runner classifies
    them as ``oom`` or ``error`` from their text and the captured log); ``generate``
    does not check lengths itself, the caller compares ``generated_tokens`` with what
    it asked for. An engine process that dies between ``start`` and ``shutdown`` must
    not leave the caller blocked: the backend raises ``trials.errors.EngineDied`` in the
    caller's (main) thread, e.g. with ``trials.rollout.watch.EngineWatch``.
    """

    name: str = ""
    # Set by ``start``: whether this engine can release its memory with ``sleep``.
    can_sleep: bool = False

    @abc.abstractmethod
    def start(self, spec: TrialSpec, dtype: str) -> float:
        """Build the engine for ``spec`` (model, knobs) computing in ``dtype``;
        return its start-up time in seconds."""

    @abc.abstractmethod
    def generate(self, prompts: list[list[int]], max_tokens: list[int]) -> Generation:
        """Generate exactly ``max_tokens[i]`` tokens (EOS ignored) after ``prompts[i]``."""

    @abc.abstractmethod
    def facts(self) -> EngineFacts:
        """KV-cache capacity (tokens) and cumulative preemptions since ``start``."""

    def sleep(self) -> float:
        """Release the engine's device memory (weights offloaded, KV cache discarded);
        the seconds it took. Only when ``can_sleep``."""
        raise NotImplementedError(f"the {self.name} backend cannot sleep")

    def wake_up(self, tags: list[str] | None = None) -> float:
        """Take the memory back (``tags``: ``weights``, ``kv_cache``; None: all); seconds."""
        raise NotImplementedError(f"the {self.name} backend cannot sleep")

    @abc.abstractmethod
    def receive_weights(self, bucket: WeightBucket) -> None:
        """Load ``bucket``'s tensors (full, unsharded, named as the Hugging Face model's
        state dict names them) into the engine's model weights, as verl's checkpoint
        engine does (the model's own ``load_weights``, which casts to the engine's dtype
        and shards for its tensor parallelism); return once every worker has loaded them.

        The sender owns ``bucket.buffer`` and overwrites it with the next bucket after
        this returns: the backend keeps no view of it past the call, and releases what it
        opened for it (IPC handle, shared-memory attachment) by the ``last`` bucket.
        Errors: the engine's own exceptions pass through (``EngineDied`` where a process
        died)."""

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Stop the engine and wait until its processes are gone (idempotent)."""


def dummy_model_dir(spec: TrialSpec) -> str:
    """A directory holding only the spec's ``config.json``: what an engine loads with
    ``load_format="dummy"`` (random weights of the right shapes).

    It is named by the config's content and shared by every trial of that model on the
    host. vLLM keys its compile cache by the model's path among the rest
    (``ModelConfig.compute_hash``), so a fresh directory per trial made every trial compile
    its graphs anew, where verl, loading one checkpoint path, finds them in the cache. The
    file is written whole (a temporary file renamed over it), so trials starting at once
    read one complete config; the directory stays (a few KiB)."""
    text = json.dumps(spec.model_config, sort_keys=True)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    path = os.path.join(tempfile.gettempdir(), f"{DUMMY_MODEL_PREFIX}{digest}")
    os.makedirs(path, exist_ok=True)
    target = os.path.join(path, "config.json")
    if not os.path.isfile(target):
        fd, partial = tempfile.mkstemp(dir=path, prefix=".config-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(partial, target)
    return path


def knob_arguments(spec: TrialSpec) -> dict[str, Any]:
    """The engine's arguments for the trial's knobs: each argument ``spec.rollout.engine_args``
    names, with the value of the rollout field it names. A spec that names none (which
    would leave every knob at the engine's own default) or names a field ``RolloutKnobs``
    does not have raises ``InvalidTrialSpec``."""
    r = spec.rollout
    if not r.engine_args:
        raise InvalidTrialSpec(
            f"rollout.engine_args is empty: the {r.engine} engine would get none of the trial's "
            "knobs; give each engine argument its rollout field (the control plane's knob "
            "table does: autotuner.knobs.engine_arguments)"
        )
    fields = {f.name for f in dataclasses.fields(r)}
    unknown = sorted(name for name in r.engine_args.values() if name not in fields)
    if unknown:
        raise InvalidTrialSpec(
            f"rollout.engine_args names {', '.join(unknown)}, not fields of the rollout knobs "
            f"({', '.join(sorted(fields))})"
        )
    return {argument: getattr(r, name) for argument, name in r.engine_args.items()}
