"""Which layer of ours over ``sglang.Engine`` makes the first ``generate`` hang: a bisect on one GPU.

Usage, on the GPU host once ``benchmarks/gpu/setup-sglang.sh`` has made /tmp/site-sglang
(one device call, under 8 minutes with the default budget)::

    PYTHONPATH=/tmp/site-sglang:$PWD python3 benchmarks/gpu/sglang_smoke.py
    PYTHONPATH=/tmp/site-sglang:$PWD python3 benchmarks/gpu/sglang_smoke.py --variants D,E --budget-s 300

Each variant runs in a process of its own (its own session: at its timeout it is killed
with every SGLang process it started) and prints one line::

    A  ok     44.1s  engine 21.9s, reader on engine.loop: True, ..., 32/32 tokens | <stderr tail>
    X  hang   95.0s  engine 22.3s, ...; then nothing for 45 s | <stderr tail>

``hang``: no answer within ``--generate-timeout-s`` of the engine being up, or nothing at
all within ``--timeout-s``; the stacks of every thread are dumped into that variant's log
first (faulthandler, SIGUSR1). Logs: ``$OUT/sglang-smoke/`` (else /tmp/sglang-smoke).
Variants run in the order given; one that no longer fits in ``--budget-s`` is skipped.

- A: bare ``Engine(model_path=DIR, load_format="dummy", skip_tokenizer_init=True, ...)``
  (DIR holds only the model's ``config.json``, as ``trials.rollout.base.dummy_model_dir``
  makes it) and ``generate(input_ids=4 x 32 random ids, max_new_tokens=8, ignore_eos)``;
  the backend's other arguments, without memory saver, signal handling or stderr capture.
- B: A with ``enable_memory_saver`` and ``enable_weights_cpu_backup`` (as verl).
- C: B with ``custom_sigquit_handler`` and ``SglangBackend._take_over_sigquit``.
- D: ``SglangBackend.start`` / ``generate`` / ``shutdown``: the whole backend.
- E: D inside ``trials.runner.run_trial`` (StderrTail over fd 2, EngineWatch, warm-up).
- F: E through ``trials.launcher.launch_trial`` (``python -m trials run``: the trial's own
  process group and SIGTERM handler, a log file as fd 2), as jobs and the GPU tests run it.
- X: B with the take-over as it was before the fix (``auto_create_handle_loop`` called
  outside the running loop, so SGLang's output reader lands on a loop that never runs):
  expected to hang; it confirms the diagnosis.

Imports only the standard library here; the variants import SGLang and this repository's
``trials`` (what an sglang trial imports with /tmp/site-sglang) and its knob table
(``autotuner.knobs``, which imports no package beyond ``trials``), nothing of /tmp/site.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODEL_CONFIG = REPO / "autotuner" / "catalog" / "qwen2.5-0.5b.json"
VARIANTS = "ABCDEXF"
PROMPTS, PROMPT_TOKENS, NEW_TOKENS = 4, 32, 8
MARK = "SMOKE "


# ---------------------------------------------------------------- the variants (child)


def _say(event: str, **facts: object) -> None:
    print(MARK + json.dumps({"event": event, **facts}), flush=True)


def _config() -> dict:
    return json.loads(MODEL_CONFIG.read_text())


def _prompts(config: dict) -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(config["vocab_size"]) for _ in range(PROMPT_TOKENS)] for _ in range(PROMPTS)]


def _spec(trial_id: str):
    """The GPU tests' rollout shape, small: the backend's defaults otherwise (CUDA graphs)."""
    from autotuner.knobs import engine_arguments  # the knob table: no package beyond trials
    from trials.types import RolloutKnobs, TrialSpec

    return TrialSpec(
        trial_id=trial_id,
        model_name="qwen2.5-0.5b",
        model_config=_config(),
        device="cuda",
        phases=["rollout"],
        rollout=RolloutKnobs(engine="sglang", engine_args=engine_arguments("sglang")),
        prompt_lengths=[64] * 8,
        response_lengths=[16] * 8,
        device_memory_cap_gib=None,
        warmup_requests=PROMPTS,
    )


def _bare_kwargs(model_dir: str) -> dict:
    """``trials.rollout.sglang.engine_kwargs`` for ``_spec``, less memory saver and handler."""
    return {
        "model_path": model_dir,
        "load_format": "dummy",
        "skip_tokenizer_init": True,
        "dtype": "bfloat16",
        "mem_fraction_static": 0.5,
        "max_running_requests": 256,
        "tp_size": 1,
        "disable_cuda_graph": False,
        "chunked_prefill_size": 8192,
        "random_seed": 0,
        "log_level": "warning",
        "skip_server_warmup": True,
    }


def _loop_facts(engine) -> dict:
    manager = engine.tokenizer_manager
    reader = getattr(manager, "event_loop", None)
    return {
        "loop": type(engine.loop).__module__ + "." + type(engine.loop).__name__,
        "reader_on_engine_loop": None if reader is None else reader is engine.loop,
        "sigquit": repr(signal.getsignal(signal.SIGQUIT))[:80],
        "sigterm": repr(signal.getsignal(signal.SIGTERM))[:80],
    }


def _old_take_over(engine) -> None:
    """``SglangBackend._take_over_sigquit`` before the fix (commit 2093a0d)."""
    from trials.rollout.sglang import _on_sigquit

    sigterm = signal.getsignal(signal.SIGTERM)
    engine.tokenizer_manager.auto_create_handle_loop()
    engine.loop.remove_signal_handler(signal.SIGQUIT)
    signal.signal(signal.SIGQUIT, _on_sigquit)
    if engine.loop.remove_signal_handler(signal.SIGTERM):
        signal.signal(signal.SIGTERM, sigterm)


def _engine_variant(variant: str) -> None:
    """A, B, C, X: SGLang's Engine driven directly."""
    config = _config()
    model_dir = tempfile.mkdtemp(prefix="sglang-smoke-model-")
    (Path(model_dir) / "config.json").write_text(json.dumps(config))
    kwargs = _bare_kwargs(model_dir)
    if variant != "A":
        kwargs.update(enable_memory_saver=True, enable_weights_cpu_backup=True)
    if variant in "CX":
        from trials.rollout import sglang as ours

        kwargs["custom_sigquit_handler"] = ours._on_sigquit
        ours._sigquit_armed.set()
    t0 = time.perf_counter()
    from sglang.srt.entrypoints.engine import Engine

    import_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    engine = Engine(**kwargs)
    engine_s = time.perf_counter() - t0
    if variant == "C":
        backend = ours.SglangBackend()
        backend._engine = engine
        backend._take_over_sigquit()
    elif variant == "X":
        _old_take_over(engine)
    _say("engine_up", import_s=round(import_s, 1), engine_s=round(engine_s, 1), **_loop_facts(engine))
    params = [{"max_new_tokens": NEW_TOKENS, "ignore_eos": True, "temperature": 1.0}] * PROMPTS
    t0 = time.perf_counter()
    outputs = engine.generate(input_ids=_prompts(config), sampling_params=params)
    tokens = sum(len(o.get("output_ids") or []) for o in outputs)
    _say(
        "generated", generate_s=round(time.perf_counter() - t0, 2), tokens=tokens, asked=PROMPTS * NEW_TOKENS
    )
    engine.shutdown()


