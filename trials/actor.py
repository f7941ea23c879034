"""The actor's model and the tensors of one micro-batch, as verl v0.9's FSDP engine sees them.

The model is built from ``model_config`` with random weights and runs its forward under
autocast in the trial's dtype. How it is held (FSDP2 sharding, fp32 master weights,
AdamW state, offload) is ``trials.actor_state``'s business; the trial runs one
data-parallel rank on its share of the sequences.

A micro-batch is laid out as verl v0.9.0's ``verl/workers/engine/fsdp/transformer_impl.py``
(``prepare_model_inputs`` / ``prepare_model_outputs``) lays it out:

- ``use_remove_padding=True`` (verl's default, ``PACKED``): the micro-batch's sequences
  are packed into one row of ``T`` real tokens, position ids restarting at each sequence,
  no attention mask. transformers reads the sequence boundaries from the position ids:
  flash-attention 2's varlen kernel on a GPU, SDPA with a block-diagonal causal mask on
  the CPU. The logits of all ``T`` positions are materialised, ``(T, vocab)``.
- ``use_remove_padding=False`` (``PADDED``): each sequence is one row, right-padded to
  the micro-batch's longest (verl's no-padding batches turned into a padded tensor), with
  an attention mask. The logits of all ``B x L`` positions are materialised, then the real
  positions' rows are gathered, ``(T, vocab)``, with verl's ``narrow`` + ``cat``
  (``real_positions``), whose autograd keeps the padded logits until the backward.

Either way the log-probability of each position's next token is computed over all ``T``
rows (verl rolls the packed ids by one), with flash-attn's Triton cross-entropy where
verl would use it (flash-attn importable on a GPU), else a float32 log-softmax; the
response positions are kept for the loss. The old-log-prob forward also computes the
entropy of every row (verl's ``calculate_entropy=True`` there) the way verl's engine does
(``EntropyKernel``): on packed rows through ``torch.compile`` (its
``use_torch_compile``), chunked with ``entropy_from_logits_with_chunking``; on padded rows
eagerly over every position.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from trials.errors import TrialEnvironmentError
from trials.types import ENTROPY_CHUNK_ROWS

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# verl v0.9.0's actor defaults (trainer/config/actor/actor.yaml, optim/fsdp.yaml): the PPO
# clip range, dual-clip's lower bound, the KL loss's coefficient and the gradient clip.
PPO_CLIP = 0.2
PPO_CLIP_C = 3.0
KL_LOSS_COEF = 0.001
CLIP_GRAD = 1.0
PACKED = "packed"
PADDED = "padded"
FLASH_ATTENTION = "flash_attention_2"
SDPA = "sdpa"
# Where the flash-attn wheel for the GPU host is and how to install it.
FLASH_ATTN_FIX = (
    "install flash-attn (2.8.3.post2 for torch 2.11 / CUDA 13 / sm_90 is built once per host: "
    "benchmarks/gpu/README.md) and put it on the trial's PYTHONPATH"
)


def torch_dtype(name: str) -> torch.dtype:
    return TORCH_DTYPES[name]


def layout_of(use_remove_padding: bool) -> str:
    return PACKED if use_remove_padding else PADDED


def has_flash_attn() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def attention_kernel(device_type: str) -> str:
    """The attention implementation verl's actor runs on ``device_type``.

    verl v0.9 builds its actor with ``attn_implementation="flash_attention_2"``
    (``verl/workers/config/model.py``) in both layouts. On a GPU the trial does the same
    and refuses to measure another kernel when flash-attn is missing; on the CPU it runs
    SDPA (flash-attn has no CPU kernel), which computes the same function.
    """
    if device_type != "cuda":
        return SDPA
    if not has_flash_attn():
        raise TrialEnvironmentError(
            "verl's actor computes attention with flash-attention 2, which is not importable "
            f"in this trial's environment; {FLASH_ATTN_FIX}"
        )
    return FLASH_ATTENTION


def without_cudnn_attention() -> None:
    """Turn PyTorch's cuDNN attention backend off, process-wide (set once, before a model
    runs; a flag, so gradient checkpointing's recomputation in the backward sees it too).

    Where a trial's attention runs through SDPA, PyTorch on Hopper prefers cuDNN's fused
    attention, which builds an execution plan for every new sequence length: over a batch
    of varied lengths the first pass ran 4-6x slower than the next on an H200
    (``benchmarks/gpu/engine_train_probe.py``). Importing vLLM turns that backend off,
    SGLang leaves it on; off here, every trial runs the same kernels whatever its engine.
    """
    torch.backends.cuda.enable_cudnn_sdp(False)


def build_causal_lm(
    model_config: dict[str, Any],
    dtype: torch.dtype,
    device: torch.device,
    gradient_checkpointing: bool,
    attn_implementation: str = SDPA,
) -> torch.nn.Module:
    """A randomly initialised causal LM for ``model_config`` (an HF config.json dict)."""
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = {k: v for k, v in model_config.items() if k not in ("torch_dtype", "dtype", "auto_map")}
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    config.use_cache = False
    without_cudnn_attention()
    dtype_kw = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(
            config, attn_implementation=attn_implementation, **{dtype_kw: dtype}
        )
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


@dataclass
class MicroBatchTensors:
    """One micro-batch's model inputs and the per-row targets over its ``T`` real tokens."""

    layout: str
    input_ids: torch.Tensor  # PACKED: (1, T); PADDED: (B, L), right-padded
    position_ids: torch.Tensor  # same shape; restarting at 0 for each sequence
    attention_mask: torch.Tensor | None  # PADDED only: (B, L)
    labels: torch.Tensor  # (T,): each real position's next token (rolled, as verl rolls)
    response_mask: torch.Tensor  # (T,) float: 1 where the next token is a response token
    real_tokens: int  # T
    # PACKED only, as verl's worker holds them on the device: the offsets of the micro-batch's
    # prompts and responses (its nested ``prompts``/``responses``, (B + 1,)) and the positions
    # predicting a response token in response order ((R,), R the response tokens).
    prompt_offsets: torch.Tensor | None = None
    response_offsets: torch.Tensor | None = None
    response_index: torch.Tensor | None = None
    longest_response: int = 0  # the nested responses' cached longest (verl's fields carry it)
    # PADDED only: each row's real tokens, (B,), on the device (verl's ``cu_seqlens.diff()``).
    row_lengths: torch.Tensor | None = None
    # verl's sampling temperature, shaped to divide the logits as its ``prepare_model_outputs``
    # does (packed: each real position's, (T, 1); padded: each row's, (B, 1, 1)); None: the
    # logits are used as the model gives them.
    temperature: torch.Tensor | None = None
    # The micro-batch's temperature is the scalar 1.0 (verl's default, a host number in its
    # micro-batch): verl 0.9.1 then keeps the model's logits rather than dividing them into a
    # new tensor (``_scale_logits_by_temperature``), though it builds the tensor above.
    unit_temperature: bool = False

    @property
    def padded_tokens(self) -> int:
        """Positions the model computes (T packed; B x L padded)."""
        return int(self.input_ids.numel())


