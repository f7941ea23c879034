"""The `autotuner` command: tune, demo, resume, export, jobs, verify, doctor, models; serve
the API, and submit, status (and export --server) as its client."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
import uuid
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, NoReturn

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from autotuner import catalog, hardware
from autotuner.api.service import JobService
from autotuner.errors import AutotunerError
from autotuner.jobs import JobContext, execute, runner_id, take_over
from autotuner.noise import versus
from autotuner.records import SKIPPED_STATUSES, TrialRecord, TrialStatus
from autotuner.settings import Settings, get_settings
from autotuner.spec import JobSpec, load_job_spec, parse_job_spec
from autotuner.study import RunHooks
from autotuner.summary import JobSummary, Runs, front, hosts_line, runs_of
from autotuner.verl_results import errors_phrase, runs_phrase
from storage import JobRecord, StorageError
from trials.launcher import engine_fix
from trials.metrics import THROUGHPUT
from trials.verl import VERL

# How long the server keeps an idle connection open: longer than clients keep theirs (httpx
# and the CLI: 5 s), so that a client drops an idle connection before the server closes it.
# With equal timeouts a request sent as the server closes the connection is lost ("Server
# disconnected without sending a response"), a failure a stalled client on a loaded host meets.
KEEP_ALIVE_S = 30

if TYPE_CHECKING:
    import httpx

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Find the fastest verl RL-training config by measuring real trials.",
)
# Tables are wide (knob names): don't squeeze them into 80 columns when piped.
console = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True)


def say(line: str) -> None:
    """Print one line of text as it is: no markup (job names and errors may hold brackets)
    and no wrapping, so a long line stays one line for whoever reads or greps it."""
    console.print(line, markup=False, highlight=False, soft_wrap=True)


OutDir = Annotated[Path, typer.Option("--out", "-o", help="Where the chosen config is written.")]
TokenOpt = Annotated[
    str | None,
    typer.Option(
        envvar="AUTOTUNER_API_TOKEN",
        show_default=False,
        help="Bearer token of the autotuner server (default: AUTOTUNER_API_TOKEN).",
    ),
]


def _fail(message: str, code: int = 2) -> NoReturn:
    err.print(f"[bold red]error:[/] {message}")
    raise typer.Exit(code)


def _context() -> JobContext:
    try:
        return JobContext.open(get_settings())
    except (StorageError, ValueError) as exc:
        _fail(str(exc))


class _ProgressHooks(RunHooks):
    """Progress bar with ETA; one line per finished trial."""

    def __init__(self, progress: Progress, task: TaskID, total: int, already: int) -> None:
        super().__init__(on_record=self._record, on_start=self._start)
        self.progress, self.task, self.total = progress, task, total
        self.started = time.monotonic()
        self.done = already
        self.fresh = 0
        progress.update(task, completed=already)

    def _start(self, number: int, trial_id: str) -> None:
        self.progress.update(self.task, description=f"trial {number} running")

    def _record(self, rec: TrialRecord) -> None:
        if rec.skipped or rec.repeat_of is not None:
            self.progress.console.print(_trial_line(rec), markup=False, highlight=False, soft_wrap=True)
        if not rec.measured:
            return
        self.done += 1
        self.fresh += 1
        per_trial = (time.monotonic() - self.started) / self.fresh
        eta = per_trial * max(self.total - self.done, 0)
        self.progress.update(self.task, completed=self.done, description=f"ETA {eta / 60:.1f} min")
        self.progress.console.print(_trial_line(rec), markup=False, highlight=False, soft_wrap=True)


def _trial_line(rec: TrialRecord) -> str:
    again = f"  (re-run of #{rec.repeat_of})" if rec.repeat_of is not None else ""
    predicted = rec.predicted_memory_gib.get("peak")
    error = rec.memory_error_gib.get("peak")
    model = (
        f"  predicted {predicted:.2f} GiB ({error:+.2f})"
        if predicted is not None and error is not None
        else ""
    )
    if rec.status == TrialStatus.OK:
        return (
            f"  trial {rec.number:>3}  ok       {rec.metric(THROUGHPUT) or 0:10.1f} tok/s/GPU  "
            f"peak {rec.metric('peak_memory_gib') or 0:6.2f} GiB{model}{again}"
        )
    if rec.skipped:
        return f"  trial {rec.number:>3}  {rec.status:<13} not run: {rec.error_message or ''}"
    return f"  trial {rec.number:>3}  {rec.status:<8} phase={rec.phase}  {rec.error_type or ''}{again}"


def _verl_line(number: int, verified: dict[str, Any]) -> str:
    """One verified trial: verl's median throughput and spread, the trial's error per phase."""
    median = verified.get("throughput_median")
    if median is None:
        why = verified.get("error") or ""
        return f"  trial {number:>3}  verl     not measured ({verified['status']}): {why}"
    runs = runs_phrase(verified)
    errors = errors_phrase(verified)
    return f"  trial {number:>3}  verl     {median:10.1f} tok/s/GPU ({runs}); trial off by: {errors or 'n/a'}"


def _say_verl_pick(summary: JobSummary) -> None:
    """What verl said of the winner it picked, inside its noise (nothing unless verl picked)."""
    line = summary.verl_gain_line()
    if line:
        say(line)


def _say_winner(number: int, summary: JobSummary) -> None:
    say(f"winner: trial {number}, picked by {summary.winner_source}")
    _say_verl_pick(summary)


def _memory_line(summary: JobSummary) -> str | None:
    errors = summary.memory_model_errors.get("peak")
    if not errors:
        return None
    skipped = sum(summary.counts.get(s, 0) for s in SKIPPED_STATUSES)
    pct = errors["mean_abs_error_pct"]
    return (
        f"memory model: peak predicted within {errors['mean_abs_error_gib']:.2f} GiB"
        + (f" ({pct:.1f}%)" if pct is not None else "")
        + f" on average over {errors['trials']} trials (worst {errors['max_abs_error_gib']:.2f} GiB); "
        f"{skipped} proposals skipped as known not to fit"
    )


def _short(path: str, among: list[str]) -> str:
    """The shortest dotted suffix of ``path`` that no other path in ``among`` ends with."""
    parts = path.split(".")
    for i in range(len(parts) - 1, -1, -1):
        suffix = ".".join(parts[i:])
        if not [p for p in among if p != path and (p == suffix or p.endswith("." + suffix))]:
            return suffix
    return path


def _pareto_table(spec: JobSpec, recs: list[TrialRecord], summary: JobSummary) -> Table:
    table = Table(title=f"Pareto front ({len(summary.pareto)} of {len(recs)} trials)")
    for col in (
        "trial",
        "tok/s/GPU (median)",
        "n",
        "spread %",
        "peak GiB",
        "step s",
        "rollout gen tok/s",
        "knobs",
    ):
        table.add_column(col, justify="right" if col != "knobs" else "left")
    by_number = {r.number: r for r in recs}
    # Show the knobs that differ between measured trials: the ones the search moved.
    measured = [r.config for r in recs if r.measured and r.config]
    varied = sorted({k for c in measured for k in c if len({json.dumps(m.get(k)) for m in measured}) > 1})
    runs = runs_of(recs)
    for number in summary.pareto:
        r = by_number[number]
        over = runs.get(number) or Runs(r, [r.metric(THROUGHPUT) or 0.0])
        mark = " *" if number == summary.best else ""
        knobs = " ".join(f"{_short(k, varied)}={r.config[k]}" for k in varied if k in r.config)
        table.add_row(
            f"{number}{mark}",
            f"{over.median:.1f}",
            str(over.n),
            f"{over.spread_pct:.1f}" if over.spread_pct is not None else "",
            f"{r.metric('peak_memory_gib') or 0:.2f}",
            f"{r.metric('step_time_s') or 0:.2f}",
            f"{r.metric('rollout_generated_tokens_per_s') or 0:.1f}",
            knobs,
        )
    return table


def _write_configs(service: JobService, job_id: str, number: int, out: Path) -> list[Path]:
    """The trial's verl YAML and Hydra overrides, as the service exports them, in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in ("yaml", "overrides"):
        exported = service.export_config(job_id, number, fmt)
        path = out / exported.filename
        path.write_text(exported.text)
        paths.append(path)
    return paths


