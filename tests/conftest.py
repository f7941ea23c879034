"""Shared fixtures. ``database_url`` runs a test once on SQLite and once on PostgreSQL."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

POSTGRES_URL_ENV = "AUTOTUNER_TEST_POSTGRES_URL"
DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"

# The suite runs more processes at once than the machine has cores (scripts/test.sh: three
# workers on two cores, each with its trials, engines and servers), and each of them runs
# torch's OpenMP threads, as many as the cores. libgomp's threads spin at every barrier by
# default before they sleep: a spinning thread holds the core that the thread it waits for
# needs. A train phase of three such trials side by side on 2 cores took 4 times longer
# spinning than sleeping (150-190 s against 37-40 s). Set here, before any test starts a
# process: every process of the run inherits it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.fixture(scope="session")
def postgres_admin_url() -> str:
    """URL of an existing PostgreSQL database whose user may CREATE DATABASE.

    Skips the test when the server is unreachable, except on CI (``CI=true``) where the
    server is part of the setup and its absence fails the test.
    """
    from sqlalchemy import create_engine, exc

    url = os.environ.get(POSTGRES_URL_ENV) or DEFAULT_POSTGRES_URL
    engine = create_engine(url, connect_args={"connect_timeout": 3})
    try:
        with engine.connect():
            pass
    except exc.SQLAlchemyError as error:
        reason = (
            f"PostgreSQL at {engine.url!r} is unreachable "
            f"({' '.join(str(getattr(error, 'orig', error)).split())}); "
            f"set {POSTGRES_URL_ENV} to a server whose user may CREATE DATABASE"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    finally:
        engine.dispose()
    return url


@pytest.fixture
def postgres_url(postgres_admin_url: str) -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test, dropped afterwards."""
    from sqlalchemy import create_engine, make_url, pool, text

    admin_url = make_url(postgres_admin_url)
    name = f"autotuner_t_{uuid.uuid4().hex[:12]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=pool.NullPool)
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield admin_url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = :name AND pid <> pg_backend_pid()"
                ),
                {"name": name},
            )
            force = connection.dialect.server_version_info >= (13,)
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}"' + (" WITH (FORCE)" if force else "")))
        admin.dispose()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A SQLite file in the test's temporary directory (not created yet)."""
    return f"sqlite:///{tmp_path / 'autotuner.db'}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest) -> str:
    """An empty database of each supported kind: SQLite file, then PostgreSQL."""
    return request.getfixturevalue(f"{request.param}_url")


# --- Running in parallel (scripts/test.sh: pytest-xdist) -------------------------------------
# Fixtures that start something expensive once for many tests (a server with its Ray and a
# finished job, a browser, a module's server scene, a vLLM engine, a private PostgreSQL, a
# module's local Ray, verl's environment run once for a module's checks). Under xdist every
# test that uses one runs on the same worker (``--dist loadgroup``), so it is started once,
# not once per worker.
SHARED_FIXTURES = frozenset(
    {
        "server",
        "browser",
        "scene",
        "utf8_server",
        "vllm_engine",
        "pg",
        "ray_local",  # tests/autotuner/conftest.py: one Ray per module
        "ray_with_4_gpus",  # tests/autotuner/test_packing.py
        "ray_with_a_gpu",  # tests/web/test_verl_verified.py
        "timed_cut",  # tests/trials/test_verl_cut.py: verl's cut of one plan, timed once
        "verl_scripts",  # tests/trials/test_verl_cut.py: verl's code on the batch, one process
    }
)


# Modules whose tests must not run beside each other, until they are fixed, and why.
SAME_WORKER_MODULES: dict[str, str] = {}


def _groups(item: pytest.Item) -> set[str]:
    """The xdist groups of a test: its ``xdist_group`` marks; for a shared fixture it uses,
    where it is set up once: its module for a module-scoped one (a conftest's module-scoped
    Ray starts once per module), else where it is defined (its conftest's folder, or its
    module), so that a folder's tests sharing a server stay together; its module, if listed
    in SAME_WORKER_MODULES."""
    groups = {
        str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
        for mark in item.iter_markers("xdist_group")
    }
    module = item.nodeid.split("::", 1)[0]
    defined = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    for name in SHARED_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        definitions = defined.get(name)
        if definitions and definitions[-1].scope == "module":
            groups.add(module)
        elif definitions and definitions[-1].scope != "function":
            groups.add(definitions[-1].baseid or "root")
    if module in SAME_WORKER_MODULES:
        groups.add(module)
    return groups


def _join_group(item: pytest.Item, groups: set[str]) -> None:
    """Put ``item`` in xdist group ``groups``: LoadGroupScheduling groups by the node id's
    "@group" suffix. xdist 3.8 appends it for an ``xdist_group`` mark by assigning
    ``item._nodeid``, which pytest >= 9.2 no longer reads (it keeps ``item._id``, a NodeId):
    the mark is silently ignored there, so the suffix is set here, for either pytest."""
    nodeid = f"{item.nodeid}@{'_'.join(sorted(groups))}"
    if isinstance(getattr(item, "_id", None), str) or not hasattr(item, "_id"):
        item._nodeid = nodeid  # type: ignore[attr-defined]
    else:
        from _pytest.nodeid import NodeId

        item._id = NodeId.parse(nodeid)  # type: ignore[attr-defined]


def _runs_long(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(name) for name in ("engine", "slow"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):  # not an xdist worker: the files' own order
        return
    if getattr(config.option, "loadgroup", False):  # a worker of --dist loadgroup
        for item in items:
            groups = _groups(item)
            if groups and "@" not in item.nodeid.rsplit("]", 1)[-1]:  # not suffixed by xdist
                _join_group(item, groups)
    # Long tests first, so that none of them is left to run alone at the end. Every worker
    # sorts the same collection the same way (xdist requires identical collections).
    items.sort(key=lambda item: not _runs_long(item))