def micro_batch(
    sequences: list[np.ndarray],
    response_lengths: list[int],
    indices: tuple[int, ...],
    device: torch.device,
    layout: str = PACKED,
) -> MicroBatchTensors:
    """Tensors for the sequences ``indices`` (each ``sequences[i]`` is prompt + response ids)."""
    seqs = [np.asarray(sequences[i], dtype=np.int64) for i in indices]
    lengths = [len(s) for s in seqs]
    flat = np.concatenate(seqs)
    positions = np.concatenate([np.arange(n, dtype=np.int64) for n in lengths])
    labels = np.roll(flat, -1)
    response_mask = np.zeros(len(flat), dtype=np.float32)
    start = 0
    for n, i in zip(lengths, indices, strict=True):
        prompt = n - response_lengths[i]
        response_mask[start + prompt - 1 : start + n - 1] = 1.0  # positions predicting the response
        start += n
    labels_t = torch.from_numpy(labels).to(device)
    response_t = torch.from_numpy(response_mask).to(device)
    if layout == PACKED:
        responses = [response_lengths[i] for i in indices]
        prompts = [n - r for n, r in zip(lengths, responses, strict=True)]
        return MicroBatchTensors(
            input_ids=torch.from_numpy(flat).to(device).unsqueeze(0),
            position_ids=torch.from_numpy(positions).to(device).unsqueeze(0),
            attention_mask=None,
            layout=layout,
            labels=labels_t,
            response_mask=response_t,
            real_tokens=len(flat),
            prompt_offsets=torch.tensor(np.cumsum([0, *prompts]), device=device),
            response_offsets=torch.tensor(np.cumsum([0, *responses]), device=device),
            response_index=torch.from_numpy(np.flatnonzero(response_mask)).to(device),
            longest_response=max(responses),
        )
    width = max(lengths)
    ids = np.zeros((len(seqs), width), dtype=np.int64)
    mask = np.zeros((len(seqs), width), dtype=np.int64)
    pos = np.zeros((len(seqs), width), dtype=np.int64)
    for row, s in enumerate(seqs):
        ids[row, : len(s)] = s
        mask[row, : len(s)] = 1
        pos[row, : len(s)] = np.arange(len(s))
    return MicroBatchTensors(
        input_ids=torch.from_numpy(ids).to(device),
        position_ids=torch.from_numpy(pos).to(device),
        attention_mask=torch.from_numpy(mask).to(device),
        layout=layout,
        labels=labels_t,
        response_mask=response_t,
        real_tokens=len(flat),
        row_lengths=torch.tensor(lengths, device=device),
    )