def _run(ctx: JobContext, job: JobRecord, spec: JobSpec, out: Path) -> None:
    console.print(
        f"job [bold]{job.id}[/] ({spec.name}): up to {spec.budget.max_trials} trials, "
        f"database {ctx.database.masked_url}"
    )
    service = JobService(ctx)
    already = sum(1 for r in service.get_job(job.id).records if r.measured)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        task = progress.add_task("starting", total=spec.budget.max_trials)
        hooks = _ProgressHooks(progress, task, spec.budget.max_trials, already)
        try:
            summary = execute(ctx, job.id, hooks)
        except AutotunerError as exc:
            _fail(str(exc))
    view = service.get_job(job.id)
    say(f"stopped: {summary.stop_reason}; outcomes: {summary.counts}")
    say(summary.cost_line())
    console.print(_pareto_table(spec, view.records, summary))
    chosen = view.best
    if chosen is None:
        _fail(f"no trial succeeded; see the errors above (`autotuner jobs {job.id}` lists them)", 1)
    memory = _memory_line(summary)
    if memory:
        say(memory)
    for number, verified in summary.verl.items():
        say(_verl_line(number, verified))
    say(_best_line(summary, chosen.device))
    say(f"winner picked by {summary.winner_source}")
    _say_verl_pick(summary)
    say(summary.noise_line())
    hosts = summary.hosts_line()
    if hosts:
        say(hosts)
    for line in summary.versus_lines():
        say(f"  {line}")
    try:
        for path in _write_configs(service, job.id, chosen.number, out):
            say(f"wrote {path}")
    except AutotunerError as exc:  # e.g. verl's own validation refuses the config
        say(f"not written: {exc}")
    finally:
        service.close()


