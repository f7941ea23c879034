"""verl's two micro-batch layouts compute the same log-probabilities as one sequence at a
time, with the costs that set them apart: packed rows hold only real tokens, padded rows
hold the micro-batch's longest row for every sequence."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trials import actor
from trials.errors import TrialEnvironmentError

TINY = {
    "model_type": "qwen2",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 128,
}
CPU = torch.device("cpu")


def _batch(seed: int) -> tuple[list[np.ndarray], list[int]]:
    rng = np.random.default_rng(seed)
    prompts = [int(p) for p in rng.integers(3, 20, size=5)]
    responses = [int(r) for r in rng.integers(1, 30, size=5)]
    sequences = [rng.integers(0, 128, size=p + r) for p, r in zip(prompts, responses, strict=True)]
    return sequences, responses


def _alone(model: torch.nn.Module, sequence: np.ndarray, response: int) -> torch.Tensor:
    """The response's log-probs from the sequence run on its own, no padding, no packing."""
    ids = torch.from_numpy(np.asarray(sequence, dtype=np.int64)).unsqueeze(0)
    logits = model(input_ids=ids, use_cache=False).logits[0].float()
    log_probs = torch.log_softmax(logits[:-1], dim=-1).gather(-1, ids[0, 1:].unsqueeze(-1)).squeeze(-1)
    return log_probs[len(sequence) - 1 - response :]


@pytest.mark.parametrize("layout", [actor.PACKED, actor.PADDED])
def test_each_layout_matches_one_sequence_at_a_time(layout: str) -> None:
    torch.manual_seed(0)
    model = actor.build_causal_lm(TINY, torch.float32, CPU, False).eval()
    sequences, responses = _batch(seed=1)
    indices = tuple(range(len(sequences)))
    mb = actor.micro_batch(sequences, responses, indices, CPU, layout)
    with torch.no_grad():
        log_probs = actor.response_log_probs(model, mb, None, entropy=False)
        expected = torch.cat([_alone(model, sequences[i], responses[i]) for i in indices])
    assert mb.real_tokens == sum(len(s) for s in sequences)
    assert log_probs[mb.response_mask.bool()].shape == expected.shape == (sum(responses),)
    torch.testing.assert_close(log_probs[mb.response_mask.bool()], expected, atol=2e-5, rtol=1e-4)


def test_packed_rows_hold_only_real_tokens_and_padded_rows_the_longest() -> None:
    sequences, responses = _batch(seed=2)
    indices = tuple(range(len(sequences)))
    packed = actor.micro_batch(sequences, responses, indices, CPU, actor.PACKED)
    padded = actor.micro_batch(sequences, responses, indices, CPU, actor.PADDED)
    longest = max(len(s) for s in sequences)
    assert packed.input_ids.shape == (1, packed.real_tokens) and packed.attention_mask is None
    assert padded.input_ids.shape == (len(sequences), longest)
    assert padded.padded_tokens == len(sequences) * longest > packed.padded_tokens
    # Position ids restart at every sequence of a packed row.
    starts = (packed.position_ids[0] == 0).nonzero().flatten().tolist()
    assert starts == list(np.cumsum([0] + [len(s) for s in sequences[:-1]]))


def test_chunked_entropy_equals_the_whole_rows() -> None:
    logits = torch.randn(actor.ENTROPY_CHUNK_ROWS + 37, 50, dtype=torch.float64)
    whole = actor.entropy_rows(logits, chunked=False)
    chunked = actor.entropy_rows(logits, chunked=True)
    reference = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)
    torch.testing.assert_close(whole, reference)
    torch.testing.assert_close(chunked.double(), reference, atol=1e-5, rtol=1e-5)


def test_the_update_with_entropy_checkpointed_has_the_same_gradients() -> None:
    sequences, responses = _batch(seed=3)
    mb = actor.micro_batch(sequences, responses, tuple(range(5)), CPU, actor.PACKED)
    grads = []
    for checkpointed in (False, True):
        torch.manual_seed(0)
        model = actor.build_causal_lm(TINY, torch.float32, CPU, False)
        log_probs, entropy = actor.log_probs_and_entropy(model, mb, None, False, checkpointed)
        (actor.policy_loss(log_probs, mb, torch.ones_like(log_probs)) - 0.01 * entropy.mean()).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    torch.testing.assert_close(grads[0], grads[1])


def test_a_gpu_actor_without_flash_attn_is_an_environment_error(monkeypatch) -> None:
    monkeypatch.setattr(actor, "has_flash_attn", lambda: False)
    with pytest.raises(TrialEnvironmentError, match="flash-attention 2.*install flash-attn"):
        actor.attention_kernel("cuda")
    assert actor.attention_kernel("cpu") == actor.SDPA