def _autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager[Any]:
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()


def scaled_logits(
    model: torch.nn.Module, mb: MicroBatchTensors, autocast: torch.dtype | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's logits as verl's ``prepare_model_outputs`` holds them: divided by the
    sampling temperature into a new tensor where the micro-batch carries one other than the
    scalar 1.0 (verl 0.9.1's ``_scale_logits_by_temperature``), whole (packed
    ``(T, vocab)``, padded ``(B, L, vocab)``), and the rows of the micro-batch's ``T`` real
    positions, ``(T, vocab)``, in their order."""
    with _autocast(mb.input_ids.device, autocast):
        out = model(
            input_ids=mb.input_ids,
            attention_mask=mb.attention_mask,
            position_ids=mb.position_ids,
            use_cache=False,
        )
    logits = out.logits
    if mb.attention_mask is None:
        logits = logits.squeeze(0)
    if mb.temperature is not None and not mb.unit_temperature:
        logits = logits / mb.temperature.clamp(min=1e-8).to(logits.dtype)
    if mb.attention_mask is None:
        return logits, logits
    return logits, real_positions(logits, mb)


def real_positions(padded: torch.Tensor, mb: MicroBatchTensors) -> torch.Tensor:
    """The real positions of padded rows ``(B, L, ...)`` in order, ``(T, ...)``, gathered as
    verl 0.9.1's padded path gathers them: a jagged view of the rows narrowed to their lengths
    (``torch.nested.narrow``), unbound and concatenated. Its autograd keeps that view, so the
    whole padded tensor lives until the backward reaches it: on the update's logits that is
    one ``(B, L, vocab)`` tensor beside its gradient at the backward's peak."""
    assert mb.row_lengths is not None
    lengths = mb.row_lengths
    rows = torch.nested.narrow(padded, 1, torch.zeros_like(lengths), lengths, layout=torch.jagged)
    return torch.cat(rows.unbind())


def logits_rows(model: torch.nn.Module, mb: MicroBatchTensors, autocast: torch.dtype | None) -> torch.Tensor:
    """The logits of the micro-batch's ``T`` real positions, ``(T, vocab)`` (``scaled_logits``)."""
    return scaled_logits(model, mb, autocast)[1]


@dataclass(frozen=True)
class EntropyKernel:
    """How verl 0.9.1's FSDP engine computes the entropy of a pass's logits
    (``workers/engine/fsdp/transformer_impl.py``). On packed rows it calls
    ``entropy_from_logits`` (``chunked``: ``entropy_from_logits_with_chunking``) through
    ``torch.compile(..., dynamic=True)`` where the engine's ``use_torch_compile`` is on (its
    default): ``compiled``, which fuses the softmax into its reductions, so no
    positions-by-vocab temporary is held beside the logits. On padded rows it calls the
    eager, unchunked ``entropy_from_logits`` over every position whatever the two settings
    say.

    The trial compiles where verl's compile pays on a GPU: unchunked rows. The chunked
    function loops over the rows in Python, so torch.compile specialises it on each
    micro-batch's row count and, past its recompile limit, runs it eagerly: the trial runs
    it eagerly. A CPU trial runs it eagerly too (the same values; compiling there takes
    longer than the trials of the tests do)."""

    chunked: bool = False
    compiled: bool = False

    @classmethod
    def for_config(
        cls, device_type: str, use_torch_compile: bool, chunked: bool, packed: bool = True
    ) -> EntropyKernel:
        """The kernel of a config's passes: compiled only for packed rows (``packed``)."""
        compiled = use_torch_compile and packed and not chunked and device_type == "cuda"
        return cls(chunked=chunked, compiled=compiled)

    def rows(self, logits: torch.Tensor) -> torch.Tensor:
        """Each packed row's entropy, ``(T,)``."""
        if self.compiled:
            return compiled_entropy()(logits)
        return entropy_rows(logits, self.chunked)

    def positions(self, logits: torch.Tensor) -> torch.Tensor:
        """Each position's entropy over padded rows ``(B, L, vocab)``, ``(B, L)``: eager,
        unchunked."""
        return entropy_rows(logits.reshape(-1, logits.shape[-1]), chunked=False).view(logits.shape[:-1])


def _entropy_unchunked(logits: torch.Tensor) -> torch.Tensor:
    return entropy_rows(logits, chunked=False)


@functools.cache
def compiled_entropy() -> Any:
    """``entropy_rows`` unchunked through ``torch.compile(dynamic=True)``, as verl's engine
    compiles ``entropy_from_logits`` once per process; one compilation serves every row count."""
    return torch.compile(_entropy_unchunked, dynamic=True)


def _entropy(
    whole: torch.Tensor, rows: torch.Tensor, mb: MicroBatchTensors, kernel: EntropyKernel
) -> torch.Tensor:
    """Each real position's entropy, ``(T,)``, computed as verl computes it: on packed rows
    over the rows; on padded rows over every position, padding included, then the real ones
    kept."""
    if mb.attention_mask is None:
        return kernel.rows(rows)
    return real_positions(kernel.positions(whole), mb)


def token_log_probs(
    logits: torch.Tensor, labels: torch.Tensor, inplace_backward: bool = True
) -> torch.Tensor:
    """``log p(labels[t])`` per row of ``logits`` (float32, ``(T,)``), as verl's
    ``logprobs_from_logits`` computes it: flash-attn's Triton cross-entropy on a GPU that
    has it, else a float32 log-softmax."""
    if logits.is_cuda and has_flash_attn():
        from flash_attn.ops.triton.cross_entropy import cross_entropy_loss

        losses, _ = cross_entropy_loss(logits, labels, inplace_backward=inplace_backward)
        return -losses
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def entropy_rows(logits: torch.Tensor, chunked: bool) -> torch.Tensor:
    """The entropy of each row's distribution, ``logsumexp(z) - sum(softmax(z) * z)``;
    ``chunked``: ``ENTROPY_CHUNK_ROWS`` rows at a time in float32 (less transient memory)."""
    if not chunked:
        probs = torch.softmax(logits, dim=-1)
        return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)
    out = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
    for start in range(0, logits.shape[0], ENTROPY_CHUNK_ROWS):
        chunk = logits[start : start + ENTROPY_CHUNK_ROWS].float()
        probs = torch.softmax(chunk, dim=-1)
        out[start : start + ENTROPY_CHUNK_ROWS] = torch.logsumexp(chunk, dim=-1) - (probs * chunk).sum(dim=-1)
    return out


