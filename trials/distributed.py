"""The actor's process group: one rank of verl's FSDP world, as this trial runs it.

``actor_world(device, n_ranks)`` initialises ``torch.distributed`` and a 1-D device mesh
for the trial's actor and tears them down on exit:

- launched by torchrun (``RANK`` and ``WORLD_SIZE`` in the environment): that world,
  from the environment (``env://``), ``nccl`` on CUDA and ``gloo`` on CPU, on device
  ``cuda:LOCAL_RANK``;
- one rank (``n_ranks == 1``): the same, with the environment set here for a world of
  one (``MASTER_ADDR=127.0.0.1``, a free ``MASTER_PORT``, ``RANK=0``, ``WORLD_SIZE=1``,
  ``LOCAL_RANK=0``) and restored on exit;
- a trial's rank process with a real group (``trials.ranks.RankGroup`` with a
  ``master_port``): rank ``peers.rank`` of a world of ``peers.size`` over TCP on
  127.0.0.1 (no environment variables, so an engine this process starts inherits none),
  on ``cuda:0`` (the rank's own GPU: ``trials.ranks`` lists it first);
- ``n_ranks > 1`` in one process: rank 0 of a world of ``n_ranks`` on torch's ``fake``
  backend, whose collectives move no data and take no time. FSDP then holds exactly one
  rank's share of parameters, gradients and optimizer state and all-gathers full layers
  for compute, so memory and compute are those of one of verl's ``n_gpus`` ranks; the
  collectives' own time is not measured (a lower bound on the actor's phases).

A process group already initialised by the caller is used as it is and left alone.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

ENV_KEYS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")


@dataclass(frozen=True)
class ActorWorld:
    """The process group the actor is sharded over, from this rank's point of view."""

    backend: str  # "nccl", "gloo" or "fake"
    rank: int
    world_size: int
    device: torch.device
    mesh: Any  # torch.distributed.device_mesh.DeviceMesh

    @property
    def fake(self) -> bool:
        return self.backend == "fake"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def real_backend(device: str) -> str:
    return "nccl" if device == "cuda" else "gloo"


@contextmanager
def actor_world(device: str, n_ranks: int, peers: Any = None) -> Iterator[ActorWorld]:
    """The actor's world (see the module docstring); torn down on exit if made here.

    ``peers``: this process's ``trials.ranks.RankGroup``, or None.
    """
    if dist.is_initialized():
        yield _world(device, dist.get_backend(), dist.get_rank(), dist.get_world_size())
        return
    if peers is not None and peers.master_port is not None:
        world = _init_peers(device, peers.rank, peers.size, peers.master_port)
        try:
            yield world
        finally:
            dist.destroy_process_group()
        return
    launched = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    saved = {k: os.environ.get(k) for k in ENV_KEYS}
    try:
        if launched or n_ranks <= 1:
            if not launched:
                os.environ.update(
                    MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(free_port()),
                    RANK="0",
                    WORLD_SIZE="1",
                    LOCAL_RANK="0",
                )
            world = _init_real(device)
        else:
            world = _init_fake(device, n_ranks)
        try:
            yield world
        finally:
            dist.destroy_process_group()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _local_device(device: str) -> torch.device:
    if device != "cuda":
        return torch.device("cpu")
    local = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(local)
    return local


def _init_real(device: str) -> ActorWorld:
    backend = real_backend(device)
    local = _local_device(device)
    kwargs: dict[str, Any] = {"device_id": local} if local.type == "cuda" else {}
    dist.init_process_group(backend, init_method="env://", **kwargs)
    return _world(device, backend, dist.get_rank(), dist.get_world_size())


def _init_peers(device: str, rank: int, size: int, port: int) -> ActorWorld:
    backend = real_backend(device)
    local = torch.device("cuda", 0) if device == "cuda" else torch.device("cpu")
    kwargs: dict[str, Any] = {}
    if local.type == "cuda":
        torch.cuda.set_device(local)
        kwargs["device_id"] = local
    dist.init_process_group(
        backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size, **kwargs
    )
    return _world(device, backend, rank, size)


def _init_fake(device: str, n_ranks: int) -> ActorWorld:
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers "fake"

    _local_device(device)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=n_ranks)
    return _world(device, "fake", 0, n_ranks)


def _world(device: str, backend: str, rank: int, world_size: int) -> ActorWorld:
    from torch.distributed.device_mesh import init_device_mesh

    local = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")
    mesh = init_device_mesh(local.type, (world_size,))
    return ActorWorld(backend=backend, rank=rank, world_size=world_size, device=local, mesh=mesh)
