"""The receiving end of a weight sync inside vLLM's workers, as verl's
``vLLMColocateWorkerExtension.update_weights_from_ipc`` is (verl v0.9.0,
``workers/rollout/vllm_rollout/utils.py`` and ``bucketed_weight_transfer.py``).

vLLM mixes ``WeightReceiver`` into its worker class (the engine argument
``worker_extension_cls``); the trial's ``VllmBackend.receive_weights`` calls
``trials_load_bucket`` on every worker with ``LLM.collective_rpc``. Each call opens the
sender's bucket buffer (a CUDA IPC handle, or a shared-memory block by name where IPC is
not supported, e.g. CPU), rebuilds the bucket's tensors as views into it and hands them
to the model's own ``load_weights``, which copies each into its parameter (cast to the
engine's dtype, this worker's tensor-parallel shard). The opened buffer is kept across
the buckets of one sync and released after the last, as verl's receiver does (verl 0.9.1:
CUDA's IPC references and the allocator's cache released, no garbage collected).

On CPU, vLLM packs each linear layer's weight into a oneDNN handle after loading and drops
the parameter, so ``load_weights`` alone cannot reach it: there the sync runs as vLLM's own
in-place reload does (``initialize_layerwise_reload`` before the first bucket, each layer
re-processed once all its weights arrived, ``finalize_layerwise_reload`` after the last),
with the bucket's tensors copied out first (the reload keeps them until their layer is
complete). On a GPU the weights are loaded as verl loads them.

A replica of several GPUs (tensor parallelism) gets its buckets from its leader's actor
rank alone (``trials.rollout.weight_sync``), so its other workers open a bucket on another
GPU than their own. Their parameters live in vLLM's sleep-mode memory, which is mapped for
their own GPU only, and a copy between GPUs runs on the source's: those workers first copy
the bucket to their own GPU over the GPUs' link, then load from it. In verl each worker
reads the bucket its own GPU's actor rank sent; the trial's other workers move one bucket
more per bucket, and hold it while they load.

Only plain data crosses ``collective_rpc`` (names, shapes, dtype names, offsets, the IPC
handle pickled to bytes here), so vLLM's msgpack encoder carries it without
``VLLM_ALLOW_INSECURE_SERIALIZATION``. Imported in vLLM's worker processes: torch only.
"""

from __future__ import annotations

import gc
import pickle
from multiprocessing import shared_memory
from typing import Any

import torch

from trials.rollout.base import TensorSlot, tensor_view

# What ``trials_load_bucket`` gets for one tensor: name, shape, dtype name, byte offset.
SlotData = tuple[str, list[int], str, int]


def bucket_source(buffer: torch.Tensor, shared_memory_name: str | None) -> dict[str, Any]:
    """How a worker finds the sender's ``buffer``: ``{"shm": name, "size": bytes}`` for a
    shared-memory block, else ``{"ipc": <pickled CUDA IPC handle>}``."""
    if shared_memory_name is not None:
        return {"shm": shared_memory_name, "size": int(buffer.numel())}
    from torch.multiprocessing.reductions import reduce_tensor

    return {"ipc": pickle.dumps(reduce_tensor(buffer))}


def slot_data(slot: TensorSlot) -> SlotData:
    return (slot.name, list(slot.shape), slot.dtype, slot.offset)


class WeightReceiver:
    """Mixed into vLLM's worker (see the module docstring); its attributes are prefixed
    ``trials_`` so that they cannot clash with the worker's own."""

    # The buffer of the sync under way: its key, the tensor, its shared-memory block.
    _trials_opened: tuple[Any, torch.Tensor, shared_memory.SharedMemory | None] | None

    def trials_load_bucket(self, source: dict[str, Any], slots: list[SlotData], last: bool) -> int:
        """Load one bucket into this worker's model; the number of tensors it handed over."""
        buffer = self._trials_open(source)
        moved = buffer.is_cuda and buffer.device.index != torch.cuda.current_device()
        if moved:
            # A tensor-parallel worker on another GPU than the sender's: its parameters
            # (sleep mode's memory, mapped for its own GPU only) cannot be written by a copy
            # that runs on the sender's GPU, as a cross-device copy does. The bucket comes
            # over first (see the module docstring).
            buffer = buffer.to(torch.device("cuda", torch.cuda.current_device()))
        model = self._trials_model()
        layerwise = not buffer.is_cuda  # vLLM on CPU packs its linear weights for oneDNN
        if layerwise and not getattr(self, "_trials_reloading", False):
            from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

            initialize_layerwise_reload(model)
            self._trials_reloading = True
        weights = [
            (name, tensor_view(buffer, TensorSlot(name, tuple(shape), dtype, offset)))
            for name, shape, dtype, offset in slots
        ]
        if layerwise:  # the reload keeps what it gets until a layer is complete
            weights = [(name, tensor.clone()) for name, tensor in weights]
        if weights:
            model.load_weights(weights)
        if buffer.is_cuda:
            torch.cuda.synchronize()
        count = len(weights)
        del weights, buffer
        if moved:  # the copy's memory back to the GPU, for the KV cache that wakes next
            torch.cuda.empty_cache()
        if last:
            self._trials_finish(model)
        return count

    def _trials_finish(self, model: Any) -> None:
        if getattr(self, "_trials_reloading", False):
            from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

            finalize_layerwise_reload(model, self.vllm_config.model_config)  # type: ignore[attr-defined]
            self._trials_reloading = False
        self._trials_close()

    def _trials_model(self) -> Any:
        runner: Any = self.model_runner  # type: ignore[attr-defined]
        return runner.get_model() if hasattr(runner, "get_model") else runner.model

    def _trials_open(self, source: dict[str, Any]) -> torch.Tensor:
        key = source.get("shm") or source.get("ipc")
        opened = getattr(self, "_trials_opened", None)
        if opened is not None and opened[0] == key:
            return opened[1]
        self._trials_close()
        if "shm" in source:
            # vLLM's processes share the trial's resource tracker, where the sender
            # registered the block: attaching adds nothing, the sender's unlink clears it.
            block = shared_memory.SharedMemory(name=source["shm"])
            buffer = torch.frombuffer(block.buf, dtype=torch.uint8, count=int(source["size"]))
        else:
            block = None
            rebuild, args = pickle.loads(source["ipc"])
            buffer = rebuild(*args)
        self._trials_opened = (key, buffer, block)
        return buffer

    def _trials_close(self) -> None:
        opened = getattr(self, "_trials_opened", None)
        self._trials_opened = None
        if opened is None:
            return
        block = opened[2]
        del opened
        if block is not None:
            gc.collect()  # the views into the block must be gone before it closes
            block.close()
        elif torch.cuda.is_available():
            # As verl 0.9.1's receiver (``BucketedWeightReceiver._cleanup``): the IPC
            # references released and the worker's cache emptied (what loading cast and copied
            # through it), no collection.
            torch.cuda.ipc_collect()
            torch.cuda.empty_cache()
