"""The actor and its reference model as verl's FSDP worker holds them between PPO steps.

Built once, before the rollout engine starts (phase ``startup``), and kept for the
whole trial, so the engine starts, sleeps and wakes beside what it has beside it in verl:

- the actor: float32 master parameters (verl's default ``fsdp_config.model_dtype``),
  sharded with FSDP2 ``fully_shard`` per decoder layer (the model's
  ``_no_split_modules``) and at the root over the actor's world (``trials.distributed``),
  computing in the trial's dtype (``MixedPrecisionPolicy(param_dtype=<dtype>,
  reduce_dtype=float32)``), gradient checkpointing per the knob. Its AdamW state is
  allocated at once (one step on zero gradients), as it is in every step after the
  first, and gradients are freed as verl's ``zero_grad`` frees them: between steps the
  rank holds 12 bytes per parameter of its share (16 during the update).
- the reference model (``use_ref``): its own FSDP2 module, forward only, built as verl
  v0.9's FSDP engine builds a forward-only module (``verl/workers/engine/fsdp/
  transformer_impl.py``): float32 parameters (``ref.fsdp_config.model_dtype``), computing
  in the trial's dtype, and always offloaded to the CPU with FSDP's own offload
  (``CPUOffloadPolicy(pin_memory=True)``; verl forces it "to save memory", whatever
  ``ref.fsdp_config.param_offload`` says): each forward copies every unit's float32 shard
  in from pinned memory, so the ``ref_log_prob`` sub-phase pays that copy once per
  micro-batch. On the CPU, or without FSDP, the ref stays where it is built, in the
  compute dtype.
- attention: the kernel verl's actor runs (``actor.attention_kernel``: flash-attention 2
  on a GPU, refused without flash-attn; SDPA on the CPU) for the actor and the ref.
- ``param_offload`` / ``optimizer_offload`` (CUDA only): the actor's parameters / AdamW
  state go to the CPU after the build and between the sub-phases that use them, as
  verl's ``offload_fsdp_model_to_cpu`` / ``offload_fsdp_optimizer`` move them (then
  empty the allocator's cache), and come back before; each ``load_*``/``offload_*``
  returns the seconds its move took, which the step pays. The parameters move without
  blocking, into and out of pinned host memory, as verl 0.9.1 moves them (0.9.0 copied
  them into pageable memory, blocking); the build's offload pays the pinned allocation,
  before anything is timed.

With ``TrialSpec.actor_fsdp`` False the actor is a plain module holding the whole model
on one device whatever ``n_gpus`` is (no process group), and so is its reference model.

``train.strategy`` picks the FSDP the actor and the ref are built with, as verl's
``actor_rollout_ref.actor.strategy`` does: ``fsdp2`` (FSDP2, as above) or ``fsdp``, verl
v0.9's default: FSDP1's ``FullyShardedDataParallel`` wrapping each decoder layer and the
root, as ``verl/workers/engine/fsdp/transformer_impl.py`` builds it (``MixedPrecision``
with float32 reduction and buffers, full sharding over the world, which FSDP1 turns into
``NO_SHARD`` on a world of one, flat parameters, no forward prefetch, module states
synchronised from rank 0; the ref under FSDP1's ``CPUOffload(offload_params=True)``; the
state dict full on a world of one and sharded beyond, which the weight sync reads). FSDP1
runs on GPUs only: on a CPU it is refused (``TrialEnvironmentError``), as is the actor's
``param_offload`` with it (``trials.train.check_train_spec``).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from trials import actor
from trials.distributed import ActorWorld
from trials.errors import TrialEnvironmentError
from trials.types import TrialSpec

ADAMW_LR = 1e-6
GIB = float(1 << 30)
STRATEGIES = ("fsdp", "fsdp2")  # actor_rollout_ref.actor.strategy: FSDP1, FSDP2


@dataclass
class ActorState:
    """The actor, its optimizer and the reference model, where verl keeps them."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    ref: torch.nn.Module | None
    device: torch.device
    world: ActorWorld | None  # None: a plain module
    param_offload: bool
    optimizer_offload: bool
    fsdp_units: int = 0
    ref_cpu_offload: bool = False
    attention: str = actor.SDPA
    fsdp_version: int = 2  # 1: FSDP1 (strategy fsdp), 2: FSDP2 (fsdp2); 0 without FSDP

    @property
    def fsdp(self) -> bool:
        return self.world is not None

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def timed(self, fn: Callable[[], object]) -> float:
        self.sync()
        t0 = time.perf_counter()
        fn()
        self.sync()
        return time.perf_counter() - t0

    def load_params(self) -> float:
        """verl 0.9.1's ``load_fsdp2_model_to_gpu``: a non-blocking copy from the pinned
        host memory the offload left (``_to_cpu``)."""
        if not self.param_offload:
            return 0.0
        return self.timed(lambda: self.model.to(self.device, non_blocking=True))

    def offload_params(self) -> float:
        return self.timed(lambda: _to_cpu(self.model)) if self.param_offload else 0.0

    def load_optimizer(self) -> float:
        if not self.optimizer_offload:
            return 0.0
        return self.timed(lambda: actor.move_optimizer_state(self.optimizer, self.device))

    def offload_optimizer(self) -> float:
        if not self.optimizer_offload:
            return 0.0

        def move() -> None:
            actor.move_optimizer_state(self.optimizer, torch.device("cpu"))
            self.sync()
            _empty_cache(self.device)

        return self.timed(move)

    def resident_gib(self) -> float:
        """Device memory the actor holds now: on CUDA what this process's allocator has
        reserved (the engine cannot use it), on CPU the bytes of its tensors."""
        if self.device.type == "cuda":
            gc.collect()
            return torch.cuda.memory_reserved(self.device) / GIB
        return resident_bytes(self, "cpu") / GIB

    def allocated_gib(self) -> float:
        """Device memory in the actor's live tensors (``resident_gib`` less the allocator's
        cached, unused blocks)."""
        if self.device.type == "cuda":
            gc.collect()
            return torch.cuda.memory_allocated(self.device) / GIB
        return resident_bytes(self, "cpu") / GIB

    def metrics(self) -> dict[str, float]:
        master = next(iter(self.model.parameters()))
        return {
            "actor_fsdp": float(self.fsdp),
            "actor_fsdp_world_size": float(self.world.world_size if self.world else 1),
            "actor_fsdp_fake_collectives": float(bool(self.world and self.world.fake)),
            "actor_fsdp_units": float(self.fsdp_units),
            "actor_fsdp_version": float(self.fsdp_version if self.fsdp else 0),
            "actor_params": float(sum(p.numel() for p in self.model.parameters())),
            "actor_master_dtype_bits": float(master.element_size() * 8),
            "actor_param_offload": float(self.param_offload),
            "actor_optimizer_offload": float(self.optimizer_offload),
            "ref_cpu_offload": float(self.ref_cpu_offload),
            "actor_flash_attention": float(self.attention == actor.FLASH_ATTENTION),
        }