def _best_line(summary: JobSummary, device: str) -> str:
    """``best: trial N: ... tok/s/GPU (...), 1.25x verl's defaults on DEVICE``; a tie with
    verl's defaults names the band that comparison used."""
    band = summary.band_over_baseline if summary.band_over_baseline is not None else summary.tie_band_pct
    defaults = versus(summary.gain_over_baseline, summary.verdict_over_baseline, band, "verl's defaults")
    gain = f", {defaults}" if summary.gain_over_baseline else ""
    return f"best: {summary.best_line()}{gain} on {device}"


@app.command()
def tune(
    job_file: Annotated[Path, typer.Argument(help="Job spec (YAML or JSON).")],
    out: OutDir = Path("autotuner-out"),
) -> None:
    """Tune a job spec: run trials, print the Pareto front, write the chosen verl config."""
    try:
        spec = load_job_spec(job_file)
    except AutotunerError as exc:
        _fail(str(exc))
    ctx = _context()
    job = ctx.submit(spec)
    ctx.store.claim(job.id, runner_id())
    _run(ctx, job, spec, out)


@app.command()
def demo(
    out: OutDir = Path("autotuner-out"),
    trials: Annotated[int | None, typer.Option(help="Override the demo's trial count.")] = None,
) -> None:
    """Tune the tiny built-in model on this CPU with real vLLM and torch (the embedded default)."""
    import yaml

    data = yaml.safe_load(resources.files("autotuner").joinpath("examples/demo.yaml").read_text())
    if trials is not None:
        data["budget"]["max_trials"] = trials
    spec = parse_job_spec(data)
    ctx = _context()
    job = ctx.submit(spec)
    ctx.store.claim(job.id, runner_id())
    _run(ctx, job, spec, out)


