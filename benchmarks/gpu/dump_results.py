"""Write every job in the database, with all its trials and its summary, as JSON.

usage: python -m benchmarks.gpu.dump_results OUT.json [COMMAND...]
The command that produced the jobs is stored with them, so each figure names its device
(per trial) and how it was made.
"""

from __future__ import annotations

import json
import sys

from autotuner.jobs import JobContext
from autotuner.records import records
from autotuner.settings import get_settings
from autotuner.study import open_study
from autotuner.summary import summarize


def main(out: str, command: list[str]) -> None:
    ctx = JobContext.open(get_settings())
    jobs, _ = ctx.store.list(limit=100)
    doc = {"command": " ".join(command), "jobs": []}
    for job in jobs:
        spec = ctx.spec_of(job)
        recs = records(open_study(spec, job.study_name, ctx.settings.resolved_database_url))
        summary = summarize(spec, recs, job.stop_reason or job.status)
        doc["jobs"].append(
            {
                "id": job.id,
                "name": job.name,
                "status": job.status,
                "spec": json.loads(job.spec_json),
                "started_at": job.started_at.isoformat() if job.started_at else None,
                "finished_at": job.finished_at.isoformat() if job.finished_at else None,
                "summary": summary.to_dict(),
                "trials": [dict(r.__dict__) for r in recs],
            }
        )
    with open(out, "w") as f:
        json.dump(doc, f, indent=1, default=str)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
