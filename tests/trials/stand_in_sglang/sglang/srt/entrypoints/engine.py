"""Stand-in for ``sglang.srt.entrypoints.engine.Engine`` (see ../../../README.md).

Behaviours (SGLang 0.5.17): a request's ``max_new_tokens`` is cut to what the KV pool
holds, ``max_total_num_tokens - len(prompt) - page_size - 1`` (``init_req_max_new_tokens``),
and the request finishes early without an error; retractions are logged as warnings;
``custom_sigquit_handler`` is installed for the start-up and the tokenizer manager's loop
takes SIGQUIT over on first use; release/resume work by tag and resuming a tag not
released raises, as SGLang's scheduler does.

The event loop is SGLang's: uvloop's (where installed), outputs read by a task that
``auto_create_handle_loop`` puts on the *running* loop, or on a new one it makes when none
runs (``get_or_create_event_loop``), and ``generate`` run with ``loop.run_until_complete``.
A generation whose outputs nobody reads fails after ``ANSWER_WAIT_S`` here, where SGLang
waits for ever.

Test controls (class attributes, reset by the tests): ``kv_tokens`` (the pool),
``retractions`` (warnings logged per generation), ``block_in_generate`` (generate waits
until the test signals the process or kills the scheduler).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from types import SimpleNamespace

try:  # SGLang's engine and tokenizer manager install uvloop's policy on import
    import uvloop

    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
except ImportError:
    pass

# The ServerArgs fields of SGLang 0.5.17 that a caller of this stand-in may pass.
SERVER_ARGS = frozenset(
    {
        "model_path",
        "load_format",
        "skip_tokenizer_init",
        "dtype",
        "mem_fraction_static",
        "max_running_requests",
        "tp_size",
        "disable_cuda_graph",
        "chunked_prefill_size",
        "enable_memory_saver",
        "enable_weights_cpu_backup",
        "attention_backend",
        "random_seed",
        "log_level",
        "skip_server_warmup",
        "custom_sigquit_handler",
        "max_total_tokens",
        "context_length",
        "trust_remote_code",
        "kv_cache_dtype",
        "disable_radix_cache",
    }
)
GPU_MEMORY_ALL_TYPES = ("kv_cache", "weights", "cuda_graph")
PAGE_SIZE = 1
ANSWER_WAIT_S = 5.0


def get_or_create_event_loop() -> asyncio.AbstractEventLoop:
    """SGLang's ``sglang.srt.utils.common.get_or_create_event_loop``."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        return loop


class _TokenizerManager:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.event_loop: asyncio.AbstractEventLoop | None = None
        self.outputs: asyncio.Queue | None = None  # what the scheduler sent, read by handle_loop
        self.answers: dict[int, asyncio.Future] = {}

    def auto_create_handle_loop(self) -> None:
        if self.event_loop is not None:
            return
        loop = get_or_create_event_loop()
        self.outputs = asyncio.Queue()
        self.handle_task = loop.create_task(self.handle_loop())
        self.event_loop = loop
        # SGLang's running-phase handlers: SIGQUIT kills the process tree, SIGTERM drains the
        # server; here they only say so.
        loop.add_signal_handler(signal.SIGQUIT, self.engine.killed_tree.append, True)
        loop.add_signal_handler(signal.SIGTERM, self.engine.drained.append, True)

    async def handle_loop(self) -> None:
        while True:
            key, outputs = await self.outputs.get()
            self.answers.pop(key).set_result(outputs)

    async def generate_request(self, outputs: list[dict]) -> list[dict]:
        self.auto_create_handle_loop()
        answer = asyncio.get_running_loop().create_future()
        self.answers[id(answer)] = answer
        self.outputs.put_nowait((id(answer), outputs))  # the scheduler's reply
        try:
            return await asyncio.wait_for(answer, ANSWER_WAIT_S)
        except asyncio.TimeoutError:
            raise AssertionError(
                "no output reader answered: SGLang's handle_loop runs on another event loop "
                "than generate's, and the real engine would wait here for ever"
            ) from None


