"""A packed micro-batch as verl's FSDP engine holds it (a TensorDict of nested tensors and
per-sequence objects), moved whole, against the trial's own packed tensors."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from trials import actor, worker_batch
from trials.errors import TrialEnvironmentError
from trials.verl.cut import ENTRIES, FIELDS, REF_ENTRIES, UPDATE_ENTRIES

CPU = torch.device("cpu")


def _batch(seed: int = 0) -> tuple[list[np.ndarray], list[int]]:
    rng = np.random.default_rng(seed)
    responses = [int(r) for r in rng.integers(1, 50, 40)]
    sequences = [rng.integers(0, 1000, int(rng.integers(2, 60)) + r) for r in responses]
    return sequences, responses


@pytest.mark.parametrize("phase", list(worker_batch.PASS_ENTRIES))
def test_verls_micro_batch_moved_whole_gives_the_packed_tensors(phase: str) -> None:
    sequences, responses = _batch()
    indices = tuple(range(3, 40, 2))
    staged = worker_batch.stage(sequences, responses, indices, phase)
    # The pass's per-sequence entries, each nested by sequence, and verl's objects beside them.
    entries = {"old_log_prob": ENTRIES, "ref_log_prob": ENTRIES + REF_ENTRIES,
               "update_actor": ENTRIES + REF_ENTRIES + UPDATE_ENTRIES}[phase]  # fmt: skip
    td = staged.td
    assert set(td.keys()) == set(entries) | set(FIELDS) and td.batch_size == torch.Size([len(indices)])
    lengths = [len(sequences[i]) for i in indices]
    assert td["input_ids"].offsets().diff().tolist() == lengths
    assert td["responses"].offsets().diff().tolist() == [responses[i] for i in indices]
    assert td["rm_scores"].dtype == torch.float32 and td["loss_mask"].dtype == torch.int64
    assert td.get("session_id").tolist() == [str(i) for i in indices]  # each sequence's own object
    moved = worker_batch.to_device(staged, CPU)
    own = actor.micro_batch(sequences, responses, indices, CPU, actor.PACKED)
    for name in ("input_ids", "position_ids", "labels", "response_mask", "prompt_offsets", "response_offsets",
                 "response_index"):  # fmt: skip
        mine, verls = getattr(own, name), getattr(moved, name)
        assert mine.shape == verls.shape and torch.equal(mine.to(verls.dtype), verls), name
    assert (moved.real_tokens, moved.longest_response) == (own.real_tokens, own.longest_response)
    assert moved.attention_mask is None and moved.layout == actor.PACKED


def test_the_same_log_probs_from_verls_micro_batch(tiny_config) -> None:
    """The model sees the same packed row through either path."""
    model = actor.build_causal_lm(tiny_config, torch.float32, CPU, gradient_checkpointing=False)
    vocab = tiny_config["vocab_size"]
    sequences, responses = _batch(1)
    sequences = [s % vocab for s in sequences]
    indices = tuple(range(6))
    staged = worker_batch.stage(sequences, responses, indices, "old_log_prob")
    with torch.no_grad():
        own = actor.response_log_probs(model, actor.micro_batch(sequences, responses, indices, CPU), None)
        verls = actor.response_log_probs(model, worker_batch.to_device(staged, CPU), None)
    torch.testing.assert_close(own, verls)


def test_without_tensordict_a_packed_micro_batch_is_an_environment_error(monkeypatch) -> None:
    sequences, responses = _batch()
    monkeypatch.setitem(sys.modules, "tensordict", None)  # import tensordict raises ImportError
    with pytest.raises(TrialEnvironmentError, match="tensordict is not importable.*install tensordict 0.10"):
        worker_batch.stage(sequences, responses, (0, 1), "old_log_prob")
