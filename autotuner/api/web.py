"""The web page: the jobs list with a submit form, and a job's page (live progress, the
Pareto front as a Plotly scatter, a sortable trials table, verl config downloads).

Server-rendered with Jinja2; small scripts poll the JSON API, sort tables and post forms.
Everything a page loads comes from this service (Plotly from the ``plotly`` package): no
CDN, no other host, which the pages' Content-Security-Policy enforces in the browser.

Pages follow the API's read rule: open on a loopback bind, else they need the token, as a
bearer header or as the ``autotuner_token`` cookie that the token form sets.
"""

from __future__ import annotations

import hashlib
import html
import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse, HTMLResponse, Response
from fastapi.security import HTTPAuthorizationCredentials
from fastapi.templating import Jinja2Templates
from markupsafe import Markup, escape

from autotuner import __version__
from autotuner.api.errors import NotFoundError, UnauthorizedError
from autotuner.api.routes.jobs import public_job
from autotuner.api.security import require_read
from autotuner.api.service import JobService
from autotuner.records import INFEASIBLE_STATUSES, TrialRecord, TrialStatus
from autotuner.spec import JobSpec
from autotuner.summary import Runs, front, runs_of, summarize
from autotuner.verl_results import runs_phrase
from storage import JobNotFoundError
from trials.metrics import PEAK_MEMORY, THROUGHPUT

HERE = Path(__file__).parent
STATIC = HERE / "static"
EXAMPLE_JOB = (HERE / "templates" / "example-job.yaml").read_text()
TOKEN_COOKIE = "autotuner_token"
PAGE_SIZE = 50
HEADLINE_METRICS = {
    THROUGHPUT: "throughput tokens/s/GPU",
    PEAK_MEMORY: "peak memory GiB",
    "step_time_s": "step time s",
}
# Plotly styles its own elements inline; scripts and everything else come from this origin.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; connect-src 'self'; object-src 'none'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
ACTIVE = ("queued", "running")
# libyaml's emitter where PyYAML has it: a spec's page shows its stored lists whole.
SPEC_DUMPER: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)

router = APIRouter(include_in_schema=False)
templates = Jinja2Templates(directory=HERE / "templates")


# --------------------------------------------------------------------------- static files


@cache
def _plotly_js() -> Path:
    import plotly

    return Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


@cache
def _static_version(name: str) -> str:
    path = _plotly_js() if name == "plotly.min.js" else STATIC / name
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def static_url(name: str) -> str:
    """``/static/<name>?v=<content hash>``: cached for good, refetched when it changes."""
    return f"/static/{name}?v={_static_version(name)}"


@router.api_route("/static/{name}", methods=["GET", "HEAD"])
def static_file(name: str, v: str | None = None) -> Response:
    """Plotly's bundle from the plotly package, and this page's own CSS and scripts."""
    ours = {p.name for p in STATIC.iterdir() if p.is_file()}
    if name != "plotly.min.js" and name not in ours:
        raise NotFoundError(
            f"no static file {name!r}; there are: plotly.min.js, {', '.join(sorted(ours))}", field="name"
        )
    path = _plotly_js() if name == "plotly.min.js" else STATIC / name
    fresh = v is not None and v == _static_version(name)
    cache_control = "public, max-age=31536000, immutable" if fresh else "public, max-age=300"
    media = "text/css" if name.endswith(".css") else "text/javascript"
    return FileResponse(path, media_type=f"{media}; charset=utf-8", headers={"Cache-Control": cache_control})


# --------------------------------------------------------------------------- pages


