"""Random token ids for prompts and training sequences, seeded so every trial sees the same.

Ids are drawn uniformly from a range that avoids the special tokens the model config
names (``bos/eos/pad_token_id``): below the lowest special id in the upper half of the
vocabulary (Qwen, Llama keep theirs there) and above the highest one in the lower half
(tiny test models keep theirs at 0-2).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trials.errors import InvalidTrialSpec

SPECIAL_ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")


def token_id_range(model_config: dict[str, Any]) -> tuple[int, int]:
    """``[low, high)`` of the ids safe to sample."""
    vocab = int(model_config.get("vocab_size", 0))
    if vocab < 2:
        raise InvalidTrialSpec(f"model_config.vocab_size must be >= 2, got {vocab}")
    specials: list[int] = []
    for key in SPECIAL_ID_KEYS:
        value = model_config.get(key)
        values = value if isinstance(value, list) else [value]
        specials += [int(v) for v in values if isinstance(v, int) and 0 <= v < vocab]
    low = max([s + 1 for s in specials if s < vocab // 2], default=0)
    high = min([s for s in specials if s >= vocab // 2], default=vocab)
    return low, high


def random_sequences(model_config: dict[str, Any], lengths: list[int], seed: int) -> list[np.ndarray]:
    """One array of ``lengths[i]`` random token ids per entry (int64)."""
    low, high = token_id_range(model_config)
    rng = np.random.default_rng(seed)
    return [rng.integers(low, high, size=n, dtype=np.int64) for n in lengths]
