from __future__ import annotations

from trial_helpers import make_spec

from trials.rollout.phase import replica_prompts
from trials.workload import random_sequences, token_id_range


def test_ids_avoid_special_tokens():
    assert token_id_range({"vocab_size": 2048, "bos_token_id": 1, "eos_token_id": 2}) == (3, 2048)
    qwen = {"vocab_size": 152064, "bos_token_id": 151643, "eos_token_id": 151645}
    assert token_id_range(qwen) == (0, 151643)
    llama = {"vocab_size": 128256, "bos_token_id": 128000, "eos_token_id": [128001, 128009]}
    assert token_id_range(llama) == (0, 128000)


def test_sequences_are_seeded_and_in_range(tiny_config):
    a = random_sequences(tiny_config, [5, 300], seed=7)
    b = random_sequences(tiny_config, [5, 300], seed=7)
    assert [len(x) for x in a] == [5, 300]
    assert all((x == y).all() for x, y in zip(a, b, strict=True))
    assert min(int(x.min()) for x in a) >= 3 and max(int(x.max()) for x in a) < 2048


def test_samples_of_one_prompt_share_its_tokens(tiny_config):
    spec = make_spec(
        tiny_config,
        prompt_lengths=[10, 10, 10, 20, 20, 20],
        response_lengths=[5] * 6,
        samples_per_prompt=3,
    )
    prompts = replica_prompts(spec)
    assert prompts[0] == prompts[1] == prompts[2] and prompts[3] == prompts[5]
    assert prompts[0] != prompts[3][:10]
    assert [len(p) for p in prompts] == spec.prompt_lengths