def build_actor_state(spec: TrialSpec, dtype: str, world: ActorWorld | None) -> ActorState:
    """Build (see the module docstring) and apply the offload policy, as verl's worker
    does before the rollout engine starts."""
    t = spec.train
    device = world.device if world is not None else torch.device(spec.device)
    compute = actor.torch_dtype(dtype)
    on_cuda = device.type == "cuda"
    attention = actor.attention_kernel(device.type)
    if on_cuda:
        create_workspaces(device, compute)
    ref = None
    ref_offload = t.use_ref and on_cuda and world is not None
    fsdp1 = world is not None and t.strategy == "fsdp"
    if fsdp1 and not on_cuda:
        raise TrialEnvironmentError(
            "actor_rollout_ref.actor.strategy=fsdp builds FSDP1, which runs on GPUs only; "
            "on a CPU use strategy fsdp2"
        )
    wrap = shard_fsdp1 if fsdp1 else shard
    if t.use_ref:  # first: its transient copy on the device is freed before the actor's
        ref_dtype = torch.float32 if ref_offload else compute
        ref = actor.build_causal_lm(spec.model_config, ref_dtype, device, False, attention)
        ref.eval()
        if world is not None:
            ref, _ = wrap(ref, world, compute, cpu_offload=ref_offload)
    model = actor.build_causal_lm(
        spec.model_config, torch.float32, device, t.enable_gradient_checkpointing, attention
    )
    units = 0
    if world is not None:
        model, units = wrap(model, world, compute)
    optimizer = torch.optim.AdamW(model.parameters(), lr=ADAMW_LR)
    allocate_optimizer_state(model, optimizer)
    state = ActorState(
        model=model,
        optimizer=optimizer,
        ref=ref,
        device=device,
        world=world,
        param_offload=t.param_offload and on_cuda,
        optimizer_offload=t.optimizer_offload and on_cuda,
        fsdp_units=units,
        ref_cpu_offload=ref_offload,
        attention=attention,
        fsdp_version=1 if fsdp1 else 2,
    )
    state.offload_optimizer()
    state.offload_params()
    gc.collect()
    _empty_cache(device)
    return state