def _backend_variant() -> None:
    """D: the backend's start, generate, shutdown."""
    from trials.rollout.sglang import SglangBackend

    spec = _spec("smoke-d")
    backend = SglangBackend()
    try:
        engine_s = backend.start(spec, "bfloat16")
        _say(
            "engine_up",
            import_s=round(backend.import_s, 1),
            engine_s=round(engine_s, 1),
            **_loop_facts(backend._engine),
        )
        t0 = time.perf_counter()
        gen = backend.generate(_prompts(spec.model_config), [NEW_TOKENS] * PROMPTS)
        _say(
            "generated",
            generate_s=round(time.perf_counter() - t0, 2),
            tokens=sum(gen.generated_tokens),
            asked=PROMPTS * NEW_TOKENS,
        )
    finally:
        backend.shutdown()


def _result_facts(result) -> dict:
    m = result.metrics
    return {
        "status": result.status,
        "phase": result.phase,
        "error": result.error_message,
        "tokens": m.get("rollout_generated_tokens"),
        "engine_s": m.get("engine_startup_s"),
        "generate_s": m.get("rollout_makespan_s"),
        "log_tail": (result.log_tail or "")[-1500:],
    }


def _trial_variant() -> None:
    """E: run_trial in this process."""
    from trials.runner import run_trial

    spec = _spec("smoke-e")

    def progress(result) -> None:
        if result.phase == "rollout":
            _say("engine_up", engine_s=result.metrics.get("engine_startup_s"))

    result = run_trial(spec, on_progress=progress)
    _say(
        "generated" if result.status == "ok" else "failed",
        asked=sum(spec.response_lengths),
        **_result_facts(result),
    )


