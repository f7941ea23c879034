"""A model's config.json checked before a job is accepted: what the tuner and verl read from it.

The search space divides by the attention heads, the memory model multiplies the sizes, a
trial builds the model from them: a size that is zero, negative, fractional or a string
would fail deep inside a job (a bare ``ZeroDivisionError``), so it is refused here with the
key, the value and the rule.
"""

from __future__ import annotations

from typing import Any

from autotuner.domains import INT32_MAX

REQUIRED_SIZES = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "vocab_size",
    "intermediate_size",
)
# Read when present (a null is HF's "use the default").
OPTIONAL_SIZES = ("num_key_value_heads", "head_dim", "max_position_embeddings")


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= INT32_MAX


def config_problems(config: dict[str, Any]) -> list[str]:
    """What in ``config`` (a decoder LM's HF config.json) no model can have; empty if none."""
    missing = [k for k in REQUIRED_SIZES if k not in config]
    if missing:
        return [f"it lacks {', '.join(missing)}; give a decoder LM's config.json"]
    out = []
    present = [k for k in OPTIONAL_SIZES if config.get(k) is not None]
    for key in (*REQUIRED_SIZES, *present):
        if not _positive_int(config[key]):
            out.append(f"{key} = {config[key]!r} is not a positive integer (1 to {INT32_MAX})")
    if out:
        return out
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    if heads % kv_heads:
        out.append(
            f"num_attention_heads ({heads}) is not a multiple of num_key_value_heads ({kv_heads}): "
            "each key/value head serves a whole group of query heads"
        )
    if config.get("head_dim") is None and config["hidden_size"] % heads:
        out.append(
            f"hidden_size ({config['hidden_size']}) is not divisible by num_attention_heads ({heads}) "
            "and no head_dim is given"
        )
    tie = config.get("tie_word_embeddings")
    if tie is not None and not isinstance(tie, bool):
        out.append(f"tie_word_embeddings = {tie!r} is not true or false")
    return out
