"""The actor as verl's FSDP2 worker holds it, on CPU: gloo for a world of one, torch's fake
process group for one rank of a larger world, and the plain-module path."""

from __future__ import annotations

import os

import torch
from trial_helpers import make_spec

from trials.actor_state import build_actor_state, resident_bytes
from trials.distributed import ENV_KEYS, actor_world
from trials.train import run_train


def _params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def test_fsdp2_world_of_one_on_gloo_keeps_fp32_master_weights_and_adam_state(tiny_config):
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    spec = make_spec(tiny_config, phases=["train"], requests=8, local_mini_batch_size=8)
    env_before = {k: os.environ.get(k) for k in ENV_KEYS}
    with actor_world("cpu", 1) as world:
        assert (world.backend, world.world_size, world.rank) == ("gloo", 1, 0)
        assert os.environ["WORLD_SIZE"] == "1" and os.environ["MASTER_ADDR"] == "127.0.0.1"
        state = build_actor_state(spec, "bfloat16", world)
        model = state.model
        layers = [m for m in model.modules() if isinstance(m, FSDPModule)]
        assert len(layers) == tiny_config["num_hidden_layers"] + 1 == state.fsdp_units
        params = list(model.parameters())
        assert all(isinstance(p, DTensor) and p.dtype == torch.float32 for p in params)
        # Every parameter has AdamW state, in fp32, and no gradient between steps.
        assert len(state.optimizer.state) == len(params)
        for per_param in state.optimizer.state.values():
            assert per_param["exp_avg"].dtype == per_param["exp_avg_sq"].dtype == torch.float32
        assert all(p.grad is None for p in params)
        # Compute follows the spec: FSDP casts the gathered parameters to bfloat16.
        policy = layers[0]._get_fsdp_state()._mp_policy
        assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)
        # Between steps: 4 bytes of master weight + 8 of AdamW per actor parameter (and
        # AdamW's step counters), and the reference model in the compute dtype (not
        # offloaded on a CPU device).
        n_actor, n_ref = _params(model), _params(state.ref)
        buffers = sum(b.untyped_storage().nbytes() for m in (model, state.ref) for b in m.buffers())
        steps = 4 * len(params)
        assert resident_bytes(state, "cpu") == 12 * n_actor + 2 * n_ref + buffers + steps
        metrics, timings = {}, {}
        run_train(spec, "bfloat16", metrics, timings, state)  # fwd/bwd/step through FSDP2
        assert metrics["actor_fsdp"] == 1 and metrics["actor_master_dtype_bits"] == 32
        assert set(timings) == {"old_log_prob", "ref_log_prob", "update_actor", "actor_reload"}
        assert timings["actor_reload"] == 0.0  # nothing to move on a CPU device
        assert all(p.dtype == torch.float32 for p in model.parameters())
        assert all(p.grad is None for p in model.parameters())
    assert {k: os.environ.get(k) for k in ENV_KEYS} == env_before
    assert not torch.distributed.is_initialized()


def test_one_rank_of_a_larger_world_holds_its_share(tiny_config):
    spec = make_spec(tiny_config, phases=["train"], n_gpus=4, requests=8, local_mini_batch_size=8)
    spec.train.use_ref = False
    with actor_world("cpu", spec.n_gpus) as world:
        assert (world.backend, world.world_size) == ("fake", 4)
        state = build_actor_state(spec, "float32", world)
        full = _params(state.model)
        local = sum(_local(p).numel() for p in state.model.parameters())
        assert full / 4 <= local < full / 4 + 4 * len(list(state.model.parameters()))
        adam = sum(_local(s["exp_avg"]).numel() for s in state.optimizer.state.values())
        assert adam == local
        metrics, timings = {}, {}
        run_train(spec, "float32", metrics, timings, state)
    assert metrics["actor_fsdp_world_size"] == 4 and metrics["actor_fsdp_fake_collectives"] == 1
    assert timings["update_actor"] > 0


def test_a_torchrun_style_environment_is_used_as_given(tiny_config, monkeypatch):
    from trials.distributed import free_port

    port = str(free_port())
    for key, value in (
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", port),
        ("RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("LOCAL_RANK", "0"),
    ):
        monkeypatch.setenv(key, value)
    with actor_world("cpu", 8) as world:  # the launcher's world wins over n_ranks
        assert (world.backend, world.world_size) == ("gloo", 1)
    assert os.environ["MASTER_PORT"] == port


def test_plain_actor_without_a_process_group(tiny_config):
    spec = make_spec(tiny_config, phases=["train"], actor_fsdp=False, requests=8, local_mini_batch_size=8)
    state = build_actor_state(spec, "float32", None)
    assert not state.fsdp and not torch.distributed.is_initialized()
    assert all(p.dtype == torch.float32 for p in state.model.parameters())
    n_actor, n_ref = _params(state.model), _params(state.ref)
    assert resident_bytes(state, "cpu") >= 12 * n_actor + 4 * n_ref
    metrics, timings = {}, {}
    run_train(spec, "float32", metrics, timings, state)
    assert metrics["actor_fsdp"] == 0 and timings["update_actor"] > 0


def test_offload_knobs_move_nothing_on_a_cpu_device(tiny_config):
    spec = make_spec(tiny_config, phases=["train"])
    spec.train.param_offload = spec.train.optimizer_offload = True
    with actor_world("cpu", 1) as world:
        state = build_actor_state(spec, "float32", world)
        assert not state.param_offload and not state.optimizer_offload
        assert state.load_params() == state.offload_optimizer() == 0.0
