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
        log_probs = actor.response_log_probs(model, mb, None, entropy=actor.EntropyKernel())
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


def test_the_padded_update_keeps_its_padded_logits_to_the_backward_as_verl_does() -> None:
    """verl 0.9.1's padded path gathers the real positions through a jagged view of the padded
    logits; autograd keeps that view, so the padded logits live until the backward, beside the
    gradient it builds for them. The trial gathers the same way: the same rows in the same
    order as a mask would pick, and the padded tensor among what the backward holds."""
    torch.manual_seed(0)
    model = actor.build_causal_lm(TINY, torch.float32, CPU, False)
    sequences, responses = _batch(seed=4)
    mb = actor.micro_batch(sequences, responses, tuple(range(5)), CPU, actor.PADDED)
    held: list[int] = []

    def keep(t: torch.Tensor) -> torch.Tensor:
        held.append((t.values() if t.is_nested else t).untyped_storage().data_ptr())
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        whole, rows = actor.scaled_logits(model, mb, None)
    assert mb.attention_mask is not None
    torch.testing.assert_close(rows, whole[mb.attention_mask.bool()], rtol=0, atol=0)
    assert whole.untyped_storage().data_ptr() in held  # the padded logits, kept for the backward
    rows.float().logsumexp(-1).sum().backward()
    assert all(p.grad is not None for p in model.lm_head.parameters())


def test_chunked_entropy_equals_the_whole_rows() -> None:
    logits = torch.randn(actor.ENTROPY_CHUNK_ROWS + 37, 50, dtype=torch.float64)
    whole = actor.entropy_rows(logits, chunked=False)
    chunked = actor.entropy_rows(logits, chunked=True)
    reference = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)
    torch.testing.assert_close(whole, reference)
    torch.testing.assert_close(chunked.double(), reference, atol=1e-5, rtol=1e-5)


def test_verls_compiled_entropy_is_chosen_as_its_engine_chooses_it() -> None:
    """Compiled where verl's engine compiles and it pays: packed rows, unchunked, on a GPU,
    with use_torch_compile on (verl's default); eager otherwise."""
    assert actor.EntropyKernel.for_config("cuda", True, False).compiled
    assert not actor.EntropyKernel.for_config("cuda", False, False).compiled
    assert not actor.EntropyKernel.for_config("cuda", True, True).compiled  # recompiles per shape in verl
    assert not actor.EntropyKernel.for_config("cpu", True, False).compiled
    assert not actor.EntropyKernel.for_config("cuda", True, False, packed=False).compiled


def test_the_compiled_entropy_gives_the_eager_values_at_every_row_count() -> None:
    """One torch.compile (dynamic shapes) serves micro-batches of any row count, and gives the
    eager function's values; padded rows take the eager function whatever the kernel."""
    from torch._dynamo.utils import counters

    compiled = actor.EntropyKernel(compiled=True)
    graphs = []
    for rows in (37, 1000, 5):
        logits = torch.randn(rows, 300)
        torch.testing.assert_close(compiled.rows(logits), actor.entropy_rows(logits, chunked=False))
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[0] >= 1 and graphs == [graphs[0]] * 3  # compiled once, at the first call
    padded = torch.randn(3, 11, 300)
    expected = actor.entropy_rows(padded.reshape(-1, 300), chunked=False).view(3, 11)
    torch.testing.assert_close(compiled.positions(padded), expected)


def test_the_update_with_entropy_checkpointed_has_the_same_gradients() -> None:
    sequences, responses = _batch(seed=3)
    mb = actor.micro_batch(sequences, responses, tuple(range(5)), CPU, actor.PACKED)
    grads = []
    for checkpointed in (False, True):
        torch.manual_seed(0)
        model = actor.build_causal_lm(TINY, torch.float32, CPU, False)
        log_probs, entropy = actor.log_probs_and_entropy(model, mb, None, actor.EntropyKernel(), checkpointed)
        (actor.policy_loss(log_probs, mb, torch.ones_like(log_probs)) - 0.01 * entropy.mean()).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    torch.testing.assert_close(grads[0], grads[1])


def test_a_gpu_actor_without_flash_attn_is_an_environment_error(monkeypatch) -> None:
    monkeypatch.setattr(actor, "has_flash_attn", lambda: False)
    with pytest.raises(TrialEnvironmentError, match="flash-attention 2.*install flash-attn"):
        actor.attention_kernel("cuda")
    assert actor.attention_kernel("cpu") == actor.SDPA