@router.get("/", response_class=HTMLResponse)
def jobs_page(request: Request, offset: int = Query(0, ge=0, le=1_000_000_000)) -> Response:
    """Jobs, newest first, with their progress; a form that submits a new one."""
    denied = _denied(request)
    if denied is not None:
        return denied
    service: JobService = request.app.state.service
    views, count = service.list_jobs(None, offset, PAGE_SIZE)
    return _render(
        request,
        "index.html",
        {
            "jobs": [public_job(request, v) for v in views],
            "count": count,
            "offset": offset,
            "page_size": PAGE_SIZE,
            "example_job": EXAMPLE_JOB,
        },
    )


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(request: Request, job_id: str) -> Response:
    """One job: progress, the Pareto front, every trial, and their configs to download."""
    denied = _denied(request)
    if denied is not None:
        return denied
    service: JobService = request.app.state.service
    try:
        view = service.get_job(job_id)
    except JobNotFoundError:
        return _render(request, "not_found.html", {"job_id": job_id}, status_code=404)
    pareto = front(view.spec, view.records)
    cap = view.memory_cap_gib
    return _render(
        request,
        "job.html",
        {
            "job": public_job(request, view),
            "view": view,
            "pareto": pareto,
            "pareto_runs": runs_of(view.records),
            "table": trials_table(view.records, {r.number for r in pareto}, view.verified),
            "figure": figure(view.spec, view.records, pareto, cap),
            "summary": summarize(view.spec, view.records, view.job.stop_reason or "", view.verl),
            "spec_yaml": yaml.dump(json.loads(view.job.spec_json), Dumper=SPEC_DUMPER, sort_keys=False),
            "active": view.job.status in ACTIVE,
        },
    )


def _denied(request: Request) -> Response | None:
    """The 401 page, when reads need the token and the request carries none that matches."""
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    token = value.strip() if scheme.lower() == "bearer" else request.cookies.get(TOKEN_COOKIE)
    credentials = HTTPAuthorizationCredentials(scheme="Bearer", credentials=token) if token else None
    try:
        require_read(request, credentials)
    except UnauthorizedError as exc:
        return _render(
            request, "unauthorized.html", {"message": exc.message}, status_code=401, headers=exc.headers
        )
    return None


def _render(
    request: Request,
    name: str,
    context: dict[str, Any],
    status_code: int = 200,
    headers: dict[str, str] | None = None,
) -> Response:
    settings = request.app.state.settings
    context = {
        "token_enabled": settings.api_token is not None,
        "reads_need_token": settings.api_token is not None and not settings.loopback_bind,
        "token_cookie": TOKEN_COOKIE,
        "version": __version__,
        **context,
    }
    response = templates.TemplateResponse(request, name, context, status_code=status_code, headers=headers)
    response.headers["Content-Security-Policy"] = CSP
    response.headers["Cache-Control"] = "no-store"
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "same-origin"
    return response


# --------------------------------------------------------------------------- formatting


