"""A micro-batch as verl v0.9's FSDP engine holds it, moved to the device as verl moves it.

verl's default trainer (``trainer.use_v1``) hands its worker a TensorDict whose every
per-sequence tensor is a jagged nested tensor, beside per-sequence Python objects
(``trials.verl.cut``: ``ENTRIES`` for the old-log-prob pass, ``REF_ENTRIES`` more for the
reference's, ``UPDATE_ENTRIES`` more for the update; ``FIELDS``). Its cut into micro-batches
keeps that layout, and ``FSDPEngineWithLMHead.forward_step``
(``workers/engine/fsdp/transformer_impl.py``) starts every micro-batch with
``micro_batch.to(device)``, every field, the unused ones too, then takes the packed ids and
positions from the nested tensors and rolls the ids on the device for the labels
(``prepare_model_inputs``). With ``use_remove_padding: False`` the same TensorDict arrives and
``prepare_model_inputs`` pads it there: the micro-batch's longest read to the host, the ids
and positions padded to it (``torch.nested.to_padded_tensor``), the attention mask built
from the nested offsets (``build_attention_mask_from_nested``).

A trial does the same host work in each micro-batch, in either layout: ``stage`` builds a
micro-batch's TensorDict on the host, before its pass is timed (in verl the cut builds it,
and the trial counts verl's cut apart, ``trials.verl.cut``); ``to_device`` moves it whole and
takes the model's inputs from what arrived, on the device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from trials.actor import PACKED, PADDED, MicroBatchTensors
from trials.errors import TrialEnvironmentError
from trials.verl.cut import ENTRIES, REF_ENTRIES, UPDATE_ENTRIES, sequence_fields

# The per-sequence entries of each pass's batch, as verl's worker holds them.
PASS_ENTRIES = {
    "old_log_prob": ENTRIES,
    "ref_log_prob": ENTRIES + REF_ENTRIES,
    "update_actor": ENTRIES + REF_ENTRIES + UPDATE_ENTRIES,
}
TENSORDICT_FIX = (
    "install tensordict 0.10 beside the trial (the worker extra in pyproject.toml; on the GPU "
    "host the control bundle, benchmarks/gpu/control-min.txt)"
)


def tensordict_module() -> Any:
    """The ``tensordict`` package, or an environment error naming the fix."""
    try:
        import tensordict
    except ImportError as exc:
        raise TrialEnvironmentError(
            f"verl's FSDP engine holds each micro-batch as a TensorDict, and tensordict is not "
            f"importable in this trial's environment ({exc}); {TENSORDICT_FIX}"
        ) from exc
    return tensordict


@dataclass
class StagedMicroBatch:
    """One micro-batch on the host, with what the host knows of its shape: its tokens and the
    packed positions predicting a response token (the trial's loss needs them; verl finds its
    own from the same offsets inside its loss)."""

    td: Any  # tensordict.TensorDict, batch size (sequences,)
    real_tokens: int
    longest_response: int
    response_index: torch.Tensor  # (R,) int64, on the host


def stage(
    sequences: list[np.ndarray], response_lengths: list[int], indices: tuple[int, ...], phase: str
) -> StagedMicroBatch:
    """The sequences ``indices`` as a micro-batch of ``phase``'s batch in verl's worker: each
    entry of ``PASS_ENTRIES[phase]`` a jagged nested tensor of the dtype verl's agent loop
    gives it (ids and masks int64, scores and log-probs float32, a one-byte placeholder), the
    per-sequence objects of ``FIELDS`` beside them."""
    td_mod = tensordict_module()
    ids = [torch.from_numpy(np.asarray(sequences[i], dtype=np.int64)) for i in indices]
    responses = [response_lengths[i] for i in indices]
    prompts = [len(s) - r for s, r in zip(ids, responses, strict=True)]
    per_sequence: dict[str, list[torch.Tensor]] = {
        "input_ids": ids,
        "position_ids": [torch.arange(len(s)) for s in ids],
        "prompts": [s[:p] for s, p in zip(ids, prompts, strict=True)],
        "responses": [s[p:] for s, p in zip(ids, prompts, strict=True)],
        "response_mask": [torch.ones(r, dtype=torch.int64) for r in responses],
        "loss_mask": [torch.ones(r, dtype=torch.int64) for r in responses],
        "rm_scores": [torch.zeros(r) for r in responses],
        "rollout_log_probs": [torch.zeros(r) for r in responses],
        "dummy_tensor": [torch.zeros(1, dtype=torch.uint8) for _ in responses],
    }
    for name in REF_ENTRIES + UPDATE_ENTRIES:
        per_sequence[name] = [torch.zeros(r) for r in responses]
    fields: dict[str, Any] = {
        name: torch.nested.as_nested_tensor(per_sequence[name], layout=torch.jagged)
        for name in PASS_ENTRIES[phase]
    }
    rows = [sequence_fields(i) for i in indices]
    for name in rows[0]:
        fields[name] = td_mod.NonTensorStack(*[row[name] for row in rows])
    ends = np.cumsum([len(s) for s in ids])
    response_index = np.concatenate(
        [np.arange(end - r - 1, end - 1) for end, r in zip(ends, responses, strict=True)]
    )
    return StagedMicroBatch(
        td=td_mod.TensorDict(fields, batch_size=[len(indices)]),
        real_tokens=int(ends[-1]),
        longest_response=max(responses),
        response_index=torch.from_numpy(response_index.astype(np.int64)),
    )


def to_device(staged: StagedMicroBatch, device: torch.device, layout: str = PACKED) -> MicroBatchTensors:
    """``staged`` moved to ``device`` whole (``TensorDict.to``, as verl's ``forward_step``
    begins: every nested field and every per-sequence object), then the model's inputs
    prepared as verl's ``prepare_model_inputs`` prepares them for ``layout``. Packed: the
    sampling temperature spread over the row, the row's ids and positions taken from the
    nested tensors. Padded: the longest sequence read to the host, the ids and positions
    padded to it, the attention mask built from the offsets. Either way the ids rolled by one
    for each position's next token, and the positions predicting a response token, in the
    order of the real tokens, come along (the padded path's logits are gathered back into
    that order, ``trials.actor.scaled_logits``)."""
    td = staged.td.to(device)
    nested_ids = td["input_ids"]
    ids = nested_ids.values()
    offsets = nested_ids.offsets()
    # verl's per-sequence sampling temperature (``prepare_model_inputs``): a host list copied
    # to the device; on the packed path spread over the row (``expand_as_nested``, a
    # ``repeat_interleave`` whose output size the host waits for). The trials' rollout samples
    # at verl's default, the scalar 1.0, at which verl 0.9.1 leaves the logits undivided
    # (``unit_temperature``; ``trials.actor.scaled_logits``).
    temperature = torch.tensor([1.0] * staged.td.batch_size[0], device=device).to(torch.float32)
    if layout == PADDED:
        sequences = staged.td.batch_size[0]
        longest = int(offsets.diff().max().item())
        input_ids = torch.nested.to_padded_tensor(nested_ids, padding=0, output_size=(sequences, longest))
        position_ids = torch.nested.to_padded_tensor(
            td["position_ids"], padding=0, output_size=(sequences, longest)
        )
        lengths = offsets.diff()
        attention_mask = (torch.arange(longest, device=device).unsqueeze(0) < lengths.unsqueeze(1)).to(
            torch.int32
        )
        scale = temperature.view(-1, 1, 1)
    else:
        lengths = None
        spread = torch.nested.nested_tensor_from_jagged(
            torch.repeat_interleave(temperature, offsets.diff(), dim=0), offsets
        )
        scale = spread.values().unsqueeze(-1)
        input_ids, position_ids, attention_mask = (
            ids.unsqueeze(0),
            td["position_ids"].values().unsqueeze(0),
            None,
        )
    response_index = staged.response_index.to(device)
    response_mask = torch.zeros(staged.real_tokens, device=device).index_fill_(0, response_index, 1.0)
    return MicroBatchTensors(
        layout=layout,
        input_ids=input_ids,
        position_ids=position_ids,
        attention_mask=attention_mask,
        labels=torch.roll(ids, shifts=-1, dims=0),
        response_mask=response_mask,
        real_tokens=staged.real_tokens,
        prompt_offsets=td["prompts"].offsets(),
        response_offsets=td["responses"].offsets(),
        response_index=response_index,
        longest_response=staged.longest_response,
        temperature=scale,
        unit_temperature=True,
        row_lengths=lengths,
    )


def staged_plan(
    sequences: list[np.ndarray], response_lengths: list[int], plan: list[Any], phase: str
) -> dict[tuple[int, ...], StagedMicroBatch]:
    """Every micro-batch of ``plan`` (``trials.batching.MicroBatch``) staged for ``phase``."""
    return {tuple(mb.indices): stage(sequences, response_lengths, tuple(mb.indices), phase) for mb in plan}