def create_workspaces(device: torch.device, compute: torch.dtype) -> None:
    """Create the math libraries' per-stream workspaces (cuBLAS, cuBLASLt: tens of MiB
    that live as long as the process) while the allocator's cache is empty.

    Created later, at the first matmul of a train sub-phase, they are carved out of a
    large cached block some earlier temporary freed, and pin that whole segment:
    ``empty_cache`` can then not return it, and the engine meets an actor that holds
    gigabytes it does not use (seen on an H200: 11.6-13 GiB reserved, 0.06 GiB allocated,
    after the train probe of an offloaded actor). A process that does its first matmuls
    on an empty cache, as verl's worker does when it builds its model, holds none of that.
    """
    a = torch.randn(64, 64, device=device, requires_grad=True)
    for dtype in {torch.float32, compute}:
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            (a @ a).float().sum().backward()
    del a
    torch.cuda.synchronize(device)


def shard(
    model: torch.nn.Module, world: ActorWorld, param_dtype: torch.dtype, cpu_offload: bool = False
) -> tuple[torch.nn.Module, int]:
    """``fully_shard`` each decoder layer, then the root (in place): the module and the
    number of FSDP units. ``cpu_offload``: the shards live in pinned CPU memory, copied in
    for each use."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    kwargs: dict[str, Any] = {
        "mesh": world.mesh,
        "mp_policy": MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32),
    }
    if cpu_offload:
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=True)
    layer_classes = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in layer_classes]
    for layer in layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model, len(layers) + 1


def shard_fsdp1(
    model: torch.nn.Module, world: ActorWorld, param_dtype: torch.dtype, cpu_offload: bool = False
) -> tuple[torch.nn.Module, int]:
    """FSDP1 around each decoder layer and the root, as verl's ``fsdp`` strategy wraps a
    module (see the module docstring): the wrapped module and the number of FSDP units.
    ``cpu_offload``: the flat parameters live in CPU memory, copied in for each use."""
    from torch.distributed.fsdp import (
        CPUOffload,
        FullStateDictConfig,
        MixedPrecision,
        ShardedStateDictConfig,
        ShardingStrategy,
        StateDictType,
    )
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    layer_classes = set(getattr(model, "_no_split_modules", None) or ())
    layer_types = {type(m) for m in model.modules() if type(m).__name__ in layer_classes}
    wrapped = FSDP(
        model,
        auto_wrap_policy=ModuleWrapPolicy(layer_types),
        device_id=world.device,
        sharding_strategy=ShardingStrategy.FULL_SHARD,
        mixed_precision=MixedPrecision(
            param_dtype=param_dtype, reduce_dtype=torch.float32, buffer_dtype=torch.float32
        ),
        sync_module_states=True,
        device_mesh=world.mesh,
        forward_prefetch=False,
        use_orig_params=False,
        cpu_offload=CPUOffload(offload_params=True) if cpu_offload else None,
    )
    if world.world_size == 1:
        FSDP.set_state_dict_type(wrapped, StateDictType.FULL_STATE_DICT, FullStateDictConfig())
    else:
        FSDP.set_state_dict_type(wrapped, StateDictType.SHARDED_STATE_DICT, ShardedStateDictConfig())
    return wrapped, len(FSDP.fsdp_modules(wrapped))


def allocate_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """AdamW's state as after a first step: one step on zero gradients, then freed."""
    for param in model.parameters():
        param.grad = torch.zeros_like(param)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def resident_bytes(state: ActorState, device_type: str) -> int:
    """Bytes of every tensor the actor state holds on ``device_type`` (shared storage once)."""
    seen: set[int] = set()
    total = 0
    for tensor in _tensors(state):
        local = _local(tensor)
        if local.device.type != device_type:
            continue
        storage = local.untyped_storage()
        if storage.nbytes() == 0 or storage.data_ptr() in seen:
            continue
        seen.add(storage.data_ptr())
        total += storage.nbytes()
    return total