def response_log_probs(
    model: torch.nn.Module,
    mb: MicroBatchTensors,
    autocast: torch.dtype | None,
    entropy: EntropyKernel | None = None,
) -> torch.Tensor:
    """Log-probabilities (float32, ``(T,)``) of each position's next token under ``model``;
    the loss keeps the response positions (``mb.response_mask``). ``entropy``: also compute
    every row's entropy as the old-log-prob forward does, with that kernel."""
    whole, logits = scaled_logits(model, mb, autocast)
    if entropy is not None:
        with torch.no_grad():
            _entropy(whole, logits, mb, entropy)
    return token_log_probs(logits, mb.labels, inplace_backward=torch.is_grad_enabled())


def log_probs_and_entropy(
    model: torch.nn.Module,
    mb: MicroBatchTensors,
    autocast: torch.dtype | None,
    kernel: EntropyKernel,
    checkpointed: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The update's log-probabilities and per-row entropy with gradients (verl computes
    entropy in the update when ``entropy_coeff`` is set), with ``kernel``; ``checkpointed``:
    the entropy is recomputed in the backward instead of keeping its intermediates
    (``entropy_checkpointing``)."""
    whole, logits = scaled_logits(model, mb, autocast)
    if checkpointed:
        from torch.utils.checkpoint import checkpoint

        entropy = checkpoint(_entropy, whole, logits, mb, kernel, use_reentrant=False)
    else:
        entropy = _entropy(whole, logits, mb, kernel)
    return token_log_probs(logits, mb.labels, inplace_backward=False), entropy


def policy_loss(
    log_probs: torch.Tensor,
    mb: MicroBatchTensors,
    advantages: torch.Tensor,
    ref_log_probs: torch.Tensor | None = None,
    metrics: dict[str, torch.Tensor] | None = None,
) -> torch.Tensor:
    """verl v0.9's actor loss (``workers/utils/losses.ppo_loss``), token-mean over the response
    positions, old log-probs = detached current: the vanilla PPO loss with dual clip
    (``core_algos.compute_policy_loss_vanilla``), its approximate KL and clip fractions
    computed as verl computes them for its metrics every micro-batch (into ``metrics``
    when given, with the PPO term as ``pg_loss``); with ``ref_log_probs``
    (``use_kl_loss``) plus ``KL_LOSS_COEF`` times the low-variance KL to the reference
    (``kl_penalty`` ``low_var_kl``)."""
    mask = mb.response_mask
    tokens = mask.sum().clamp(min=1.0)

    def token_mean(values: torch.Tensor) -> torch.Tensor:
        return (values * mask).sum() / tokens

    negative_approx_kl = torch.clamp(log_probs - log_probs.detach(), min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    losses1 = -advantages * ratio
    losses2 = -advantages * ratio.clamp(1 - PPO_CLIP, 1 + PPO_CLIP)
    clipped = torch.maximum(losses1, losses2)
    losses3 = -advantages * PPO_CLIP_C
    losses = torch.where(advantages < 0, torch.minimum(losses3, clipped), clipped)
    loss = token_mean(losses)
    with torch.no_grad():
        computed = {
            "pg_loss": loss.detach(),
            "ppo_kl": token_mean(-negative_approx_kl),
            "pg_clipfrac": token_mean(torch.gt(losses2, losses1).float()),
            "pg_clipfrac_lower": token_mean(torch.gt(clipped, losses3).float() * (advantages < 0).float()),
        }
    if ref_log_probs is not None:
        kl = torch.clamp(ref_log_probs - log_probs, min=-20.0, max=20.0)
        kl_loss = token_mean(torch.clamp(torch.exp(kl) - kl - 1, min=-10.0, max=10.0))
        loss = loss + KL_LOSS_COEF * kl_loss
        computed["kl_loss"] = kl_loss.detach()
    if metrics is not None:
        metrics.update(computed)
    return loss


def responses_padded(values: torch.Tensor, mb: MicroBatchTensors) -> torch.Tensor:
    """A packed micro-batch's per-position ``values`` ``(T,)`` as verl v0.9's update loss takes
    them (``workers/utils/padding.py``, ``no_padding_2_padding``): each sequence's positions
    predicting its response, padded to the longest response, ``(B, longest)``. Done as verl
    does it, host work included: the longest read to the host (the host waits for the
    forward), two checks read, then a loop over the sequences slicing with device scalars."""
    assert mb.prompt_offsets is not None and mb.response_offsets is not None
    prompt_lens = mb.prompt_offsets.diff()
    response_lens = mb.response_offsets.diff()
    longest = response_lens.max().item()
    ends = (prompt_lens + response_lens).cumsum(dim=0)
    if ends[-1].item() != values.shape[0] or prompt_lens.eq(0).any():
        raise ValueError("the micro-batch's offsets do not cover its positions, or a prompt is empty")
    rows = [
        torch.nn.functional.pad(values[end - n - 1 : end - 1], (0, longest - n))
        for n, end in zip(response_lens, ends, strict=True)
    ]
    return torch.stack(rows, dim=0)


def verl_policy_loss(
    log_probs: torch.Tensor,
    mb: MicroBatchTensors,
    advantages: torch.Tensor,
    ref_log_probs: torch.Tensor | None,
    read: dict[str, float],
) -> torch.Tensor:
    """``policy_loss`` on a packed micro-batch in verl v0.9's layout and order
    (``workers/utils/losses.py``, ``ppo_loss``): the log-probs cut back to padded responses
    (``responses_padded``); the loss's fields, each a nested tensor over the responses
    (``advantages`` and ``ref_log_probs`` ``(R,)``, in response order), padded as verl's
    ``to_padded_tensor`` pads them; the vanilla loss on the padded tensors
    (``trainer/ppo/core_algos.py``, ``compute_policy_loss_vanilla``), its three metrics and
    the policy loss read to the host as verl reads them, then the KL loss and its read.
    The figures read land in ``read``; the loss's own read is the caller's, as in verl."""
    assert mb.response_offsets is not None and mb.response_index is not None
    log_prob = responses_padded(log_probs, mb)
    fields = {
        "response_mask": torch.ones_like(advantages),
        "old_log_probs": log_probs.detach().index_select(0, mb.response_index),
        "advantages": advantages,
    }
    if ref_log_probs is not None:
        fields["ref_log_prob"] = ref_log_probs
    data = {
        name: torch.nested.nested_tensor_from_jagged(
            values, mb.response_offsets, max_seqlen=mb.longest_response
        ).to_padded_tensor(0.0)
        for name, values in fields.items()
    }
    mask = data["response_mask"].to(torch.bool)
    tokens = mask.sum().clamp(min=1)

    def token_mean(values: torch.Tensor) -> torch.Tensor:
        return torch.where(mask, values, 0.0).sum() / tokens

    adv = data["advantages"]
    negative_approx_kl = torch.clamp(log_prob - data["old_log_probs"], min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    ppo_kl = token_mean(-negative_approx_kl)
    losses1 = -adv * ratio
    losses2 = -adv * ratio.clamp(1 - PPO_CLIP, 1 + PPO_CLIP)
    clipped = torch.maximum(losses1, losses2)
    pg_clipfrac = token_mean(torch.gt(losses2, losses1).float())
    losses3 = -adv * PPO_CLIP_C
    pg_clipfrac_lower = token_mean(torch.gt(clipped, losses3).float() * (adv < 0).float())
    loss = token_mean(torch.where(adv < 0, torch.minimum(losses3, clipped), clipped))
    read.update(
        read_to_host({"pg_clipfrac": pg_clipfrac, "ppo_kl": ppo_kl, "pg_clipfrac_lower": pg_clipfrac_lower})
    )
    read.update(read_to_host({"pg_loss": loss}))
    if "ref_log_prob" in data:
        kl = torch.clamp(data["ref_log_prob"] - log_prob, min=-20.0, max=20.0)
        kl_loss = token_mean(torch.clamp(torch.exp(kl) - kl - 1, min=-10.0, max=10.0))
        loss = loss + KL_LOSS_COEF * kl_loss
        read.update(read_to_host({"kl_loss": kl_loss}))
    return loss


def read_to_host(values: dict[str, torch.Tensor]) -> dict[str, float]:
    """Each scalar read to the host (``.item()``: the host waits for the device's queue), as
    verl v0.9's FSDP engine reads every micro-batch's loss and loss metrics before it goes on
    (``workers/engine/fsdp/transformer_impl.py`` ``forward_step``: ``loss.detach().item()``,
    a placeholder loss in the forward-only passes; ``trainer/ppo/core_algos.py`` and
    ``utils/metric/utils.py``: the policy loss's metrics, before the backward)."""
    return {name: value.detach().item() for name, value in values.items()}


def optimizer_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, max_norm: float = CLIP_GRAD
) -> bool:
    """verl v0.9's FSDP engine's ``optimizer_step``: the gradients clipped to ``max_norm``
    (their global norm, a collective over the actor's ranks: FSDP1's own
    ``clip_grad_norm_``, else torch's over the sharded gradients), the step skipped when the
    norm is not finite (a check on the host, as verl's is), the gradients cleared. Whether
    it stepped."""
    own = getattr(model, "clip_grad_norm_", None)
    clip = own if callable(own) else functools.partial(torch.nn.utils.clip_grad_norm_, model.parameters())
    norm = clip(max_norm)
    full = getattr(norm, "full_tensor", None)
    if callable(full):
        norm = full()
    finite = bool(torch.isfinite(norm))
    if finite:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return finite


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                state[key] = value.to(device, non_blocking=True)
