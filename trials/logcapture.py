"""Keep the tail of everything written to stderr, by this process and its children.

Engines log from their own processes, which inherit file descriptor 2; the text that
explains a failure (vLLM's "See root cause above") is there, not in the exception.
``StderrTail`` reads the last ``max_chars`` characters written to fd 2 during a
``with`` block; ``current_text()`` reads the innermost active capture.

- fd 2 is a regular file (``launch_trial``'s log): nothing is redirected; the tail is
  read back from the file, so not a byte is lost even if the process dies abruptly.
- otherwise (a terminal, a pipe): fd 2 points at a pipe for the block's duration and a
  daemon thread copies what arrives to the original stderr (logs still flow), keeping
  the tail. Children still alive on exit keep writing through the copier thread,
  which ends when they close the pipe.

Threading: enter/exit from one thread.
"""

from __future__ import annotations

import os
import stat
import sys
import threading
import time
from types import TracebackType

_active: list[StderrTail] = []


def current_text() -> str:
    """Tail of the innermost active capture, or an empty string."""
    return _active[-1].text() if _active else ""


class StderrTail:
    def __init__(self, max_chars: int = 200_000) -> None:
        self.max_chars = max_chars
        self._file_start: int | None = None  # file mode: offset of fd 2 on entry
        self._buf = bytearray()
        self._lock = threading.Lock()
        self._saved_fd = -1
        self._read_fd = -1
        self._thread: threading.Thread | None = None
        self._copying = False

    def text(self) -> str:
        """The tail so far (pipe mode: after what was written has been read, <= 1 s)."""
        if self._file_start is not None:
            return self._read_file_tail()
        self._settle()
        with self._lock:
            return bytes(self._buf[-self.max_chars :]).decode("utf-8", errors="replace")

    def __enter__(self) -> StderrTail:
        sys.stderr.flush()
        if _is_regular_file(2):
            self._file_start = os.lseek(2, 0, os.SEEK_CUR)
        else:
            self._start_pipe()
        _active.append(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        sys.stderr.flush()
        if self in _active:
            _active.remove(self)
        if self._file_start is None:
            self._stop_pipe()

    def _read_file_tail(self) -> str:
        sys.stderr.flush()
        start = self._file_start or 0
        try:
            with open("/proc/self/fd/2", "rb") as f:
                end = f.seek(0, os.SEEK_END)
                if start > end:  # the file was truncated (pytest's capture does)
                    start = 0
                f.seek(max(start, end - 4 * self.max_chars))
                data = f.read()
        except OSError:
            return ""
        return data.decode("utf-8", errors="replace")[-self.max_chars :]

    def _start_pipe(self) -> None:
        self._saved_fd = os.dup(2)
        self._read_fd, write_fd = os.pipe()
        os.dup2(write_fd, 2)
        os.close(write_fd)
        self._thread = threading.Thread(target=self._copy, name="stderr-tail", daemon=True)
        self._thread.start()

    def _stop_pipe(self) -> None:
        os.dup2(self._saved_fd, 2)  # drops this process's write end of the pipe
        if self._thread is not None:
            self._thread.join(timeout=2.0)
            if not self._thread.is_alive():
                os.close(self._read_fd)
                os.close(self._saved_fd)

    def _settle(self, timeout_s: float = 1.0) -> None:
        if self._thread is None or not self._thread.is_alive():
            return
        sys.stderr.flush()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                busy = self._copying
            if not busy and _pending_bytes(self._read_fd) == 0:
                return
            time.sleep(0.005)

    def _copy(self) -> None:
        while True:
            try:
                chunk = os.read(self._read_fd, 65536)
            except OSError:
                return
            if not chunk:
                return
            with self._lock:
                self._copying = True
            _write_all(self._saved_fd, chunk)
            with self._lock:
                self._copying = False
                self._buf += chunk
                if len(self._buf) > 2 * self.max_chars:
                    del self._buf[: len(self._buf) - self.max_chars]


def _is_regular_file(fd: int) -> bool:
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and os.path.exists(f"/proc/self/fd/{fd}")
    except OSError:
        return False


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except OSError:
            return


def _pending_bytes(fd: int) -> int:
    """Bytes waiting in the pipe ``fd`` (0 where the platform cannot tell)."""
    try:
        import array
        import fcntl
        import termios

        buf = array.array("i", [0])
        fcntl.ioctl(fd, termios.FIONREAD, buf)
        return int(buf[0])
    except (ImportError, OSError):
        return 0