class Engine:
    kv_tokens = 4096
    retractions = 0
    block_in_generate = False
    instances: list[Engine] = []

    def __init__(self, **kwargs) -> None:
        unknown = sorted(set(kwargs) - SERVER_ARGS)
        if unknown:
            raise TypeError(f"ServerArgs.__init__() got an unexpected keyword argument {unknown[0]!r}")
        if not os.path.exists(os.path.join(kwargs["model_path"], "config.json")):
            raise OSError(f"{kwargs['model_path']} has no config.json")
        self.kwargs = kwargs
        self.calls: list[tuple[str, tuple[str, ...]]] = []
        self.killed_tree: list[bool] = []
        self.drained: list[bool] = []
        self.offload_tags: set[str] = set()
        self.weights: dict = {}  # name -> the last tensor update_weights_from_tensor loaded
        handler = kwargs.get("custom_sigquit_handler")
        if handler is not None:
            signal.signal(signal.SIGQUIT, handler)
        self.scheduler = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        self._scheduler_init_result = SimpleNamespace(
            scheduler_infos=[{"max_total_num_tokens": self.kv_tokens}],
            all_child_pids=[self.scheduler.pid],
        )
        self.tokenizer_manager = _TokenizerManager(self)
        self.loop = asyncio.new_event_loop()  # SGLang's Engine.__init__, outside a running loop
        asyncio.set_event_loop(self.loop)
        Engine.instances.append(self)

    def get_all_child_pids(self) -> list[int]:
        return self._scheduler_init_result.all_child_pids

    def generate(self, input_ids=None, sampling_params=None):
        for _ in range(self.retractions):
            print(
                "[2026-11-21 12:00:00] KV cache pool is full. Retract requests. "
                "#retracted_reqs: 2, #new_tokens_gained: 512, #new_token_ratio: 0.7000 -> 1.0000",
                file=sys.stderr,
                flush=True,
            )
        if self.block_in_generate:  # as the offline Engine waits in its loop
            self.loop.run_until_complete(asyncio.sleep(30))
            raise AssertionError("nothing interrupted the blocked generation")
        outputs = []
        for prompt, params in zip(input_ids, sampling_params, strict=True):
            room = self.kv_tokens - len(prompt) - PAGE_SIZE - 1
            n = max(0, min(params["max_new_tokens"], room))
            outputs.append(
                {
                    "output_ids": [7] * n,
                    "meta_info": {
                        "prompt_tokens": len(prompt),
                        "completion_tokens": n,
                        "finish_reason": {"type": "length", "length": n},
                    },
                }
            )
        return self.loop.run_until_complete(self.tokenizer_manager.generate_request(outputs))

    def release_memory_occupation(self, tags=None):
        tags = tuple(tags or GPU_MEMORY_ALL_TYPES)
        self.offload_tags.update(tags)
        self.calls.append(("release", tags))

    def resume_memory_occupation(self, tags=None):
        tags = tuple(tags or GPU_MEMORY_ALL_TYPES)
        for tag in tags:
            self.offload_tags.remove(tag)  # KeyError for a tag not released, as SGLang
        self.calls.append(("resume", tags))

    def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True):
        """SGLang's signature; the tensors' values are kept (copied: the caller's buffer is
        reused) in ``weights``, and the answer is SGLang's ``(success, message)``."""
        for name, tensor in named_tensors:
            self.weights[name] = tensor.detach().clone()
        self.calls.append(("update_weights", tuple(name for name, _ in named_tensors)))
        if flush_cache:
            self.flush_cache()
        return True, "Succeeded to update model weights."

    def flush_cache(self):
        self.calls.append(("flush", ()))

    def shutdown(self):
        self.scheduler.kill()
        self.scheduler.wait()
        self.calls.append(("shutdown", ()))
