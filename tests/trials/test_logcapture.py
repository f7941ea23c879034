from __future__ import annotations

import logging
import os
import subprocess
import sys

from trial_helpers import REPO

from trials.logcapture import StderrTail, current_text


def test_tail_holds_what_this_process_and_its_children_write():
    with StderrTail() as tail:
        os.write(2, b"from this process\n")
        logging.getLogger("x").error("from logging")
        subprocess.run([sys.executable, "-c", "import sys; sys.stderr.write('from a child\\n')"], check=True)
        inside = current_text()
    text = tail.text()
    assert "from this process" in text and "from a child" in text
    assert "from a child" in inside
    assert current_text() == ""


def test_tail_keeps_only_the_last_characters():
    with StderrTail(max_chars=100) as tail:
        os.write(2, b"x" * 1000 + b"END\n")
    assert len(tail.text()) == 100 and tail.text().endswith("END\n")


def test_pipe_mode_when_stderr_is_not_a_file():
    code = (
        "import os, subprocess, sys\n"
        "from trials.logcapture import StderrTail\n"
        "with StderrTail() as tail:\n"
        "    os.write(2, b'mine\\n')\n"
        "    subprocess.run([sys.executable, '-c', 'import os; os.write(2, b\"child\\\\n\")'])\n"
        "    inside = tail.text()\n"
        "print(repr(inside))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert "mine" in done.stdout and "child" in done.stdout  # kept in the tail
    assert "mine" in done.stderr and "child" in done.stderr  # and still passed through
