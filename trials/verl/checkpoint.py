"""The model verl trains: a random-initialised Hugging Face checkpoint and a local tokenizer.

verl's FSDP actor and reference load real weights from ``actor_rollout_ref.model.path``
(the rollout keeps ``load_format: dummy``), and its trainer loads a tokenizer from the same
folder. Throughput depends on the architecture and the lengths, not on the weights, so
the runner writes the weights of the job's ``config.json`` at random once and keeps them
under its cache folder, keyed by the config and dtype. Nothing is downloaded: the
tokenizer is a ``tokenizers`` WordLevel model made here, one word ``<id>`` per token id of
the model's vocabulary, split at spaces, so a prompt of N words is N tokens; its chat
template passes a message's text through unchanged (a prompt's length in tokens is the
length the workload drew). The model's ``bos/eos/pad_token_id`` are its special tokens.
The tokenizer lives in a ``tokenizer/`` subfolder that verl is pointed at
(``actor_rollout_ref.model.tokenizer_path``): beside a ``config.json`` whose model type
names a tokenizer class (``qwen2``: Qwen2Tokenizer, a BPE of its own), transformers'
AutoTokenizer would take that class instead. A copy sits beside the weights too, for the
rollout engine, which loads one from the model's folder and only detokenizes with it.

A folder is written beside its final name and renamed into place, so concurrent runs of
the same model never see half a checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

# A message's text, as it is: the prompt's words are the prompt's tokens.
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
COMPLETE_MARK = ".complete"
# Part of the cache key: a tokenizer written differently gets a new folder.
TOKENIZER_VERSION = 2
# verl's agent loop builds, at start-up, the "continuous token" helper of the model's family
# (``verl/utils/tokenizer/continuous_token_wiring.py``, chosen by config.json's model_type),
# which for Qwen models needs "\n" to be one token: that token id's word is "\n" (Qwen2's
# own id for it), and words are split at spaces only.
NEWLINE_ID = 198


def token_word(token_id: int) -> str:
    """The tokenizer's word for ``token_id``: delimited, so that no special token's word is
    part of another word (the tokenizer matches special tokens anywhere in a text); the
    newline's is itself."""
    return "\n" if token_id == NEWLINE_ID else f"<{token_id}>"


def checkpoint_key(model_config: dict[str, Any], dtype: str) -> str:
    """A short hash naming one architecture in one dtype."""
    text = json.dumps(
        {"config": model_config, "dtype": dtype, "tokenizer": TOKENIZER_VERSION}, sort_keys=True
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def tokenizer_dir(checkpoint: Path) -> Path:
    """Where the tokenizer of ``checkpoint`` is, alone (no ``config.json`` beside it)."""
    return Path(checkpoint) / "tokenizer"


def checkpoint_dir(
    model_config: dict[str, Any], model_name: str, dtype: str, cache_dir: Path, weights: bool = True
) -> Path:
    """Where the checkpoint of ``model_config`` in ``dtype`` is kept under ``cache_dir``
    (``weights=False``: a folder of its config and tokenizer only, for checks of a config)."""
    safe_name = "".join(c if c.isalnum() or c in "-._" else "-" for c in model_name) or "model"
    suffix = "" if weights else "-config-only"
    return Path(cache_dir) / f"{safe_name}-{checkpoint_key(model_config, dtype)}{suffix}"


def ensure_checkpoint(
    model_config: dict[str, Any], model_name: str, dtype: str, cache_dir: Path, weights: bool = True
) -> Path:
    """The folder of the random checkpoint and tokenizer for ``model_config``, written if
    absent (``weights=False``: its ``config.json`` and tokenizer, no weights)."""
    final = checkpoint_dir(model_config, model_name, dtype, cache_dir, weights)
    if (final / COMPLETE_MARK).exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    try:
        if weights:
            write_model(model_config, dtype, staging)
        else:
            write_config(model_config, dtype, staging)
        write_tokenizer(model_config, tokenizer_dir(staging))
        for path in tokenizer_dir(staging).iterdir():
            shutil.copy(path, staging / path.name)
        (staging / COMPLETE_MARK).write_text("")
        try:
            os.rename(staging, final)
        except OSError:  # another run finished first: keep its copy
            if not (final / COMPLETE_MARK).exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


def _hf_config(model_config: dict[str, Any]) -> Any:
    from transformers import AutoConfig

    config_dict = {
        k: v for k, v in model_config.items() if k not in ("_name_or_path", "transformers_version")
    }
    model_type = config_dict.pop("model_type")
    return AutoConfig.for_model(model_type, **config_dict)


def write_config(model_config: dict[str, Any], dtype: str, folder: Path) -> None:
    """``config.json`` alone, as ``save_pretrained`` writes it beside weights."""
    config = _hf_config(model_config)
    config.dtype = dtype
    config.save_pretrained(folder)


def write_model(model_config: dict[str, Any], dtype: str, folder: Path, seed: int = 0) -> None:
    """Random weights for ``model_config`` in ``dtype``, saved as safetensors in ``folder``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config_dict = {
        k: v for k, v in model_config.items() if k not in ("_name_or_path", "transformers_version")
    }
    model_type = config_dict.pop("model_type")
    config = AutoConfig.for_model(model_type, **config_dict)
    torch_dtype = getattr(torch, dtype)
    torch.manual_seed(seed)
    # On a GPU host the initialisation of a 7B model takes seconds there, minutes on the CPU.
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    model.save_pretrained(folder, safe_serialization=True)
    del model
    if device == "cuda":  # this process lives on beside verl: hand the weights' memory back
        torch.cuda.empty_cache()


def _special_ids(model_config: dict[str, Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for name in ("bos", "eos", "pad"):
        value = model_config.get(f"{name}_token_id")
        if isinstance(value, list):
            value = value[0] if value else None
        if isinstance(value, int) and 0 <= value < int(model_config["vocab_size"]):
            out[name] = value
    if "pad" not in out and "eos" in out:
        out["pad"] = out["eos"]
    return out


def write_tokenizer(model_config: dict[str, Any], folder: Path) -> None:
    """A WordLevel tokenizer over the model's whole vocabulary, saved in ``folder``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab_size = int(model_config["vocab_size"])
    specials = _special_ids(model_config)
    unk = specials.get("pad", 0)
    vocab = {token_word(i): i for i in range(vocab_size)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=token_word(unk)))
    core.pre_tokenizer = pre_tokenizers.Split(" ", behavior="removed")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        unk_token=token_word(unk),
        **{f"{name}_token": token_word(i) for name, i in specials.items()},
        model_max_length=int(model_config.get("max_position_embeddings", 32768)),
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    # AutoTokenizer would otherwise take the class the model type names (Qwen2Tokenizer,
    # which rebuilds a BPE vocabulary of its own): name the generic one.
    config_path = folder / "tokenizer_config.json"
    tokenizer_config = json.loads(config_path.read_text())
    tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(tokenizer_config, indent=2))
