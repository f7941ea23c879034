"""Write every job in the database, with all its trials and its summary, as JSON.

usage: python -m benchmarks.gpu.dump_results OUT.json [COMMAND...]
The command that produced the jobs is stored with them, so each figure names its device
(per trial) and how it was made. A failed trial carries ``error_cause``, the line of its log
that says what failed, where its message does not. A job that verified trials in verl
(``budget.verify_in_verl``) carries their verdicts under ``verl``, by trial number, as the API
and ``autotuner jobs`` show them, and its summary picks the winner as they do; ``verl_runs``
holds each of those runs step by step (``STEP_KEYS`` of every step verl logged, warm-up first).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from autotuner.jobs import JobContext
from autotuner.records import records
from autotuner.settings import get_settings
from autotuner.study import open_study
from autotuner.summary import summarize, verified_summaries
from autotuner.verification import VERIFY_IN_VERL, VerlRunStore, stored_verdicts
from trials.failures import logged_cause

# What ``verl_runs`` keeps of each step verl logged: throughput, tokens, the step and its phases.
STEP_KEYS = (
    "perf/throughput",
    "perf/total_num_tokens",
    "response_length/mean",
    "timing_s/step",
    "timing_s/gen",
    "timing_s/old_log_prob",
    "timing_s/ref",
    "timing_s/update_actor",
    "timing_s/update_weights",
)


def verl_runs(store: VerlRunStore, job_id: str) -> list[dict[str, Any]]:
    """The job's verl runs in the order they ran: trial, round, status, warm-up steps and
    each step's ``STEP_KEYS``."""
    out = []
    for run in store.list(job_id):
        result = json.loads(run.result_json)
        steps = [{k: step[k] for k in STEP_KEYS if k in step} for step in result.get("steps", [])]
        out.append(
            {
                "trial": run.trial_number,
                "round": run.round,
                "status": run.status,
                "warmup_steps": result.get("warmup_steps"),
                "steps": steps,
            }
        )
    return out


def with_cause(trial: dict[str, Any], log_tail: str) -> dict[str, Any]:
    """The trial, with ``error_cause``: for a failure, the line of its log that says what
    failed (``trials.failures.logged_cause``), where its message does not say it already."""
    if trial.get("status") in ("oom", "error") and log_tail:
        cause = logged_cause(None, log_tail)
        if cause and cause not in (trial.get("error_message") or ""):
            trial["error_cause"] = cause
    return trial


def main(out: str, command: list[str]) -> None:
    ctx = JobContext.open(get_settings())
    jobs, _ = ctx.store.list(limit=100)
    doc: dict[str, Any] = {"command": " ".join(command), "jobs": []}
    for job in jobs:
        spec = ctx.spec_of(job)
        study = open_study(spec, job.study_name, ctx.settings.resolved_database_url)
        recs = records(study)
        tails = {t.number: t.user_attrs.get("log_tail") or "" for t in study.trials}
        store = VerlRunStore(ctx.database)
        verl = stored_verdicts(store, job.id)
        summary = summarize(spec, recs, job.stop_reason or job.status, verl)
        summary.verify_in_verl = int(study.user_attrs.get(VERIFY_IN_VERL) or 0)  # as its runner resolved it
        doc["jobs"].append(
            {
                "id": job.id,
                "name": job.name,
                "status": job.status,
                "spec": json.loads(job.spec_json),
                "started_at": job.started_at.isoformat() if job.started_at else None,
                "finished_at": job.finished_at.isoformat() if job.finished_at else None,
                "summary": summary.to_dict(),
                "trials": [with_cause(dict(r.__dict__), tails.get(r.number, "")) for r in recs],
                "verl": verified_summaries(recs, verl),
                "verl_runs": verl_runs(store, job.id),
            }
        )
    with open(out, "w") as f:
        json.dump(doc, f, indent=1, default=str)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