@app.command()
def resume(job_id: str, out: OutDir = Path("autotuner-out")) -> None:
    """Resume a job whose tuner process stopped: finished trials are kept, not re-run."""
    ctx = _context()
    try:
        job = take_over(ctx, job_id)
    except (StorageError, AutotunerError) as exc:
        _fail(str(exc))
    _run(ctx, job, ctx.spec_of(job), out)


@app.command("export")
def export_cmd(
    job_id: str,
    trial: Annotated[int | None, typer.Option(help="Trial number; default: the best.")] = None,
    fmt: Annotated[Literal["yaml", "overrides"], typer.Option("--format")] = "yaml",
    max_peak_memory_gib: Annotated[
        float | None, typer.Option(help="Choose the best trial under this peak memory.")
    ] = None,
    server: Annotated[
        str | None, typer.Option(help="Fetch it from this autotuner server instead of the local database.")
    ] = None,
    token: TokenOpt = None,
) -> None:
    """Print a trial's config as verl YAML or Hydra overrides."""
    if server is not None:
        sys.stdout.write(_remote_export(server, token, job_id, trial, fmt, max_peak_memory_gib))
        return
    service = JobService(_context())
    try:
        number = trial if trial is not None else service.best_trial(job_id, max_peak_memory_gib)[0].number
        sys.stdout.write(service.export_config(job_id, number, fmt).text)
    except (StorageError, AutotunerError) as exc:
        _fail(str(exc))
    finally:
        service.close()


@app.command()
def jobs(job_id: Annotated[str | None, typer.Argument(help="Show one job's trials.")] = None) -> None:
    """List jobs, or show one job's trials."""
    service = JobService(_context())
    if job_id is None:
        views, count = service.list_jobs(status=None, offset=0, limit=50)
        rows = [view.job for view in views]
        table = Table(title=f"{count} jobs")
        for col in ("id", "name", "status", "trials", "created", "stop reason"):
            table.add_column(col)
        for j in rows:
            table.add_row(
                j.id,
                j.name,
                j.status,
                f"{j.trials_done}/{j.trials_total}",
                j.created_at.strftime("%Y-%m-%d %H:%M"),
                j.stop_reason or "",
            )
        console.print(table)
        return
    try:
        view = service.get_job(job_id)
    except StorageError as exc:
        _fail(str(exc))
    job = view.job
    pareto = {r.number for r in front(view.spec, view.records)}
    say(f"job {job.id} {job.name}: {job.status} ({job.stop_reason or ''})")
    verified = view.verified
    for r in view.records:
        line = _trial_line(r) + ("  [pareto]" if r.number in pareto else "")
        line += "  [verl]" if r.number in verified else ""
        if r.status != TrialStatus.OK and r.error_message:
            line += f"  {r.error_message.splitlines()[-1][:120]}"
        say(line)
        if r.number in verified:
            say(_verl_line(r.number, verified[r.number]))
    winner = view.best
    if winner is not None:
        _say_winner(winner.number, view.summary)


@app.command()
def verify(
    job_id: str,
    trial: Annotated[
        list[int] | None,
        typer.Option(
            help="A trial to run in verl (repeat for more); default: the baselines and the "
            "fastest front trials."
        ),
    ] = None,
) -> None:
    """Run a finished job's trials in verl itself (interleaved, budget.verify_rounds runs each)
    and record them beside the trials; print what verl measured."""
    service = JobService(_context())
    try:
        view = service.verify(job_id, trial or None)
    except (StorageError, AutotunerError) as exc:
        _fail(str(exc))
    finally:
        service.close()
    verified = view.verified
    numbers = trial or sorted(verified)
    for number in numbers:
        if number in verified:
            say(_verl_line(number, verified[number]))
    winner = view.best
    if winner is not None:
        _say_winner(winner.number, view.summary)


@app.command()
def models() -> None:
    """List the built-in model architectures."""
    from autotuner.spec import resolve_model

    for name in catalog.catalog_names():
        arch = resolve_model(name)
        console.print(
            f"{name:<14} {arch.num_parameters / 1e9:6.2f}B params  layers={arch.num_layers} "
            f"heads={arch.num_attention_heads}/{arch.num_key_value_heads}"
        )