def _tensors(state: ActorState) -> Iterator[torch.Tensor]:
    for module in (state.model, state.ref):
        if module is None:
            continue
        for param in module.parameters():
            yield param
            if param.grad is not None:
                yield param.grad
        yield from module.buffers()
    for per_param in state.optimizer.state.values():
        yield from (v for v in per_param.values() if isinstance(v, torch.Tensor))


def _local(tensor: torch.Tensor) -> torch.Tensor:
    to_local = getattr(tensor, "to_local", None)  # a DTensor's shard on this rank
    return to_local() if callable(to_local) else tensor


def _to_cpu(module: torch.nn.Module) -> None:
    """verl 0.9.1's ``offload_fsdp2_model_to_cpu``: a non-blocking copy, which PyTorch
    makes into pinned host memory (its caching host allocator keeps the blocks for the
    next offload), then the allocator's cache emptied. The caller synchronises."""
    device = next(module.parameters()).device
    module.to("cpu", non_blocking=True)
    _empty_cache(device)


def _empty_cache(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


@contextmanager
def train_allocator(device: str, expandable_segments: bool) -> Iterator[None]:
    """The CUDA caching allocator as verl's training worker has it while it trains: with
    expandable segments, which verl v0.9 turns on after each weight sync and off again,
    its cache emptied, before the next (``workers/engine_workers.py``, ``update_weights``;
    vLLM's sleep mode refuses them, so they are never on while the engine wakes). Not on
    the CPU, nor where ``expandable_segments`` is False (the allocator's default)."""
    if device != "cuda" or not expandable_segments:
        yield
        return
    torch.cuda.memory._set_allocator_settings("expandable_segments:True")
    try:
        yield
    finally:
        torch.cuda.memory._set_allocator_settings("expandable_segments:False")
        torch.cuda.empty_cache()


def hand_back(device: torch.device) -> None:
    """What verl 0.9.1's ``update_weights`` does once the actor's weights are offloaded,
    before the engine's KV cache wakes: the device synchronised and the allocator's cache
    emptied (``engine_workers.py``; v0.9.0's ``aggressive_empty_cache`` also collected
    Python's garbage, a walk of the worker's whole heap that 0.9.1 no longer makes)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def release(device: torch.device) -> None:
    """Give the freed memory back after the caller dropped its ``ActorState``."""
    gc.collect()
    _empty_cache(device)
