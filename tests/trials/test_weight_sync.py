"""The actor -> engine weight sync: the real vLLM engine on CPU with the tiny model, the
SGLang backend over its stand-in, and a GPU run of both ends.

The vLLM engine's weights are read back from its worker with ``collective_rpc`` (a
function sent by cloudpickle, hence ``VLLM_ALLOW_INSECURE_SERIALIZATION`` for this engine
only): they differ from the actor's before the sync and equal them after.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch
from trial_helpers import make_spec, with_engine

from trials.actor import build_causal_lm
from trials.rollout import get_backend
from trials.rollout.weight_sync import MIB, actor_weights, model_weights, sync_weights

CPU = torch.device("cpu")
# What each engine's parameter is made of, in the actor's (Hugging Face) names. On CPU,
# vLLM packs linear weights into oneDNN handles and empties their parameters: only the
# first three can be read back there.
ENGINE_PARAMS = {
    "model.embed_tokens.weight": ["model.embed_tokens.weight"],
    "model.norm.weight": ["model.norm.weight"],
    "model.layers.1.post_attention_layernorm.weight": ["model.layers.1.post_attention_layernorm.weight"],
    "model.layers.1.mlp.down_proj.weight": ["model.layers.1.mlp.down_proj.weight"],
    "model.layers.0.self_attn.qkv_proj.weight": [
        f"model.layers.0.self_attn.{p}_proj.weight" for p in ("q", "k", "v")
    ],
}
READABLE_ON_CPU = list(ENGINE_PARAMS)[:3]


def _read_engine_params(worker) -> dict:
    params = dict(worker.model_runner.get_model().named_parameters())
    return {name: params[name].detach().float().cpu().clone() for name in ENGINE_PARAMS if name in params}


@pytest.fixture(scope="module")
def vllm_engine(tiny_config) -> Iterator:
    saved = os.environ.get("VLLM_ALLOW_INSECURE_SERIALIZATION")
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # the read-back only
    backend = get_backend("vllm")
    try:
        backend.start(make_spec(tiny_config, phases=["rollout"]), "float32")
        yield backend
    finally:
        backend.shutdown()
        if saved is None:
            os.environ.pop("VLLM_ALLOW_INSECURE_SERIALIZATION", None)
        else:
            os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = saved


def _engine_params(backend) -> dict[str, torch.Tensor]:
    (params,) = backend._llm.collective_rpc(_read_engine_params)
    return params


def _expected(actor: torch.nn.Module) -> dict[str, torch.Tensor]:
    state = actor.state_dict()
    return {name: torch.cat([state[p] for p in parts]).float() for name, parts in ENGINE_PARAMS.items()}


def _actor(tiny_config, seed: int, device: torch.device = CPU) -> torch.nn.Module:
    """A fresh actor, every weight perturbed (norms are not left at their initial ones)."""
    torch.manual_seed(seed)
    actor = build_causal_lm(tiny_config, torch.float32, device, False)
    with torch.no_grad():
        for param in actor.parameters():
            param.add_(torch.randn_like(param), alpha=0.01)
    return actor


def _state_bytes(actor: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in actor.state_dict().values())


def _verl_bucket_count(actor: torch.nn.Module, bucket_bytes: int) -> int:
    """verl's ``BucketedWeightSender`` rule, tensor by tensor: a tensor that does not fit in
    what is left closes the bucket; one larger than a bucket goes alone."""
    buckets, used = 0, 0
    for tensor in actor.state_dict().values():
        nbytes = tensor.numel() * tensor.element_size()
        if used and used + nbytes > bucket_bytes:
            buckets, used = buckets + 1, 0
        if nbytes > bucket_bytes:
            buckets += 1
        else:
            used += nbytes
    return buckets + (1 if used else 0)


@pytest.mark.engine
def test_vllm_loads_the_actors_weights_bucket_by_bucket(tiny_config, vllm_engine):
    for seed in (1, 2):  # a second sync overwrites the first: nothing is left from before
        actor = _actor(tiny_config, seed)
        expected = _expected(actor)
        before = _engine_params(vllm_engine)
        assert not any(torch.equal(before[n], expected[n]) for n in READABLE_ON_CPU)
        synced = sync_weights(actor_weights(actor, CPU), vllm_engine, 1, CPU)
        after = _engine_params(vllm_engine)
        for name in READABLE_ON_CPU:
            assert torch.equal(after[name], expected[name]), name
        # fp32 master weights, as verl v0.9 sends them (the tied lm_head included).
        assert synced.bytes == _state_bytes(actor)
        assert synced.buckets == _verl_bucket_count(actor, MIB) > 1
        # Where the time went: the engine's calls, freeing the buffer, the packing.
        metrics = synced.metrics()
        assert 0 < synced.load_s < synced.seconds and 0 < synced.release_s < synced.seconds
        assert metrics["weight_sync_pack_s"] > 0
        parts = metrics["weight_sync_pack_s"] + synced.load_s + synced.release_s
        assert parts == pytest.approx(synced.seconds)


@pytest.mark.engine
def test_the_bucket_size_sets_the_number_of_buckets(tiny_config, vllm_engine):
    actor = _actor(tiny_config, 3)
    small = sync_weights(actor_weights(actor, CPU), vllm_engine, 1, CPU)
    large = sync_weights(actor_weights(actor, CPU), vllm_engine, 2048, CPU)
    assert small.bytes == large.bytes == _state_bytes(actor)
    assert large.buckets == 1 < small.buckets


def test_a_rank_without_an_engine_packs_and_sends_nothing(tiny_config):
    actor = _actor(tiny_config, 4)
    synced = sync_weights(actor_weights(actor, CPU), None, 1, CPU)
    assert synced.bytes == _state_bytes(actor) and synced.buckets == _verl_bucket_count(actor, MIB)
    assert synced.load_s == 0  # no engine's time in it


def test_a_rollout_only_trial_sends_the_models_shapes(tiny_config):
    actor = _actor(tiny_config, 5)
    sent = {name: (tuple(t.shape), t.dtype) for name, t in model_weights(tiny_config, CPU)}
    assert sent == {name: (tuple(t.shape), t.dtype) for name, t in actor.state_dict().items()}


def test_the_bucket_size_must_be_positive(tiny_config):
    with pytest.raises(ValueError, match="update_weights_bucket_megabytes"):
        sync_weights(actor_weights(_actor(tiny_config, 6), CPU), None, 0, CPU)


def test_sglang_gets_each_bucket_through_update_weights_from_tensor(tiny_config, stand_in):
    spec = make_spec(tiny_config, device="cuda", device_memory_cap_gib=None)
    with_engine(spec, "sglang")
    backend = get_backend("sglang")
    backend.start(spec, "bfloat16")
    # The embedding (and its tied lm_head) of 2 MiB do not fit a 1 MiB bucket: each goes alone.
    actor = _actor({**tiny_config, "vocab_size": 4096}, 7)
    try:
        synced = sync_weights(actor_weights(actor, CPU), backend, 1, CPU)
    finally:
        backend.shutdown()
    engine = stand_in.instances[0]
    updates = [names for call, names in engine.calls if call == "update_weights"]
    assert len(updates) == synced.buckets == _verl_bucket_count(actor, MIB)
    assert [n for names in updates for n in names] == list(actor.state_dict())
    for name, tensor in actor.state_dict().items():
        assert torch.equal(engine.weights[name], tensor), name
    assert ["model.embed_tokens.weight"] in [list(names) for names in updates]
    assert ("flush", ()) in engine.calls


@pytest.mark.gpu
@pytest.mark.parametrize("vocab_size", [2048, 4096])
def test_vllm_on_a_gpu_loads_the_actors_weights_by_cuda_ipc(tiny_config, vocab_size):
    """In buckets; with a vocabulary of 4096 the embedding and its tied lm_head (2 MiB) do
    not fit a 1 MiB bucket and are shared from their own memory, as Qwen2-7B's (2.2 GB)
    are with verl's default bucket of 2048 MB."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    cuda = torch.device("cuda", 0)
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    tiny_config = {**tiny_config, "vocab_size": vocab_size}
    spec = make_spec(tiny_config, phases=["rollout"], device="cuda", device_memory_cap_gib=None)
    spec.rollout.gpu_memory_utilization = 0.2
    # The actor first, as in a trial: with CUDA initialised here, vLLM spawns its engine
    # process. Started before it, vLLM forks (it sees CUDA uninitialised), and the fork
    # cannot use CUDA, which ``torch.cuda.is_available()`` above has already touched
    # ("Cannot re-initialize CUDA in forked subprocess", seen on an H100 on 2026-12-06).
    actor = _actor(tiny_config, 8, cuda)
    backend = get_backend("vllm")
    try:
        backend.start(spec, "bfloat16")
        allocated = torch.cuda.memory_allocated(cuda)
        synced = sync_weights(actor_weights(actor, cuda), backend, 1, cuda)
        # The bucket buffers went back without a collection of Python's garbage (verl 0.9.1's
        # clean-up): the engine let go of them and the sender's IPC references were released.
        assert torch.cuda.memory_allocated(cuda) - allocated < MIB  # no 1 MiB bucket left behind
        after = _engine_params(backend)
    finally:
        backend.shutdown()
    expected = {n: t.to(torch.bfloat16).float().cpu() for n, t in _expected(actor).items()}
    for name in ENGINE_PARAMS:
        assert torch.equal(after[name], expected[name]), name
    assert synced.buckets == _verl_bucket_count(actor, MIB)


@pytest.mark.parametrize("world_size", [1, 4])
def test_an_fsdp_actor_sends_full_tensors_gathered_from_its_shards(tiny_config, world_size):
    """A world of one (gloo: the gathered values are the actor's) and one rank of a world of
    four (faked, as a ranked trial's rank: the gathers run, full shapes, no data moved)."""
    from trials.actor_state import build_actor_state
    from trials.distributed import actor_world

    spec = make_spec(tiny_config, phases=["train"], n_gpus=world_size, requests=8, local_mini_batch_size=8)
    spec.train.use_ref = False
    plain = _actor(tiny_config, 9)
    with actor_world("cpu", world_size) as world:
        state = build_actor_state(spec, "float32", world)
        sent = dict(actor_weights(state.model, CPU))
        synced = sync_weights(actor_weights(state.model, CPU), None, 1, CPU)
        if world_size == 1:
            full = {name: p.full_tensor() for name, p in state.model.named_parameters()}
            assert all(torch.equal(sent[name], full[name]) for name in full)
    assert {n: t.shape for n, t in sent.items()} == {n: t.shape for n, t in plain.state_dict().items()}
    assert synced.bytes == _state_bytes(plain)