def _low_var_kl(log_probs: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    kl = (ref - log_probs).clamp(-20, 20)
    return (torch.exp(kl) - kl - 1).clamp(-10, 10)


def test_the_loss_is_verls_dual_clip_ppo_loss_with_the_kl_to_the_reference() -> None:
    """At the old policy (ratio 1) the PPO term is minus the mean advantage; its gradient
    is verl's (-A per token, dual clip leaving it alone at ratio 1); the KL to the reference
    adds kl_loss_coef times verl's low-variance KL, and verl's metrics are computed."""
    sequences, responses = _batch(seed=4)
    mb = actor.micro_batch(sequences, responses, tuple(range(5)), CPU, actor.PACKED)
    torch.manual_seed(0)
    model = actor.build_causal_lm(TINY, torch.float32, CPU, False)
    log_probs = actor.response_log_probs(model, mb, None)
    advantages = torch.randn(log_probs.shape, generator=torch.Generator().manual_seed(1))
    mask = mb.response_mask
    tokens = mask.sum()
    metrics: dict[str, torch.Tensor] = {}
    plain = actor.policy_loss(log_probs, mb, advantages, metrics=metrics)
    torch.testing.assert_close(plain, -(advantages * mask).sum() / tokens)
    assert set(metrics) == {"pg_loss", "ppo_kl", "pg_clipfrac", "pg_clipfrac_lower"}
    torch.testing.assert_close(metrics["pg_loss"], plain.detach())
    # no drift and nothing clipped at ratio 1
    assert all(float(metrics[k]) == 0.0 for k in ("ppo_kl", "pg_clipfrac", "pg_clipfrac_lower"))
    (grad,) = torch.autograd.grad(plain, log_probs, retain_graph=True)
    torch.testing.assert_close(grad, -advantages * mask / tokens)

    ref = log_probs.detach() + 0.3 * advantages
    metrics = {}
    with_kl = actor.policy_loss(log_probs, mb, advantages, ref, metrics)
    kl = (_low_var_kl(log_probs.detach(), ref) * mask).sum() / tokens
    assert float(kl) > 0
    torch.testing.assert_close(with_kl, plain + actor.KL_LOSS_COEF * kl)
    torch.testing.assert_close(metrics["kl_loss"], kl)


def test_the_optimizer_step_clips_as_verl_and_skips_a_non_finite_step() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    (model(torch.ones(4, 8)) * 100).sum().backward()
    before = [p.detach().clone() for p in model.parameters()]
    grads = [p.grad.clone() for p in model.parameters()]
    norm = torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads]))
    assert float(norm) > actor.CLIP_GRAD
    assert actor.optimizer_step(model, optimizer)
    moved = torch.cat([(b - p.detach()).flatten() for b, p in zip(before, model.parameters(), strict=True)])
    # SGD at lr 1 moves each parameter by its clipped gradient: the step's norm is the clip.
    torch.testing.assert_close(
        torch.linalg.vector_norm(moved), torch.tensor(actor.CLIP_GRAD), rtol=1e-5, atol=1e-6
    )
    assert all(p.grad is None for p in model.parameters())

    (model(torch.full((4, 8), float("inf")))).sum().backward()
    before = [p.detach().clone() for p in model.parameters()]
    assert not actor.optimizer_step(model, optimizer)
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
    assert all(p.grad is None for p in model.parameters())


def test_verls_loss_layout_gives_the_packed_loss_its_gradient_and_its_reads() -> None:
    """The update's loss as verl computes it (log-probs cut back to padded responses, the
    fields padded from nested tensors) equals the packed token-mean loss, value and gradient;
    each sequence's padded row holds its response positions' log-probs."""
    sequences, responses = _batch(seed=5)
    mb = actor.micro_batch(sequences, responses, tuple(range(5)), CPU, actor.PACKED)
    torch.manual_seed(0)
    model = actor.build_causal_lm(TINY, torch.float32, CPU, False)
    log_probs = actor.response_log_probs(model, mb, None)
    rows = actor.responses_padded(log_probs.detach(), mb)
    lengths = [responses[i] for i in range(5)]
    assert rows.shape == (5, max(lengths))
    start = 0
    for row, (seq, n) in enumerate(zip(sequences[:5], lengths, strict=True)):
        end = start + len(seq)
        torch.testing.assert_close(rows[row, :n], log_probs.detach()[end - n - 1 : end - 1])
        assert not rows[row, n:].any()  # padded with zeros past its response
        start = end

    index = mb.response_index
    assert index is not None and len(index) == sum(lengths) == int(mb.response_mask.sum())
    per_token = torch.randn(log_probs.shape, generator=torch.Generator().manual_seed(1))
    advantages = per_token.index_select(0, index)
    ref = log_probs.detach().index_select(0, index) + 0.3 * advantages
    read: dict[str, float] = {}
    verl_loss = actor.verl_policy_loss(log_probs, mb, advantages, ref, read)
    full_ref = log_probs.detach() + 0.3 * per_token
    packed = actor.policy_loss(log_probs, mb, per_token, full_ref)
    torch.testing.assert_close(verl_loss, packed)
    (g_verl,) = torch.autograd.grad(verl_loss, log_probs, retain_graph=True)
    (g_packed,) = torch.autograd.grad(packed, log_probs)
    torch.testing.assert_close(g_verl, g_packed)
    assert list(read) == ["pg_clipfrac", "ppo_kl", "pg_clipfrac_lower", "pg_loss", "kl_loss"]
    assert read["pg_loss"] == pytest.approx(-float(advantages.mean()), rel=1e-5)