def _engine_importable(module: str, python: str, env: dict[str, str] | None = None) -> tuple[bool, str]:
    probe = f"import {module}; print({module}.__version__)"
    child_env = {**os.environ, **(env or {})}
    try:
        out = subprocess.run(
            [python, "-c", probe], capture_output=True, text=True, timeout=180, env=child_env
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    if out.returncode == 0:
        return True, out.stdout.strip().splitlines()[-1]
    return False, (out.stderr.strip().splitlines() or ["failed"])[-1]


def _doctor_verl(settings: Settings) -> None:
    """verl's own environment (``trials.verl``): optional, it only verifies configs in verl."""
    python = settings.verl_python()
    pythonpath = settings.engine_pythonpath.get(VERL)
    good, detail = _engine_importable("verl", python, {"PYTHONPATH": pythonpath} if pythonpath else None)
    where = f"{python}, PYTHONPATH={pythonpath}" if pythonpath else python
    state = "ok " + detail if good else "not importable (" + detail + ")"
    say(f"verl: {state} (in {where})")
    if not good:
        say(f"  runs in verl need it: {engine_fix(VERL)}")


@app.command()
def doctor() -> None:
    """Check GPUs (NVML), engines, torch, the database and Ray."""
    settings = get_settings()
    ok = True
    gpus = hardware.gpus()
    console.print(
        f"GPUs: {', '.join(f'{g.name} ({g.memory_gib:.0f} GiB)' for g in gpus) or 'none'}"
        f" -> trials run on {'cuda' if gpus else hardware.describe_cpu()}"
    )
    # Each engine in the environment its trials get (AUTOTUNER_ENGINE_PYTHON__<ENGINE>,
    # AUTOTUNER_ENGINE_PYTHONPATH__<ENGINE>); only vLLM, the default engine, is required.
    for module in ("torch", "vllm", "sglang"):
        engine = "vllm" if module == "torch" else module
        python = settings.python_for(engine) or sys.executable
        pythonpath = settings.engine_pythonpath.get(engine)
        env = {"PYTHONPATH": pythonpath} if pythonpath else None
        good, detail = _engine_importable(module, python, env)
        where = f"{python}, PYTHONPATH={pythonpath}" if pythonpath else python
        say(f"{module}: {'ok ' + detail if good else 'not importable (' + detail + ')'} (in {where})")
        if not good and module == "sglang":
            say(f"  sglang jobs need it: {engine_fix('sglang')}")
        ok &= good or module == "sglang"
    _doctor_verl(settings)
    try:
        ctx = JobContext.open(settings)
        say(f"database: ok ({ctx.database.masked_url})")
    except (StorageError, ValueError) as exc:
        say(f"database: FAILED ({exc})")
        ok = False
    try:
        from autotuner.executor import cluster_resources, ensure_ray

        ensure_ray(settings.ray_address, settings.ray_num_cpus)
        say(f"ray: ok ({json.dumps(cluster_resources())})")
    except Exception as exc:  # Ray raises many types on connection failures
        say(f"ray: FAILED ({exc})")
        ok = False
    raise typer.Exit(0 if ok else 1)


# --------------------------------------------------------------------------- the service


@app.command()
def serve(
    host: Annotated[
        str | None, typer.Option(help="Address to bind (default: AUTOTUNER_HOST, else 127.0.0.1).")
    ] = None,
    port: Annotated[int | None, typer.Option(help="Port (default: AUTOTUNER_PORT, else 8000).")] = None,
    log_level: Annotated[str, typer.Option(help="uvicorn's log level.")] = "info",
) -> None:
    """Run the HTTP API (docs at /docs) and its job runner."""
    from pydantic import ValidationError

    from autotuner.settings import Settings

    overrides: dict[str, Any] = {k: v for k, v in {"host": host, "port": port}.items() if v is not None}
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        _fail("; ".join(_setting_problem(e) for e in exc.errors()))
    import optuna
    import uvicorn

    from autotuner.api.app import create_app

    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    ours = logging.getLogger("autotuner")
    ours.addHandler(handler)
    ours.setLevel(logging.INFO)
    ours.propagate = False
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=log_level,
        timeout_keep_alive=KEEP_ALIVE_S,
    )


