"""verl's per-step metrics, read back from what its loggers wrote.

verl's ``console`` logger prints one line per step (``verl.utils.logger.aggregate_logger.
concat_dict_to_str``): ``step:3 - timing_s/gen:12.5 - perf/throughput:np.float64(4021.7)
- ...``, each value as ``pprint.pformat`` writes it (numpy 2 scalars as ``np.float64(..)``);
its ``file`` logger writes one JSON object per step, ``{"step": 3, "data": {...}}``, to
``VERL_FILE_LOGGER_PATH``. Either is parsed into ``{step: {metric: value}}``; ``summarize``
keeps ``STEP_METRICS`` and every timing and performance figure (``KEPT_PREFIXES``: the agent
loop's timings, the passes' MFU) of each step, and takes the median of each of
``STEP_METRICS`` over the steps after the warm-up.
Imports nothing of verl: the launcher reads a killed run's steps too.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Iterable
from pathlib import Path

from trials.verl.types import KEPT_PREFIXES, STEP_METRICS

_STEP = re.compile(r"(?:^|\s)step:(\d+) - ")
# A value as pprint writes a number: 1.5, -3, 1e-05, nan, inf, np.float64(2.0), np.int64(7).
_NUMBER = re.compile(r"^(?:np\.\w+\((?P<wrapped>[^()]*)\)|(?P<plain>[-+\w.]+))$")

Steps = dict[int, dict[str, float]]


def _number(text: str) -> float | None:
    match = _NUMBER.match(text.strip())
    if match is None:
        return None
    raw = match.group("wrapped") if match.group("wrapped") is not None else match.group("plain")
    try:
        return float(raw)
    except ValueError:
        return None


def parse_console_line(line: str) -> tuple[int, dict[str, float]] | None:
    """``(step, metrics)`` of one console-logger line, or None for any other line."""
    match = _STEP.search(line)
    if match is None:
        return None
    metrics: dict[str, float] = {}
    for field in line[match.end() :].rstrip("\n").split(" - "):
        name, sep, value = field.partition(":")
        number = _number(value) if sep else None
        if number is not None:
            metrics[name.strip()] = number
    return int(match.group(1)), metrics


def parse_console(lines: Iterable[str]) -> Steps:
    """Every step the console logger printed (a step printed twice: its last line)."""
    steps: Steps = {}
    for line in lines:
        parsed = parse_console_line(line)
        if parsed is not None and parsed[1]:
            steps[parsed[0]] = parsed[1]
    return steps


def parse_jsonl(lines: Iterable[str]) -> Steps:
    """Every step the file logger wrote; a torn last line (a killed run) is skipped."""
    steps: Steps = {}
    for line in lines:
        try:
            record = json.loads(line)
            data = record["data"]
            step = int(record["step"])
        except (ValueError, KeyError, TypeError):
            continue
        steps[step] = {
            k: float(v) for k, v in data.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
    return steps


def read_steps(metrics_file: Path, log_file: Path) -> Steps:
    """The file logger's steps, or the console's where the file has none."""
    for path, parse in ((metrics_file, parse_jsonl), (log_file, parse_console)):
        try:
            with open(path, errors="replace") as f:
                steps = parse(f)
        except OSError:
            continue
        if steps:
            return steps
    return {}


def _kept(name: str) -> bool:
    return name in STEP_METRICS or name.startswith(KEPT_PREFIXES)


def summarize(steps: Steps, warmup_steps: int) -> tuple[list[dict[str, float]], dict[str, float]]:
    """Each step's kept metrics in step order, and the medians of ``STEP_METRICS`` after the
    warm-up."""
    ordered = [{k: v for k, v in steps[s].items() if _kept(k)} for s in sorted(steps)]
    measured: dict[str, float] = {}
    for name in STEP_METRICS:
        values = [m[name] for m in ordered[warmup_steps:] if name in m and math.isfinite(m[name])]
        if values:
            measured[name] = statistics.median(values)
    return ordered, measured


class StepClock:
    """When each of verl's steps reached the file logger, in seconds since ``start``: polled
    while verl runs and kept in ``record`` as steps arrive, so a run's start-up (the first
    step's arrival less its own ``timing_s/step``) and the pace of its steps are known, even
    for a run killed before it ended (``read_arrivals``)."""

    def __init__(self, metrics_file: Path, record: Path, start: float) -> None:
        self.path = Path(metrics_file)
        self.record = Path(record)
        self.start = start
        self.arrived: dict[int, float] = {}

    def poll(self, now: float) -> None:
        try:
            text = self.path.read_text(errors="replace")
        except OSError:
            return
        new = {s: round(now - self.start, 3) for s in parse_jsonl(text.splitlines()) if s not in self.arrived}
        if new:
            self.arrived |= new
            self.record.write_text(json.dumps(self.ordered()))

    def ordered(self) -> list[float]:
        """Each logged step's arrival, in step order."""
        return [self.arrived[s] for s in sorted(self.arrived)]


def read_arrivals(record: Path) -> list[float]:
    """What a ``StepClock`` kept in ``record``; none where it kept nothing."""
    try:
        values = json.loads(Path(record).read_text())
    except (OSError, ValueError):
        return []
    return [float(v) for v in values] if isinstance(values, list) else []
