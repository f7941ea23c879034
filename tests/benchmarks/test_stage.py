"""The wheels cut into device calls: every call within its size, every stream joined again
byte for byte from its pieces in name order, whole files whole."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from benchmarks.gpu import stage


def test_streams_fill_the_calls_and_join_again(tmp_path: Path, monkeypatch) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    (repo / "tracked.txt").write_bytes(b"x" * 3000)
    capacity = 10_000
    monkeypatch.setattr(stage, "MARGIN", 500)
    monkeypatch.setattr(stage, "CALL_LIMIT", capacity + 3000 + 500)
    monkeypatch.setattr(stage, "CHUNK", 4096)
    streams = {"a": [os.urandom(7000), os.urandom(9000)], "b": [os.urandom(12_345)]}
    for name, parts in streams.items():
        for i, data in enumerate(parts):
            (tmp_path / f"{name}.part.{i:02d}").write_bytes(data)
    (tmp_path / "unpack.sh").write_text("echo\n")
    out = tmp_path / "stage"
    argv = ["--out", str(out), "--repo", str(repo), "--file", f"parts:{tmp_path / 'unpack.sh'}"]
    argv += ["--stream", f"parts:a:{tmp_path}/a.part.*", "--stream", f"parts-b:b:{tmp_path}/b.part.*"]
    assert stage.main(argv) == 0

    calls = sorted(out.iterdir(), key=lambda p: int(p.name))
    sizes = [sum(f.stat().st_size for f in c.rglob("*") if f.is_file()) for c in calls]
    assert all(size <= capacity for size in sizes) and sizes[0] == capacity
    assert len(calls) == -(-(16_000 + 12_345 + 5) // capacity)  # no call left half-filled but the last
    host: dict[str, list[Path]] = {}
    for call in calls:  # as the host gets them: each call's folders copied into one place
        for f in call.rglob("*"):
            if f.is_file():
                host.setdefault(f.parent.name, []).append(f)
    joined_a = b"".join(
        f.read_bytes() for f in sorted(host["parts"], key=lambda f: f.name) if f.name != "unpack.sh"
    )
    assert joined_a == b"".join(streams["a"])
    assert b"".join(f.read_bytes() for f in sorted(host["parts-b"], key=lambda f: f.name)) == streams["b"][0]
    assert [f.read_text() for f in host["parts"] if f.name == "unpack.sh"] == ["echo\n"]
