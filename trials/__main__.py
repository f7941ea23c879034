"""``python -m trials run --spec SPEC.json --out RESULT.json [--progress PROGRESS.json]``

Runs one trial in this fresh process and writes its ``TrialResult`` as JSON; logs go to
stderr. A trial over several GPUs (``trial_gpus > 1``) is coordinated from here: its
ranks run as ``python -m trials rank --spec SPEC.json --group GROUP.json --out ...``
(``trials.ranks``), in this process's group. ``--progress`` is rewritten at each phase
entry with the partial result, so a launcher that kills this process at its deadline can
still tell where it was.

When this process leads its own process group (``launch_trial`` starts it so), SIGTERM
kills the whole group at once (the engine's processes included), and the process asks
the kernel for SIGTERM when its parent dies, so an abandoned trial does not linger.
The ``__main__`` guard matters: vLLM spawns its engine by re-importing this module.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable


def _write_json(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _guard_process_group() -> None:
    if os.getpgrp() != os.getpid():
        return  # run by hand inside someone else's group: leave signals alone

    killing = threading.Event()
    descendants = _descendants_killer()  # imported now: not inside a signal handler

    def kill_group(signum: int, frame: object) -> None:
        # Re-entered (a second SIGTERM, or the parent watch beside a handler): the group
        # kill is all that is left to do.
        if not killing.is_set():
            killing.set()
            with contextlib.suppress(Exception):
                descendants()  # engine processes that left our group die too
        os.killpg(os.getpgrp(), signal.SIGKILL)

    signal.signal(signal.SIGTERM, kill_group)
    from trials.launcher import sigterm_when_parent_dies

    sigterm_when_parent_dies()
    if os.getppid() == 1:  # the parent died before prctl took effect
        kill_group(signal.SIGTERM, None)
    _watch_parent(kill_group)


def _watch_parent(kill_group: Callable[[int, object], None]) -> None:
    """Kill the group when the launcher dies, from a thread: a Python signal handler only
    runs when the main thread next executes bytecode, which a blocking call into CUDA or the
    engine can delay forever (seen on an H200: a vLLM EngineCore kept 78 GiB after its
    trial's launcher was killed)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        kill_group(signal.SIGKILL, None)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _descendants_killer() -> Callable[[], None]:
    """What kills every descendant by pid (the group kill misses one that made its own
    session). psutil is imported here, up front: imported by the SIGTERM handler, a second
    signal during the import met a half-initialised module (seen on an H200), and the
    descendants lived on."""
    try:
        import psutil
    except ImportError:
        return lambda: None

    def kill() -> None:
        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                child.kill()

    return kill


def _run(args: argparse.Namespace) -> int:
    from trials.errors import TrialError
    from trials.lengths import drawn
    from trials.types import TrialResult, TrialSpec

    with open(args.spec) as f:
        raw = f.read()
    try:
        spec = drawn(TrialSpec.from_json(raw))  # the batch is drawn here, in the trial's process
    except (TypeError, ValueError, KeyError, TrialError) as exc:
        trial_id = str(json.loads(raw).get("trial_id", "")) if raw.strip().startswith("{") else ""
        result = TrialResult(trial_id, "error", error_type="InvalidTrialSpec", error_message=str(exc))
        _write_json(args.out, result.to_json())
        return 0

    def progress(partial: TrialResult) -> None:
        if args.progress:
            _write_json(args.progress, partial.to_json())

    if args.command == "rank":
        from trials.ranks import RankGroup, rank_spec
        from trials.runner import run_trial as run_rank

        with open(args.group) as f:
            group = RankGroup.from_json(f.read())
        result = run_rank(rank_spec(spec, group.rank), on_progress=progress, group=group)
    elif spec.trial_gpus > 1:
        from trials.ranks import run_ranks

        result = run_ranks(spec, on_progress=progress)
    else:
        from trials import run_trial

        result = run_trial(spec, on_progress=progress)
    _write_json(args.out, result.to_json())
    logging.getLogger("trials").info("trial %s: %s in %.1f s", spec.trial_id, result.status, result.wall_s)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trials")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run one trial and write its result")
    run.add_argument("--spec", required=True, help="TrialSpec JSON file")
    run.add_argument("--out", required=True, help="where to write the TrialResult JSON")
    run.add_argument("--progress", default=None, help="partial result rewritten at each phase")
    rank = commands.add_parser("rank", help="run one rank of a trial over several GPUs")
    rank.add_argument("--spec", required=True, help="the trial's TrialSpec JSON file")
    rank.add_argument("--group", required=True, help="this rank's RankGroup JSON file")
    rank.add_argument("--out", required=True, help="where to write the rank's TrialResult JSON")
    rank.add_argument("--progress", default=None, help="partial result rewritten at each phase")
    args = parser.parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    _guard_process_group()
    return _run(args)


if __name__ == "__main__":
    sys.exit(main())
