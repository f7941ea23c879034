"""The tracer's profile of one update pass of a verl worker (``trials.verl.trace``,
``trials.profiling``), on an engine of the shape it wraps."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from trials.profiling import COUNT, FIRST, PASS_ENV, PROFILE_ENV
from trials.verl import trace


class _Engine:
    """The part of verl v0.9's FSDP engine the tracer wraps: a pass
    (``FSDPEngine.forward_backward_batch``) calls ``forward_step`` once per micro-batch, and
    the engine's config says whether it is the reference's (``forward_only``)."""

    def __init__(self, ref: bool = False) -> None:
        self.engine_config = SimpleNamespace(forward_only=ref)

    def forward_backward_batch(
        self, data: list[torch.Tensor], loss_function: Any, forward_only: bool = False
    ):
        return [self.forward_step(mb, loss_function, forward_only) for mb in data]

    def forward_step(self, micro_batch: torch.Tensor, loss_function: Any, forward_only: bool):
        return (micro_batch @ micro_batch).sum()


def test_the_chosen_update_pass_of_each_worker_is_profiled_and_no_other(tmp_path: Path, monkeypatch) -> None:
    profiles = tmp_path / "profiles"
    monkeypatch.setenv(PROFILE_ENV, str(profiles))
    monkeypatch.setenv(PASS_ENV, "2")
    monkeypatch.setattr(trace, "_update_passes", [0])
    records = tmp_path / "trace.jsonl"
    trace._wrap_pass(_Engine, records)
    trace._wrap_forward_step(_Engine)
    actor, ref = _Engine(), _Engine(ref=True)
    micro_batches = [torch.randn(64, 64) for _ in range(FIRST + COUNT + 2)]

    def written() -> list[Path]:
        return sorted(profiles.glob("profile-verl-update_actor-*.json"))

    actor.forward_backward_batch(micro_batches, None, forward_only=True)  # old log-probs: not counted
    ref.forward_backward_batch(micro_batches, None, forward_only=True)  # the reference's: not counted
    actor.forward_backward_batch(micro_batches, None)  # the first update pass
    assert written() == []
    actor.forward_backward_batch(micro_batches, None)  # the second: profiled
    (path,) = written()
    doc = json.loads(path.read_text())
    assert doc["micro_batches"] == list(range(FIRST, FIRST + COUNT))
    calls = {op["name"]: op["calls"] for op in doc["ops"]}
    assert calls["aten::mm"] == COUNT  # one matmul per profiled micro-batch
    actor.forward_backward_batch(micro_batches, None)  # the third: not
    assert written() == [path]
    # Every pass was traced as before, with the process's CPU seconds in it.
    passes = [json.loads(line) for line in records.read_text().splitlines()]
    assert [(p["role"], p["forward_only"]) for p in passes] == [
        ("actor", True),
        ("ref", True),
        ("actor", False),
        ("actor", False),
        ("actor", False),
    ]
    assert all(p["process_cpu_s"] > 0 for p in passes)
