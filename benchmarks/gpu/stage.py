"""Here, before a GPU run: cut the carried wheels into device calls.

A device call sends the working tree (tracked files and untracked files git does not ignore)
plus what it carries, 64 MiB at most, so a call carries at most 64 MiB less the working tree
and a margin. Each stream (a bundle's parts, joined in order, or flash-attn's parts) is cut
afresh into pieces that fill the calls one after the other, named ``NAME.part.NN`` in order
across the calls, so ``cat NAME.part.*`` on the host (``unpack.sh``, ``verl-host.sh``) joins it
again; whole files (``unpack.sh``, a wheel) go into the first call with room. Call K's folder
``OUT/K`` holds one folder per destination (``parts``, ``parts-verl``, ``parts-fa``), which the
call copies into ``/tmp``::

    python3 -m benchmarks.gpu.stage --out .stage \\
        --stream parts:vllm-0.24.0:'.bundle/vllm/vllm-0.24.0.part.*' \\
        --stream parts:control-min:'.bundle/control/control-min.part.*' \\
        --stream parts-verl:verl-0.9.1:'.bundle/verl/verl-0.9.1.part.*' \\
        --stream parts-fa:fa:'../shared/gpu-host/flash-attn/fa.part.*' \\
        --file parts:.bundle/vllm/unpack.sh \\
        --file parts-verl:.bundle/verl/antlr4_python3_runtime-4.9.3-py3-none-any.whl
    # then, per call K: rm -rf .xfer && cp -al .stage/K .xfer; carry [".xfer"]; on the host:
    # for d in .xfer/*; do mkdir -p /tmp/$(basename $d); cp $d/* /tmp/$(basename $d)/; done
"""

from __future__ import annotations

import argparse
import glob
import shutil
import subprocess
import sys
from pathlib import Path

# What one device call sends, the working tree included: 64 MiB, counted here as 64 MB (a
# call of 60 MiB of parts beside 3.9 MiB of tree was refused), less a margin for files the
# tree gains between staging and the last call.
CALL_LIMIT = 64_000_000
MARGIN = 2 << 20
CHUNK = 8 << 20


def tree_bytes(repo: Path) -> int:
    """Bytes of what a call sends besides its carried paths: tracked files and untracked
    files git does not ignore."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=repo,
        capture_output=True,
        check=True,
    ).stdout
    paths = [repo / p for p in listed.decode().split("\0") if p]
    return sum(p.stat().st_size for p in paths if p.is_file())


class Calls:
    """The calls' folders, filled one after the other up to ``capacity`` bytes each."""

    def __init__(self, out: Path, capacity: int) -> None:
        self.out, self.capacity = out, capacity
        self.sizes: list[int] = []

    def room(self, k: int) -> int:
        while len(self.sizes) <= k:
            self.sizes.append(0)
        return self.capacity - self.sizes[k]

    def path(self, k: int, dest: str, name: str) -> Path:
        folder = self.out / str(k) / dest
        folder.mkdir(parents=True, exist_ok=True)
        return folder / name

    def add_file(self, dest: str, source: Path) -> None:
        size = source.stat().st_size
        if size > self.capacity:
            raise SystemExit(f"{source} ({size} bytes) does not fit one call; cut it with --stream")
        k = next(k for k in range(len(self.sizes) + 1) if self.room(k) >= size)
        shutil.copyfile(source, self.path(k, dest, source.name))
        self.sizes[k] += size

    def add_stream(self, dest: str, name: str, sources: list[Path], first_call: int) -> int:
        """The sources' bytes in order, cut into ``NAME.part.NN`` pieces from call
        ``first_call`` on; the call the stream ended in."""
        k, piece, out = first_call, 0, None
        for source in sources:
            with source.open("rb") as f:
                while chunk := f.read(CHUNK):
                    while chunk:
                        room = self.room(k)
                        if room <= 0:  # the call is full: a new piece in the next
                            if out is not None:
                                out.close()
                                out = None
                            k += 1
                            continue
                        if out is None:
                            out = self.path(k, dest, f"{name}.part.{piece:02d}").open("wb")
                            piece += 1
                        data, chunk = chunk[:room], chunk[room:]
                        out.write(data)
                        self.sizes[k] += len(data)
        if out is not None:
            out.close()
        return k


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu.stage", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--out", type=Path, required=True, help="the calls' folders (emptied first)")
    parser.add_argument(
        "--stream", action="append", default=[], help="DEST:NAME:GLOB (parts joined in order)"
    )
    parser.add_argument("--file", action="append", default=[], help="DEST:PATH (a file sent whole)")
    parser.add_argument("--repo", type=Path, default=Path.cwd())
    args = parser.parse_args(argv)
    shutil.rmtree(args.out, ignore_errors=True)
    tree = tree_bytes(args.repo)
    calls = Calls(args.out, CALL_LIMIT - tree - MARGIN)
    k = 0
    for stream in args.stream:
        dest, name, pattern = stream.split(":", 2)
        sources = [Path(p) for p in sorted(glob.glob(pattern))]
        if not sources:
            raise SystemExit(f"--stream {stream}: no file matches {pattern}")
        k = calls.add_stream(dest, name, sources, k)
    for entry in args.file:
        dest, path = entry.split(":", 1)
        calls.add_file(dest, Path(path))
    print(
        f"working tree {tree / 2**20:.1f} MiB; {len(calls.sizes)} calls "
        f"of at most {calls.capacity / 2**20:.1f} MiB:"
    )
    for k, size in enumerate(calls.sizes):
        names = sorted(
            str(p.relative_to(args.out / str(k))) for p in (args.out / str(k)).rglob("*") if p.is_file()
        )
        print(f"  {k}: {size / 2**20:5.1f} MiB  {' '.join(names)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