def _launched_variant(timeout_s: float) -> None:
    """F: the launcher, as jobs and the GPU tests run a trial."""
    from trials.launcher import launch_trial

    spec = _spec("smoke-f")
    result = launch_trial(
        spec, timeout_s=timeout_s, python=sys.executable, env={"PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    )
    _say(
        "generated" if result.status == "ok" else "failed",
        asked=sum(spec.response_lengths),
        **_result_facts(result),
    )


def child(variant: str, timeout_s: float) -> None:
    import faulthandler

    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the parent asks on a hang
    try:
        if variant in "ABCX":
            _engine_variant(variant)
        elif variant == "D":
            _backend_variant()
        elif variant == "E":
            _trial_variant()
        else:
            _launched_variant(timeout_s - 15)
    except BaseException as exc:
        _say("failed", error=f"{type(exc).__name__}: {exc}"[:500])
        raise


# ---------------------------------------------------------------- the driver (parent)


def _events(path: Path) -> list[dict]:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [json.loads(line[len(MARK) :]) for line in lines if line.startswith(MARK)]


def _last_lines(path: Path, events: list[dict], n: int = 3) -> str:
    """The last ``n`` lines of the variant's stderr, or of its trial's log (E, F)."""
    tail = next((e["log_tail"] for e in events if e.get("log_tail")), None)
    try:
        text = tail if tail is not None else path.read_text(errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in text.splitlines()]
    lines = [line for line in lines if line and not line.startswith(MARK)]
    return " \u23ce ".join(line[-220:] for line in lines[-n:])


def _kill(proc: subprocess.Popen, dump: bool) -> None:
    if dump and proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGUSR1)  # faulthandler: every thread's stack
            time.sleep(1.5)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def _main_thread_at(stderr: Path, frames: int = 3) -> str:
    """The innermost frames of the thread that took faulthandler's dump (the main one)."""
    try:
        lines = stderr.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    starts = [i for i, line in enumerate(lines) if line.startswith("Current thread")]
    if not starts:
        return ""
    stack = [line.strip() for line in lines[starts[-1] + 1 : starts[-1] + 1 + frames]]
    return "; main thread at: " + " < ".join(stack)


def _gpu_used_mib() -> int | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
        return max(int(x) for x in out.split())
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def _wait_gpu_free(wait_s: float = 30.0) -> str:
    deadline = time.monotonic() + wait_s
    used = _gpu_used_mib()
    while used is not None and used > 1024 and time.monotonic() < deadline:
        time.sleep(1.0)
        used = _gpu_used_mib()
    return "" if used is None or used <= 1024 else f" (GPU still holds {used} MiB)"


def _summary(events: list[dict]) -> str:
    up = next((e for e in events if e["event"] == "engine_up"), {})
    end = next((e for e in events if e["event"] in ("generated", "failed")), {})
    parts = []
    if up:
        parts.append(f"engine {up.get('engine_s')}s")
        if "reader_on_engine_loop" in up:
            parts.append(f"reader on engine.loop: {up['reader_on_engine_loop']}, {up['loop']}")
    if end.get("generate_s") is not None:
        parts.append(f"generate {end['generate_s']}s")
    if end.get("tokens") is not None:
        parts.append(f"{end['tokens']}/{end.get('asked')} tokens")
    if end.get("status"):
        parts.append(f"trial {end['status']} in {end.get('phase')}")
    if end.get("error"):
        parts.append(str(end["error"])[:300])
    return ", ".join(parts)


def run_variant(variant: str, out: Path, timeout_s: float, generate_timeout_s: float) -> dict:
    stdout, stderr = out / f"{variant}.out", out / f"{variant}.err"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", variant, "--timeout-s", str(timeout_s)]
    t0 = time.monotonic()
    with open(stdout, "w") as so, open(stderr, "w") as se:
        proc = subprocess.Popen(cmd, stdout=so, stderr=se, cwd=REPO, start_new_session=True)
    verdict, why, up_at, tail = "", "", None, None
    while True:
        time.sleep(0.5)
        now = time.monotonic()
        events = _events(stdout)
        kinds = {e["event"] for e in events}
        if up_at is None and "engine_up" in kinds:
            up_at = now
        if "generated" in kinds or "failed" in kinds:
            verdict = "ok" if "generated" in kinds and _tokens_ok(events) else "error"
            elapsed = now - t0
            try:  # let it shut its engine down, briefly
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                why = "; shutdown took over 30 s"
            _kill(proc, dump=False)
            break
        if proc.poll() is not None:
            verdict, why, elapsed = "error", f"; exited with {proc.returncode} before an answer", now - t0
            break
        late = up_at is not None and now - up_at > generate_timeout_s
        if late or now - t0 > timeout_s:
            verdict, elapsed = "hang", now - t0
            why = (
                f"; then nothing for {generate_timeout_s:.0f} s"
                if late
                else f"; nothing in {timeout_s:.0f} s"
            )
            tail = _last_lines(stderr, events)  # before the stack dump
            _kill(proc, dump=True)
            why += _main_thread_at(stderr)
            break
    events = _events(stdout)
    tail = _last_lines(stderr, events) if tail is None else tail
    line = f"{variant}  {verdict:<5} {elapsed:6.1f}s  {_summary(events)}{why}{_wait_gpu_free()} | {tail}"
    print(line, flush=True)
    return {
        "variant": variant,
        "verdict": verdict,
        "seconds": round(elapsed, 1),
        "events": events,
        "line": line,
    }


def _tokens_ok(events: list[dict]) -> bool:
    end = next(e for e in events if e["event"] in ("generated", "failed"))
    return end.get("tokens") is None or end.get("tokens") == end.get("asked")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, in order")
    parser.add_argument("--budget-s", type=float, default=420.0, help="all variants together")
    parser.add_argument("--timeout-s", type=float, default=120.0, help="one variant, at most")
    parser.add_argument(
        "--generate-timeout-s", type=float, default=45.0, help="once the engine is up, the first answer"
    )
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "/tmp"), "sglang-smoke"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.timeout_s)
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(
        f"sglang smoke: python {sys.version.split()[0]}, PYTHONPATH={os.environ.get('PYTHONPATH', '')}, "
        f"logs in {out}",
        flush=True,
    )
    start, results = time.monotonic(), []
    for variant in [v.strip().upper() for v in args.variants.split(",") if v.strip()]:
        if variant not in VARIANTS:
            parser.error(f"unknown variant {variant!r}; variants: {', '.join(VARIANTS)}")
        left = args.budget_s - (time.monotonic() - start)
        if left < 60:
            print(f"{variant}  skip   {left:5.0f}s left of --budget-s {args.budget_s:.0f}", flush=True)
            continue
        results.append(run_variant(variant, out, min(args.timeout_s, left), args.generate_timeout_s))
    (out / "summary.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
