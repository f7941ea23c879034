"""The actor -> engine weight sync verl runs before every rollout, bucket by bucket.

verl v0.9's colocated checkpoint engine (``workers/engine_workers.py`` ``update_weights``
with ``checkpoint_engine.backend: naive``) streams the actor's state dict, every FSDP
``DTensor`` gathered to a full tensor on the device (``full_tensor()``, a collective over
the actor's ranks) in the actor's own dtype (fp32 master weights: v0.9 does not cast
before sending; the engine's loader casts), into the engine:

- vLLM (``vllm_rollout/bucketed_weight_transfer.py``): the tensors are copied back to back
  into one bucket buffer of ``update_weights_bucket_megabytes`` (a tensor that does not
  fit in what is left of it closes the bucket first); the buffer is shared with the
  engine's workers by CUDA IPC (a shared-memory block where IPC is not supported); per
  bucket the sender sends the tensors' metadata and waits until the workers rebuilt the
  views and ran their model's ``load_weights``. A tensor larger than a whole bucket goes
  alone, shared from its own memory. After the last bucket the sender drops the buffer and
  empties the allocator's cache; verl 0.9.1 collects no garbage there (v0.9.0 did).
- SGLang (``sglang_rollout/sglang_rollout.py``): the same grouping by size, each group
  handed to ``Engine.update_weights_from_tensor`` (tensors shared by CUDA IPC).

``sync_weights`` does this with the trial's engine (``RolloutBackend.receive_weights``):
the packing, the IPC (or shared memory) and the engine's loading are real; for SGLang the
tensors are packed into the bucket buffer first (verl hands SGLang the gathered tensors
themselves: one device copy more here, and the bucket's memory is the buffer's, not that
of the tensors it groups).

Emulated in a trial over several GPUs (``trials.ranks``): in verl every actor rank
gathers the full tensors and sends them to the engine worker on its own GPU; here every
rank gathers (the collectives must be joined by all) and packs into its own bucket, but
only a replica's leader has an engine, whose workers all read the leader's bucket (those on
the replica's other GPUs copy it to their own first: ``trials.rollout.vllm_weights``). In a
trial that fakes its world, the gathers move no data. A rollout-only trial has no actor:
its weights are the model's parameters, drawn one at a time on the device in fp32
(``model_weights``), so the gather is not measured, the packing and loading are.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Any

import torch

from trials.rollout.base import RolloutBackend, TensorSlot, WeightBucket

MIB = 1 << 20


@dataclass(frozen=True)
class WeightSync:
    """What one sync moved: its wall time, bytes of tensors sent, non-empty buckets, and
    where its time went: ``load_s`` in the engine's hands (the call per bucket, the
    workers' loading), ``release_s`` freeing the bucket buffer after the last, the rest
    gathering and packing the tensors."""

    seconds: float
    bytes: int
    buckets: int
    load_s: float = 0.0
    release_s: float = 0.0

    def metrics(self) -> dict[str, float]:
        return {
            "weight_sync_s": self.seconds,
            "weight_sync_bytes": float(self.bytes),
            "weight_sync_buckets": float(self.buckets),
            "weight_sync_load_s": self.load_s,
            "weight_sync_release_s": self.release_s,
            "weight_sync_pack_s": max(0.0, self.seconds - self.load_s - self.release_s),
        }


def actor_weights(model: torch.nn.Module, device: torch.device) -> Iterator[tuple[str, torch.Tensor]]:
    """verl's ``get_per_tensor_param``: ``model``'s state dict in order, each tensor on
    ``device``, a ``DTensor`` gathered to its full tensor (every rank must iterate)."""
    for name, value in model.state_dict().items():
        tensor = value.to(device, non_blocking=True)
        full = getattr(tensor, "full_tensor", None)
        yield name, (full() if callable(full) else tensor).detach()


def model_weights(model_config: dict[str, Any], device: torch.device) -> Iterator[tuple[str, torch.Tensor]]:
    """The model's fp32 parameters by name, each drawn on ``device`` when it is sent (no
    actor holds them: a rollout-only trial)."""
    from trials.actor import build_causal_lm

    shapes = build_causal_lm(model_config, torch.float32, torch.device("meta"), False).state_dict()
    for name, meta in shapes.items():
        yield name, torch.empty(meta.shape, dtype=meta.dtype, device=device).normal_(std=0.02)


def sync_weights(
    weights: Iterable[tuple[str, torch.Tensor]],
    backend: RolloutBackend | None,
    bucket_megabytes: int,
    device: torch.device,
) -> WeightSync:
    """Send ``weights`` into ``backend``'s engine in buckets of ``bucket_megabytes`` (see
    the module docstring); ``backend`` None: pack only (a rank without an engine)."""
    sender = _Sender(backend, int(bucket_megabytes) * MIB, device)
    _synchronize(device)
    t0 = time.perf_counter()
    with sender.bucket():
        for name, tensor in weights:
            sender.add(name, tensor)
        sender.flush(last=True)
        sent = time.perf_counter()
    _synchronize(device)
    end = time.perf_counter()
    return WeightSync(end - t0, sender.sent_bytes, sender.sent_buckets, sender.load_s, end - sent)


class _Sender:
    """verl's ``BucketedWeightSender``, without its socket: the backend's call is the
    metadata message and its return the worker's acknowledgement."""

    def __init__(self, backend: RolloutBackend | None, bucket_bytes: int, device: torch.device) -> None:
        if bucket_bytes <= 0:
            raise ValueError(f"update_weights_bucket_megabytes must be positive, got {bucket_bytes // MIB}")
        self.backend = backend
        self.bucket_bytes = bucket_bytes
        self.device = device
        self.buffer: torch.Tensor | None = None
        self.shm_name: str | None = None
        self.slots: list[TensorSlot] = []
        self.offset = 0
        self.sent_bytes = 0
        self.sent_buckets = 0
        self.load_s = 0.0

    @contextmanager
    def bucket(self) -> Iterator[None]:
        with _buffer(self.bucket_bytes, self.device) as (buffer, shm_name):
            self.buffer, self.shm_name = buffer, shm_name
            del buffer  # the block closes on exit: no view of it may outlive this
            try:
                yield
            finally:
                self.buffer = None

    def add(self, name: str, tensor: torch.Tensor) -> None:
        nbytes = tensor.numel() * tensor.element_size()
        if self.offset + nbytes > self.bucket_bytes and self.slots:
            self.flush(last=False)
        if nbytes > self.bucket_bytes:
            self.send_alone(name, tensor)
            return
        assert self.buffer is not None
        slot = _slot(name, tensor, self.offset)
        self.buffer[self.offset : self.offset + nbytes].view(tensor.dtype).view(tensor.shape).copy_(
            tensor, non_blocking=True
        )
        self.slots.append(slot)
        self.offset += nbytes

    def flush(self, last: bool) -> None:
        _synchronize(self.device)
        self.deliver(WeightBucket(self.buffer, self.slots, last, self.shm_name), self.offset)
        self.slots, self.offset = [], 0

    def send_alone(self, name: str, tensor: torch.Tensor) -> None:
        """A tensor larger than a bucket: shared from its own memory (CUDA IPC), or
        from a shared-memory block of its size."""
        nbytes = tensor.numel() * tensor.element_size()
        if self.device.type == "cuda":
            own = tensor.contiguous().view(-1).view(torch.uint8)
            self.deliver(WeightBucket(own, [_slot(name, tensor, 0)], False), nbytes)
            return
        with _buffer(nbytes, self.device) as (buffer, shm_name):
            buffer.view(tensor.dtype).view(tensor.shape).copy_(tensor)
            self.deliver(WeightBucket(buffer, [_slot(name, tensor, 0)], False, shm_name), nbytes)
            del buffer

    def deliver(self, bucket: WeightBucket, nbytes: int) -> None:
        if self.backend is not None:
            t0 = time.perf_counter()
            self.backend.receive_weights(bucket)
            self.load_s += time.perf_counter() - t0
        if bucket.tensors:
            self.sent_bytes += nbytes
            self.sent_buckets += 1


def _slot(name: str, tensor: torch.Tensor, offset: int) -> TensorSlot:
    return TensorSlot(name, tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."), offset)


@contextmanager
def _buffer(nbytes: int, device: torch.device) -> Iterator[tuple[torch.Tensor, str | None]]:
    """A ``uint8`` buffer of ``nbytes`` the engine's workers can open: device memory on
    CUDA (IPC), a fresh shared-memory block elsewhere (its name), released on exit."""
    if device.type == "cuda":
        buffer = torch.empty(nbytes, dtype=torch.uint8, device=device)
        try:
            yield buffer, None
        finally:
            # As verl 0.9.1's sender cleans up (``BucketedWeightSender._cleanup``): the
            # buffer dropped, CUDA's IPC references and the allocator's cache released.
            # v0.9.0's ``gc.collect()`` here, a walk of the whole heap, is gone in 0.9.1.
            del buffer
            torch.cuda.ipc_collect()
            torch.cuda.empty_cache()
        return
    block = shared_memory.SharedMemory(create=True, size=nbytes)
    try:
        yield torch.frombuffer(block.buf, dtype=torch.uint8, count=nbytes), block.name
    finally:
        gc.collect()  # every view into the block must be gone before it closes
        block.close()
        block.unlink()


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
