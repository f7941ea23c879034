"""Static guarantees over the packages' source: no call goes through a shell, and the API
token is only ever compared with ``hmac.compare_digest`` (constant time)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("autotuner", "trials", "storage")
# Calls that run their argument through /bin/sh.
SHELL_FUNCTIONS = {
    ("os", "system"),
    ("os", "popen"),
    ("subprocess", "getoutput"),
    ("subprocess", "getstatusoutput"),
    ("asyncio", "create_subprocess_shell"),
    ("pty", "spawn"),
}


def shell_calls(source: str, filename: str = "<source>") -> list[str]:
    """``file:line what`` for each call that may run a shell."""
    tree = ast.parse(source, filename)
    aliases: dict[str, tuple[str, str]] = {}  # local name -> (module, function)
    modules: dict[str, str] = {}  # local name -> module
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                modules[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                aliases[alias.asname or alias.name] = (node.module, alias.name)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        target: tuple[str, str] | None = None
        if isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name):
            target = (modules.get(node.func.value.id, node.func.value.id), node.func.attr)
        elif isinstance(node.func, ast.Name):
            target = aliases.get(node.func.id)
        if target in SHELL_FUNCTIONS:
            found.append(f"{filename}:{node.lineno} {target[0]}.{target[1]}")
        for keyword in node.keywords:
            safe = isinstance(keyword.value, ast.Constant) and keyword.value.value is False
            if keyword.arg == "shell" and not safe:
                found.append(f"{filename}:{node.lineno} shell={ast.unparse(keyword.value)}")
    return found


def test_the_checker_finds_every_kind_of_shell_call() -> None:
    planted = """
import os, subprocess as sp
from os import system as run_it
from asyncio import create_subprocess_shell
sp.run(cmd, shell=True)
sp.Popen(cmd, shell=flag)
os.popen(cmd)
run_it(cmd)
sp.getoutput(cmd)
create_subprocess_shell(cmd)
sp.run(["ls"], shell=False)
"""
    found = shell_calls(planted)
    assert [f.split(" ", 1)[1] for f in found] == [
        "shell=True",
        "shell=flag",
        "os.popen",
        "os.system",
        "subprocess.getoutput",
        "asyncio.create_subprocess_shell",
    ], found


def test_no_call_in_the_packages_runs_a_shell() -> None:
    files = [p for package in PACKAGES for p in sorted((REPO / package).rglob("*.py"))]
    assert len(files) > 30
    found = [hit for path in files for hit in shell_calls(path.read_text(), str(path.relative_to(REPO)))]
    assert found == []


def test_the_token_is_compared_in_constant_time() -> None:
    source = (REPO / "autotuner" / "api" / "security.py").read_text()
    tree = ast.parse(source)
    compare_digest = [
        n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == "hmac.compare_digest"
    ]
    assert len(compare_digest) == 1
    assert "get_secret_value" in ast.unparse(compare_digest[0])
    # No ==, !=, in or startswith on anything derived from the token.
    for node in ast.walk(tree):
        presence = isinstance(node, ast.Compare) and all(
            isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops
        )  # `credentials is None`
        if isinstance(node, ast.Compare) and not presence:
            assert "secret" not in ast.unparse(node) and "credentials" not in ast.unparse(node), ast.unparse(
                node
            )
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            assert not (
                node.func.attr in ("startswith", "endswith", "find") and "credentials" in ast.unparse(node)
            ), ast.unparse(node)
    # The secret is read nowhere else in the packages (so compared nowhere else).
    readers = [
        str(p.relative_to(REPO))
        for package in PACKAGES
        for p in (REPO / package).rglob("*.py")
        if "get_secret_value" in p.read_text()
    ]
    assert readers == ["autotuner/api/security.py"], readers
