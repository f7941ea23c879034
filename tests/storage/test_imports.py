"""storage/ persists jobs; it never imports the control plane (autotuner/) nor the data plane
(trials/): the arrows are autotuner -> storage, never back (DESIGN.md)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FORBIDDEN = ("autotuner", "trials")


def _imported_packages(path: Path) -> set[str]:
    """The top-level packages a module imports anywhere in it (functions included)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_storage_never_imports_autotuner_or_trials():
    offenders = {
        str(path.relative_to(REPO)): sorted(_imported_packages(path) & set(FORBIDDEN))
        for path in (REPO / "storage").rglob("*.py")
    }
    assert {path: found for path, found in offenders.items() if found} == {}


def test_the_scan_sees_an_import_inside_a_function(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from autotuner.study import StudyRunner\n    import trials.types\n")
    assert _imported_packages(module) >= {"autotuner", "trials"}


def test_importing_storage_loads_neither_package():
    code = (
        "import sys, pkgutil, importlib, storage\n"
        "for m in pkgutil.walk_packages(storage.__path__, 'storage.'):\n"
        "    if '.migrations' not in m.name:\n"
        "        importlib.import_module(m.name)\n"
        f"loaded = sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)
