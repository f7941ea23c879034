"""The rollout-engine plug point: one narrow interface every engine implements."""

from __future__ import annotations

import abc
import json
import os
import tempfile
from dataclasses import dataclass, field

from trials.types import TrialSpec


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
    again. All calls come from one thread.

    Ownership: the backend owns every process, temporary directory and environment
    change it makes; after ``shutdown`` returns, its processes have exited and their
    memory is released, so the train phase measures only itself.

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
    def shutdown(self) -> None:
        """Stop the engine and wait until its processes are gone (idempotent)."""


def dummy_model_dir(spec: TrialSpec) -> str:
    """A fresh temporary directory holding only the spec's ``config.json``: what an engine
    loads with ``load_format="dummy"`` (random weights of the right shapes). The backend
    removes it in ``shutdown``."""
    path = tempfile.mkdtemp(prefix=f"trial-{spec.trial_id}-model-")
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(spec.model_config, f)
    return path