def fmt(value: Any) -> str:
    """A cell's text: 4 significant digits, thousands separated, booleans as in YAML."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        number = float(value)
        if not math.isfinite(number):
            return str(number)
        if abs(number) >= 1000:
            return f"{number:,.0f}"
        if number.is_integer():
            return str(int(number))
        return f"{number:.4g}"
    return str(value)


def sort_key(value: Any) -> str:
    """The ``data-sort`` of a cell: a number for numbers and booleans, else the text."""
    if isinstance(value, (bool, int, float)):
        return repr(float(value))
    return "" if value is None else str(value)


def knob_label(path: str) -> str:
    """``actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu`` -> ``actor.ppo_micro_...``."""
    return path.removeprefix("actor_rollout_ref.")


def breakable(name: str) -> Markup:
    """A long snake_case name that may wrap after its underscores and dots."""
    out = str(escape(name))
    return Markup(out.replace("_", "_<wbr>").replace(".", ".<wbr>"))


def duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes:02d} min"
    return f"{minutes} min {secs:02d} s" if minutes else f"{secs} s"


def when(moment: datetime | None) -> str:
    if moment is None:
        return ""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def runs_note(best: Any) -> str:
    """A job's best throughput's runs, beside it in the jobs list: ``(median of 3, spread
    2.1%)``, ``(1 run)``, or nothing before a best exists (``static/jobs.js`` writes the same)."""
    if best is None or best.throughput_tokens_per_s_per_gpu is None:
        return ""
    runs = best.runs
    if runs is None or runs.runs < 2:
        return "(1 run)"
    return f"(median of {runs.runs}, spread {runs.spread_pct or 0:.1f}%)"


def verl_runs_note(verl: Any) -> str:
    """How a verl figure was measured (``1 run, 3 steps, spread 18.1%``), from ``VerlPublic``."""
    return runs_phrase(verl.model_dump())


templates.env.globals.update(
    runs_note=runs_note,
    verl_runs_note=verl_runs_note,
    static_url=static_url,
    fmt=fmt,
    duration=duration,
    when=when,
    breakable=breakable,
    knob_label=knob_label,
    zip=zip,
    THROUGHPUT=THROUGHPUT,
    MEMORY=PEAK_MEMORY,
)


# --------------------------------------------------------------------------- trials table


@dataclass
class Column:
    key: str
    label: str
    title: str
    numeric: bool


@dataclass
class Row:
    trial: TrialRecord
    pareto: bool
    cells: list[tuple[str, str]] = field(default_factory=list)  # (text, data-sort)
    verl: dict[str, Any] | None = None  # what verl measured, if verified (``VerlPublic``'s fields)


@dataclass
class TrialsTable:
    columns: list[Column]
    rows: list[Row]
    fixed_knobs: dict[str, Any]


def _numeric(values: list[Any]) -> bool:
    return all(isinstance(v, (bool, int, float)) for v in values if v is not None)


# A trial's throughput over its runs (its own and its re-measurements): median, n, spread.
RUNS_COLUMNS = [
    Column("r:median", "median tokens/s/GPU", "median throughput over the trial's runs", True),
    Column("r:n", "runs", "how many times the config was measured", True),
    Column("r:spread", "spread %", "(max - min) / median over its runs", True),
]


def runs_cells(runs: Runs | None) -> list[tuple[str, Any]]:
    values = [runs.median, runs.n, runs.spread_pct] if runs is not None else [None, None, None]
    return [(fmt(v), sort_key(v)) for v in values]


def trials_table(
    recs: list[TrialRecord], pareto_numbers: set[int], verified: dict[int, dict[str, Any]] | None = None
) -> TrialsTable:
    """Every trial, with every metric it measured and every knob that differs between trials
    (the knobs all trials share are listed once, beside the table); with ``verified`` (the
    job's verl verdicts), verl's median throughput and the trial's error against it."""
    verified = verified or {}
    knobs = list(dict.fromkeys(k for r in recs for k in r.config))
    varying = [k for k in knobs if len({json.dumps(r.config.get(k), sort_keys=True) for r in recs}) > 1]
    fixed = {k: recs[0].config.get(k) for k in knobs if k not in varying} if recs else {}
    metrics = set().union(*(r.metrics for r in recs)) if recs else set()
    headline = [m for m in HEADLINE_METRICS if m in metrics]
    others = sorted(metrics - set(headline))
    columns = [Column("status", "status", "the trial's outcome", False)]
    columns += [Column(f"m:{m}", HEADLINE_METRICS[m], f"metric {m}", True) for m in headline]
    columns += [
        Column(f"k:{k}", knob_label(k), f"knob {k}", _numeric([r.config.get(k) for r in recs]))
        for k in varying
    ]
    columns += [Column(f"m:{m}", m, f"metric {m}", True) for m in others]
    columns += RUNS_COLUMNS
    predicted = any(r.predicted_memory_gib for r in recs)
    if predicted:
        columns += [
            Column(
                "p:peak",
                "predicted peak GiB",
                "the memory model's peak, predicted before the trial ran",
                True,
            ),
            Column("e:peak", "prediction error GiB", "measured minus predicted peak", True),
        ]
    if verified:
        columns += [
            Column(
                "v:throughput",
                "verl tokens/s/GPU",
                "verl's own perf/throughput for this config: the median of its runs in verl",
                True,
            ),
            Column(
                "v:error",
                "verl prediction error %",
                "the trial's step throughput minus verl's, in percent of verl's",
                True,
            ),
        ]
    columns += [
        Column("wall_s", "wall time s", "wall-clock time of the whole trial, in seconds", True),
        Column("error", "error", "why it failed, or why it was not run", False),
    ]
    rows = []
    runs = runs_of(recs)
    for r in recs:
        row = Row(r, r.number in pareto_numbers, verl=verified.get(r.number))
        row.cells.append((r.status, r.status))
        row.cells += [(fmt(r.metrics.get(m)), sort_key(r.metrics.get(m))) for m in headline]
        row.cells += [(fmt(r.config.get(k)), sort_key(r.config.get(k))) for k in varying]
        row.cells += [(fmt(r.metrics.get(m)), sort_key(r.metrics.get(m))) for m in others]
        row.cells += runs_cells(runs.get(r.number))
        if predicted:
            for value in (r.predicted_memory_gib.get("peak"), r.memory_error_gib.get("peak")):
                row.cells.append((fmt(value), sort_key(value)))
        if verified:
            median = row.verl["throughput_median"] if row.verl else None
            off = row.verl["prediction_error_pct"].get("throughput") if row.verl else None
            row.cells.append(
                (fmt(median) if median is not None else (row.verl or {}).get("status", ""), sort_key(median))
            )
            row.cells.append(("" if off is None else f"{off:+.1f}", sort_key(off)))
        row.cells.append((fmt(r.wall_s), sort_key(r.wall_s)))
        error = ": ".join(p for p in (r.error_type, r.error_message) if p)
        row.cells.append((error, error))
        rows.append(row)
    return TrialsTable(columns, rows, fixed)


# --------------------------------------------------------------------------- the figure


def _hover(r: TrialRecord, where: str) -> str:
    """Plotly hover text (which reads <b> and <br>); everything from the trial is escaped."""

    def esc(text: str) -> str:
        return html.escape(text, quote=False)

    lines = [f"<b>trial {r.number}</b> · {esc(r.status)}" + (f" ({where})" if where else "")]
    for metric, unit in ((THROUGHPUT, "tokens/s/GPU"), (PEAK_MEMORY, "GiB"), ("step_time_s", "s")):
        if metric in r.metrics:
            lines.append(f"{metric}: {fmt(r.metrics[metric])} {unit}")
    if r.error_type:
        lines.append(f"error: {esc(r.error_type)}")
    lines += [esc(f"{knob_label(k)} = {fmt(v)}") for k, v in r.config.items()]
    return "<br>".join(lines)


def _trace(name: str, points: list[tuple[TrialRecord, float, float, str]], **style: Any) -> dict[str, Any]:
    return {
        "type": "scatter",
        "name": name,
        "mode": "markers",
        "x": [x for _, x, _, _ in points],
        "y": [y for _, _, y, _ in points],
        "customdata": [r.number for r, _, _, _ in points],
        "text": [_hover(r, where) for r, _, _, where in points],
        "hovertemplate": "%{text}<extra></extra>",
        **style,
    }


def figure(
    spec: JobSpec, recs: list[TrialRecord], pareto: list[TrialRecord], cap_gib: float | None
) -> dict[str, Any]:
    """A Plotly figure of the measured trials: x peak memory (GiB), y step throughput.

    One point per measured trial: feasible ones as points, the Pareto front's highlighted
    and joined; OOM and timeouts as red x at y=0 (at their peak memory, else at the cap),
    errors likewise in grey.
    """
    measured = [r for r in recs if r.measured]
    observed = [r.metrics[PEAK_MEMORY] for r in measured if PEAK_MEMORY in r.metrics]
    fallback_x = cap_gib if cap_gib is not None else max(observed, default=0.0)
    on_front = {r.number for r in pareto}

    def point(r: TrialRecord) -> tuple[TrialRecord, float, float, str]:
        if r.feasible and PEAK_MEMORY in r.metrics and THROUGHPUT in r.metrics:
            return r, float(r.metrics[PEAK_MEMORY]), float(r.metrics[THROUGHPUT]), ""
        if PEAK_MEMORY in r.metrics:
            return r, float(r.metrics[PEAK_MEMORY]), 0.0, "at its peak memory"
        return r, float(fallback_x), 0.0, "at the memory cap"

    points = [point(r) for r in measured]
    front_points = sorted((p for p in points if p[0].number in on_front), key=lambda p: p[1])
    others = [p for p in points if p[0].number not in on_front]
    default_objectives = [(o.metric, o.resolved_direction) for o in spec.objectives] == [
        (THROUGHPUT, "maximize"),
        (PEAK_MEMORY, "minimize"),
    ]
    traces = [
        _trace(
            "feasible",
            [p for p in others if p[0].feasible],
            marker={
                "size": 10,
                "color": "#4c78a8",
                "opacity": 0.85,
                "line": {"width": 1, "color": "#ffffff"},
            },
        ),
        _trace(
            "Pareto front",
            front_points,
            mode="lines+markers" if default_objectives else "markers",
            line={"shape": "hv", "color": "#e45756", "width": 2, "dash": "dot"},
            marker={
                "size": 14,
                "symbol": "star",
                "color": "#f58518",
                "line": {"width": 1, "color": "#7f3b08"},
            },
        ),
        _trace(
            "OOM / timeout",
            [p for p in others if p[0].status in INFEASIBLE_STATUSES],
            marker={"size": 12, "symbol": "x", "color": "#d62728"},
        ),
        _trace(
            "error",
            [p for p in others if p[0].status == TrialStatus.ERROR],
            marker={
                "size": 11,
                "symbol": "x-thin-open",
                "color": "#7f7f7f",
                "line": {"width": 2, "color": "#7f7f7f"},
            },
        ),
    ]
    shapes, annotations = [], []
    # The cap line only where it does not squash the points into the left edge.
    near_cap = cap_gib is not None and max(observed, default=0.0) >= 0.5 * cap_gib
    if near_cap or any(where == "at the memory cap" for _, _, _, where in points):
        shapes.append(
            {
                "type": "line",
                "xref": "x",
                "yref": "paper",
                "x0": fallback_x,
                "x1": fallback_x,
                "y0": 0,
                "y1": 1,
                "line": {"color": "#d62728", "width": 1, "dash": "dash"},
            }
        )
        annotations.append(
            {
                "xref": "x",
                "yref": "paper",
                "x": fallback_x,
                "y": 1,
                "text": f"memory cap {fmt(fallback_x)} GiB",
                "showarrow": False,
                "xanchor": "right",
                "yanchor": "bottom",
                "font": {"color": "#d62728", "size": 11},
            }
        )
    if not measured:
        annotations.append(
            {
                "xref": "paper",
                "yref": "paper",
                "x": 0.5,
                "y": 0.5,
                "text": "no measured trial yet",
                "showarrow": False,
                "font": {"color": "#616e7c", "size": 15},
            }
        )
    layout = {
        "xaxis": {
            "title": {"text": "peak memory (GiB)"},
            "rangemode": "tozero",
            "zeroline": False,
            "gridcolor": "#eceff3",
        },
        "yaxis": {
            "title": {"text": "step throughput (tokens/s/GPU)"},
            "rangemode": "tozero",
            "zeroline": False,
            "gridcolor": "#eceff3",
        },
        "showlegend": True,
        "legend": {"orientation": "h", "x": 0, "y": 1.12},
        "margin": {"l": 64, "r": 24, "t": 48, "b": 56},
        "hovermode": "closest",
        "hoverlabel": {
            "align": "left",
            "bgcolor": "#ffffff",
            "bordercolor": "#9aa5b1",
            "font": {"color": "#1f2933", "size": 12},
        },
        "plot_bgcolor": "#ffffff",
        "paper_bgcolor": "#ffffff",
        "font": {
            "family": "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif",
            "size": 13,
            "color": "#1f2933",
        },
        "shapes": shapes,
        "annotations": annotations,
    }
    return {"data": traces, "layout": layout}