def _setting_problem(error: Any) -> str:
    msg = str(error["msg"]).removeprefix("Value error, ")
    loc = ".".join(str(p) for p in error["loc"])
    return f"AUTOTUNER_{loc.upper()}: {msg}" if loc else msg


ServerOpt = Annotated[str, typer.Option(help="The autotuner server's URL.")]
DEFAULT_SERVER = "http://127.0.0.1:8000"


def _request(
    method: str, server: str, path: str, token: str | None, retries: int = 0, **kwargs: Any
) -> httpx.Response:
    """One request; ``retries``: how many times to send it again after a timeout, a lost
    connection or a 503 (only for a request safe to repeat, such as a submission with an
    Idempotency-Key)."""
    import httpx

    headers = dict(kwargs.pop("headers", {}))
    if token:
        headers["Authorization"] = f"Bearer {token}"
    url = server.rstrip("/") + path
    for attempt in range(retries + 1):
        try:
            response = httpx.request(method, url, headers=headers, timeout=60, **kwargs)
        except httpx.HTTPError as exc:
            if attempt < retries and isinstance(exc, httpx.TransportError):
                time.sleep(2**attempt)
                continue
            _fail(f"cannot reach the autotuner server at {server}: {exc}")
        if response.status_code == 503 and attempt < retries:
            time.sleep(2**attempt)
            continue
        break
    if response.status_code >= 400:
        _fail(f"{method} {url}: {response.status_code} {_problem(response)}")
    return response


def _problem(response: httpx.Response) -> str:
    """The server's error body in one line, naming each field."""
    try:
        detail = response.json().get("detail")
    except ValueError:
        return response.text[:500]
    if isinstance(detail, list):
        parts = []
        for item in detail:
            loc = [str(p) for p in item.get("loc", [])]
            loc = loc[1:] if loc[:1] == ["body"] else loc
            parts.append(f"{'.'.join(loc) or '(job)'}: {item.get('msg')}")
        return "; ".join(parts)
    return str(detail)


@app.command()
def submit(
    job_file: Annotated[Path, typer.Argument(help="Job spec (YAML or JSON).")],
    server: ServerOpt = DEFAULT_SERVER,
    token: TokenOpt = None,
) -> None:
    """Queue a job spec on an autotuner server; print the job's id and URL."""
    try:
        text = job_file.read_bytes()
    except OSError as exc:
        _fail(f"cannot read {job_file}: {exc.strerror}")
    media = "application/json" if job_file.suffix.lower() == ".json" else "application/yaml"
    # One key per submission: the retries after a timeout send it again, and get the job the
    # first attempt created instead of a second one.
    headers = {"Content-Type": media, "Idempotency-Key": uuid.uuid4().hex}
    created = _request("POST", server, "/v1/jobs", token, retries=3, content=text, headers=headers).json()
    say(f"job {created['id']} {created['status']}: {created['url']}")


