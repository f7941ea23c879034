"""What verl's padded path holds while it trains: the trial's padded update micro-batch
(``trials.actor``, ``use_remove_padding: False``) with its real positions gathered two ways,
on one GPU.

- ``nested``: as verl 0.9.1's ``prepare_model_outputs`` gathers them and as the trial does
  (``trials.actor.real_positions``: ``torch.nested.narrow`` + ``unbind`` + ``cat``);
- ``mask``: a boolean-mask index of the padded logits, as the trial gathered them until
  2026-11-28.

One micro-batch of four sequences (2700, 1800, 900, 600 tokens, the first 300 of each its
prompt) through a two-layer model of Qwen2.5-1.5B's widths and
vocabulary, bf16 autocast over fp32 weights, gradient checkpointing on. For each way: the
memory still allocated after the forward (what the backward will find held) and the peak
through the backward, above what was allocated before; alternated, each way ``--repeats``
times. The log-probabilities use flash-attn's cross-entropy where it imports, else a float32
log-softmax (recorded).

usage (on the GPU host): PYTHONPATH=$PWD python3 -m benchmarks.gpu.padded_gather --out FILE
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch

from trials import actor

QWEN25_15B_WIDTHS = {
    "model_type": "qwen2",
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 2,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
}
LENGTHS = (2700, 1800, 900, 600)
PROMPT = 300
GIB = 2**30


def _masked(padded: torch.Tensor, mb: actor.MicroBatchTensors) -> torch.Tensor:
    assert mb.attention_mask is not None
    return padded[mb.attention_mask.bool()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu.padded_gather")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    model = actor.build_causal_lm(QWEN25_15B_WIDTHS, torch.float32, device, True)
    rng = np.random.default_rng(0)
    sequences = [rng.integers(0, QWEN25_15B_WIDTHS["vocab_size"], size=n) for n in LENGTHS]
    mb = actor.micro_batch(sequences, [n - PROMPT for n in LENGTHS], (0, 1, 2, 3), device, actor.PADDED)
    nested = actor.real_positions
    rows = []
    for repeat in range(args.repeats):
        for way, gather in (("mask", _masked), ("nested", nested)):
            actor.real_positions = gather
            model.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            log_probs = actor.response_log_probs(model, mb, torch.bfloat16)
            held = torch.cuda.memory_allocated() - before
            (log_probs * mb.response_mask).sum().backward()
            peak = torch.cuda.max_memory_allocated() - before
            rows.append(
                {"way": way, "repeat": repeat, "held_after_forward_gib": held / GIB, "peak_gib": peak / GIB}
            )
    actor.real_positions = nested
    padded_logits = len(LENGTHS) * max(LENGTHS) * QWEN25_15B_WIDTHS["vocab_size"] * 2
    doc = {
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "command": "PYTHONPATH=$PWD python3 -m benchmarks.gpu.padded_gather --out FILE",
        "device": torch.cuda.get_device_name(),
        "host": platform.node(),
        "versions": {"torch": torch.__version__},
        "model": QWEN25_15B_WIDTHS,
        "lengths": LENGTHS,
        "padded_logits_gib": padded_logits / GIB,
        "flash_attn_cross_entropy": actor.has_flash_attn(),
        "runs": rows,
    }
    Path(args.out).write_text(json.dumps(doc, indent=1))
    print(f"padded logits {padded_logits / GIB:.2f} GiB")
    print(f"{'way':8} {'held after forward GiB':>24} {'peak GiB':>10}")
    for row in rows:
        print(f"{row['way']:8} {row['held_after_forward_gib']:24.2f} {row['peak_gib']:10.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
