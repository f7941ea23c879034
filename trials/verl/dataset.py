"""The synthetic training set verl reads: one parquet row per prompt, in step order.

Each row is what verl's ``RLHFDataset`` reads from a real set (``prompt`` as chat
messages, ``data_source``, ``reward_model``, ``extra_info``): the prompt's text is
``prompt_length`` random words of the runner's tokenizer (``trials.verl.checkpoint``), so
it is that many tokens, drawn from the ids the model's special tokens leave free
(``trials.workload``). ``extra_info.response_lengths`` holds the ``max_tokens`` of the
prompt's ``n`` samples, which the runner's agent loop (``trials.verl.agent_loop``) asks the
engine for with ``ignore_eos``.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from pathlib import Path
from typing import Any

from trials.errors import InvalidTrialSpec
from trials.verl.checkpoint import token_word
from trials.workload import random_sequences

DATA_SOURCE = "autotuner/synthetic"

# Without a session id (verl's legacy trainer repeats each prompt n times in the batch),
# the samples of a prompt take its lengths in the order they arrive in this process.
_next_sample: defaultdict[int, itertools.count[int]] = defaultdict(itertools.count)


def sample_length(extra_info: dict[str, Any], session_id: int | None) -> int:
    """The ``max_tokens`` of one sample of the prompt whose row's ``extra_info`` this is:
    sample ``session_id`` (verl's v1 trainer runs a prompt's n samples as sessions 0..n-1)."""
    lengths = [int(x) for x in extra_info["response_lengths"]]
    if session_id is None:
        session_id = next(_next_sample[int(extra_info["index"])])
    return lengths[int(session_id) % len(lengths)]


def prompt_text(token_ids: list[int]) -> str:
    return " ".join(token_word(int(i)) for i in token_ids)


def rows(
    model_config: dict[str, Any],
    prompt_lengths: list[int],
    response_lengths: list[list[int]],
    seed: int = 0,
) -> list[dict[str, Any]]:
    """The dataset's rows (see the module docstring)."""
    if len(prompt_lengths) != len(response_lengths):
        raise InvalidTrialSpec(
            f"{len(prompt_lengths)} prompt lengths but {len(response_lengths)} lists of response "
            "lengths; give one list of n response lengths per prompt"
        )
    prompts = random_sequences(model_config, list(prompt_lengths), seed)
    return [
        {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": prompt_text(ids.tolist())}],
            "ability": "synthetic",
            "reward_model": {"style": "rule", "ground_truth": ""},
            "extra_info": {
                "index": i,
                "prompt_length": int(prompt_lengths[i]),
                "response_lengths": [int(x) for x in response_lengths[i]],
            },
        }
        for i, ids in enumerate(prompts)
    ]


def write_dataset(
    path: Path,
    model_config: dict[str, Any],
    prompt_lengths: list[int],
    response_lengths: list[list[int]],
    seed: int = 0,
) -> Path:
    """Write the rows to ``path`` as parquet; returns ``path``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(rows(model_config, prompt_lengths, response_lengths, seed))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return Path(path)
