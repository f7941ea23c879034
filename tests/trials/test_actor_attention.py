"""The actor's attention kernels do not depend on which engine the trial imported."""

from __future__ import annotations

import torch

from trials import actor

TINY = {
    "model_type": "qwen2",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 128,
}


def test_building_the_actor_turns_cudnn_attention_off() -> None:
    """cuDNN's SDPA backend builds a plan per new sequence length (a cold first pass ran 4-6x
    slower on an H200); vLLM's import turns it off and SGLang's does not, so the actor does
    it itself: every engine's trials train on the same kernels."""
    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)  # as a fresh process (or SGLang) has it
        model = actor.build_causal_lm(TINY, torch.float32, torch.device("cpu"), False)
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert model.config._attn_implementation == "sdpa"
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)
