"""Copy a whole autotuner database (jobs and their Optuna studies) to another one.

    python -m autotuner.dbcopy FROM_URL TO_URL

e.g. from the default SQLite file to PostgreSQL. Stop the service (and any CLI run) on the
source first: a job running meanwhile would go on writing to the source only. The
destination must hold no jobs and no studies; both are migrated to this version's schema
first. Every trial is copied with its number, state, params, values and attributes, so a
job that was queued or interrupted resumes from the copy as it would have from the source.
"""

from __future__ import annotations

import sys

import optuna

from storage import Database
from storage.copy import copy_jobs


def copy_database(source_url: str, destination_url: str) -> tuple[int, int]:
    """Copy every job and every study; return (jobs, studies) copied.

    Raises:
        JobStateError: the destination already holds jobs.
        optuna.exceptions.DuplicatedStudyError: it already holds one of the studies.
        StorageError subclass: either database failed.
    """
    with Database(source_url) as source, Database(destination_url) as destination:
        existing = optuna.get_all_study_names(destination.url) if _has_studies(destination) else []
        if existing:
            raise optuna.exceptions.DuplicatedStudyError(
                f"database {destination.masked_url} already holds studies ({', '.join(existing[:5])}"
                f"{', ...' if len(existing) > 5 else ''}); copy into an empty database"
            )
        jobs = copy_jobs(source, destination)
        studies = optuna.get_all_study_names(source.url)
        for name in studies:
            optuna.copy_study(from_study_name=name, from_storage=source.url, to_storage=destination.url)
    return jobs, len(studies)


def _has_studies(database: Database) -> bool:
    from sqlalchemy import inspect

    return "studies" in inspect(database.engine).get_table_names()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    jobs, studies = copy_database(args[0], args[1])
    print(f"copied {jobs} job(s) and {studies} study(ies)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