@app.command()
def status(
    job_id: str,
    server: ServerOpt = DEFAULT_SERVER,
    token: TokenOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the server's JSON.")] = False,
) -> None:
    """Show a job's status on an autotuner server: trials, best so far, elapsed, ETA."""
    job = _request("GET", server, f"/v1/jobs/{job_id}", token).json()
    if as_json:
        sys.stdout.write(json.dumps(job, indent=2) + "\n")
        return
    say(
        f"job {job['id']} ({job['name']}): {job['status']}"
        + (f" ({job['stop_reason']})" if job.get("stop_reason") else "")
    )
    say(f"  trials: {job['trials_done']}/{job['trials_total']}")
    if job.get("best"):
        b = job["best"]
        runs = b.get("runs")
        spread = (
            f" (median of {runs['runs']} runs, spread {runs['spread_pct'] or 0:.1f}%)"
            if runs and runs["runs"] >= 2
            else " (1 run)"
        )
        say(
            f"  best so far: trial {b['number']}, "
            f"{b['throughput_tokens_per_s_per_gpu'] or 0:.1f} tok/s/GPU{spread}, peak "
            f"{b['peak_memory_gib'] or 0:.2f} GiB on {b['device']}"
        )
    for line in _noise_lines(job):
        say(line)
    if job.get("gpu_seconds") is not None:
        found = (
            f"; the best was found after {job['gpu_seconds_to_best'] / 60:.1f} of them"
            if job.get("gpu_seconds_to_best") is not None
            else ""
        )
        if job.get("gpu_seconds_to_tie") is not None and job.get("first_tied") != (job.get("best") or {}).get(
            "number"
        ):
            found += (
                f"; a config inside its tie band (trial {job['first_tied']}) after "
                f"{job['gpu_seconds_to_tie'] / 60:.1f}"
            )
        own = job.get("first_tied_proposed")
        if job.get("gpu_seconds_to_tie_proposed") is not None and own not in (
            job.get("first_tied"),
            (job.get("best") or {}).get("number"),
        ):
            found += (
                f"; the search's first config inside its tie band (trial {own}) after "
                f"{job['gpu_seconds_to_tie_proposed'] / 60:.1f}"
            )
        so_far = " so far" if job["status"] in ("queued", "running") else ""
        say(f"  cost: {job['gpu_seconds'] / 60:.1f} GPU-minutes{so_far}{found}")
    if job.get("elapsed_s") is not None:
        eta = f", ETA {job['eta_s'] / 60:.1f} min" if job.get("eta_s") is not None else ""
        say(f"  elapsed: {job['elapsed_s'] / 60:.1f} min{eta}")
    if job.get("error"):
        say(f"  error: {job['error']}")


def _noise_lines(job: dict[str, Any]) -> list[str]:
    """The job's noise and its baselines against the winner, from the server's JSON."""
    noise = job.get("noise")
    if not noise:
        return []
    lines = [
        f"  noise: {noise['measured_pct']:.1f}% over {noise['runs']} baseline runs; "
        f"tie band {noise['band_pct']:.1f}%"
        if noise.get("measured_pct") is not None
        else f"  noise: not measured yet; tie band {noise['band_pct']:g}% (assumed)"
    ]
    for b in job.get("baselines") or []:
        runs = b.get("throughput")
        if not runs or b.get("best_over_baseline") is None:
            lines.append(f"  {b['name']} (trial {b['trial']}): {b['status']}, no throughput")
            continue
        spread = f", spread {runs['spread_pct']:.1f}%" if runs.get("spread_pct") is not None else ""
        lines.append(
            f"  {b['name']} (trial {b['trial']}): {runs['median']:.1f} tok/s/GPU "
            f"(n={runs['runs']}{spread}); the best "
            + versus(b["best_over_baseline"], b["verdict"], b["tie_band_pct"], "it")
        )
    hosts = hosts_line(job.get("hosts") or {})
    if hosts:
        lines.append(f"  {hosts}")
    return lines


def _remote_export(
    server: str,
    token: str | None,
    job_id: str,
    trial: int | None,
    fmt: str,
    max_peak_memory_gib: float | None,
) -> str:
    if trial is None:
        params = {} if max_peak_memory_gib is None else {"max_peak_memory_gib": max_peak_memory_gib}
        best_trial = _request("GET", server, f"/v1/jobs/{job_id}/best", token, params=params)
        trial = int(best_trial.json()["number"])
    return _request(
        "GET", server, f"/v1/jobs/{job_id}/trials/{trial}/config", token, params={"format": fmt}
    ).text


def main() -> None:  # pragma: no cover - console-script entry
    logging.basicConfig(level=logging.WARNING)
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
