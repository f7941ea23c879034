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


def _model_and_batch(config: dict, seed: int) -> tuple[torch.nn.Module, list[np.ndarray], list[int]]:
    """The tiny model and a batch whose ids are in its vocabulary."""
    model = actor.build_causal_lm(config, torch.float32, CPU, gradient_checkpointing=False)
    sequences, responses = _batch(seed)
    return model, [s % config["vocab_size"] for s in sequences], responses


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
    model, sequences, responses = _model_and_batch(tiny_config, 1)
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


@pytest.mark.parametrize("phase", list(worker_batch.PASS_ENTRIES))
def test_verls_micro_batch_padded_on_the_device_gives_the_padded_tensors(phase: str) -> None:
    """use_remove_padding false: the same TensorDict, padded after the move as verl's
    prepare_model_inputs pads it, gives the trial's padded rows, mask and positions, and
    keeps the offsets verl's loss cuts the responses with."""
    sequences, responses = _batch(2)
    indices = tuple(range(0, 40, 3))
    moved = worker_batch.to_device(
        worker_batch.stage(sequences, responses, indices, phase), CPU, actor.PADDED
    )
    own = actor.micro_batch(sequences, responses, indices, CPU, actor.PADDED)
    longest = max(len(sequences[i]) for i in indices)
    assert moved.layout == actor.PADDED and moved.input_ids.shape == (len(indices), longest)
    for name in ("input_ids", "position_ids", "attention_mask", "labels", "response_mask"):
        mine, verls = getattr(own, name), getattr(moved, name)
        assert mine.shape == verls.shape and torch.equal(mine.to(verls.dtype), verls), name
    packed = actor.micro_batch(sequences, responses, indices, CPU, actor.PACKED)
    for name in ("prompt_offsets", "response_offsets", "response_index"):
        assert torch.equal(getattr(packed, name), getattr(moved, name)), name
    assert moved.longest_response == max(responses[i] for i in indices)


def test_verls_loss_on_padded_rows_is_the_packed_rows_loss(tiny_config) -> None:
    """The padded layout's log-probs come back in the real tokens' order, so verl's loss (the
    responses cut back sequence by sequence) gives the packed layout's loss and metrics."""
    model, sequences, responses = _model_and_batch(tiny_config, 3)
    indices = tuple(range(5))
    staged = worker_batch.stage(sequences, responses, indices, "update_actor")
    losses, reads = [], []
    for layout in (actor.PACKED, actor.PADDED):
        tensors = worker_batch.to_device(staged, CPU, layout)
        assert tensors.response_index is not None
        advantages = torch.linspace(-1, 1, tensors.response_index.numel())
        read: dict[str, float] = {}
        with torch.no_grad():
            log_probs = actor.response_log_probs(model, tensors, None)
            losses.append(actor.verl_policy_loss(log_probs, tensors, advantages, None, read))
        reads.append(read)
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-4, atol=1e-5)
    assert reads[0].keys() == reads[1].keys() == {"pg_clipfrac", "ppo_kl", "pg_loss", "pg_clipfrac_lower"}
    assert reads[0] == pytest.approx(reads[1], rel=1e-4, abs=1e-5)


@pytest.mark.parametrize("layout", [actor.PACKED, actor.PADDED])
def test_the_logits_are_divided_by_verls_temperature_unless_it_is_one(tiny_config, layout: str) -> None:
    """verl builds the sampling temperature on either path, each real position's (packed) or
    each row's (padded), and divides the logits by it into a new tensor unless it is the
    scalar 1.0, its default, at which the model's logits are used as they are."""
    model, sequences, responses = _model_and_batch(tiny_config, 4)
    indices = (0, 2, 5)
    moved = worker_batch.to_device(
        worker_batch.stage(sequences, responses, indices, "old_log_prob"), CPU, layout
    )
    tokens = sum(len(sequences[i]) for i in indices)
    assert moved.temperature is not None and torch.equal(
        moved.temperature, torch.ones_like(moved.temperature)
    )
    assert moved.temperature.shape == ((tokens, 1) if layout == actor.PACKED else (len(indices), 1, 1))
    assert moved.unit_temperature
    seen: list[torch.Tensor] = []
    model.lm_head.register_forward_hook(lambda module, args, out: seen.append(out))
    with torch.no_grad():
        plain = actor.logits_rows(model, actor.micro_batch(sequences, responses, indices, CPU, layout), None)
        whole, rows = actor.scaled_logits(model, moved, None)
        torch.testing.assert_close(rows, plain)
        assert whole.untyped_storage().data_ptr() == seen[-1].untyped_storage().data_ptr()  # no copy
        moved.temperature, moved.unit_temperature = moved.temperature * 2.0, False
        whole, rows = actor.scaled_logits(model, moved, None)
        torch.testing.assert_close(rows, plain / 2.0)
        assert whole.untyped_storage().data_ptr() != seen[-1].untyped_storage().data_ptr()


def test_padded_rows_entropy_is_taken_over_every_position_and_kept_for_the_real_ones(tiny_config) -> None:
    model, sequences, responses = _model_and_batch(tiny_config, 5)
    staged = worker_batch.stage(sequences, responses, (1, 3, 4, 7), "update_actor")
    entropies = []
    for layout in (actor.PACKED, actor.PADDED):
        with torch.no_grad():
            _, entropy = actor.log_probs_and_entropy(
                model,
                worker_batch.to_device(staged, CPU, layout),
                None,
                actor.EntropyKernel(chunked=True),
                False,
            )
        entropies.append(entropy)
    assert entropies[0].shape == (staged.real_tokens,)
    torch.testing.assert_close(entropies[0], entropies[1], rtol=1e-4, atol=1e-5)
