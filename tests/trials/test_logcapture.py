from __future__ import annotations

import logging
import os
import subprocess
import sys

from trials.logcapture import StderrTail, current_text


def test_tail_holds_what_this_process_and_its_children_write():
    with StderrTail() as tail:
        os.write(2, b"from this process\n")
        logging.getLogger("x").error("from logging")
        subprocess.run(
            [sys.executable, "-c", "import sys; sys.stderr.write('from a child\\n')"], check=True
        )
        inside = current_text()
    text = tail.text()
    assert "from this process" in text and "from a child" in text
    assert "from a child" in inside
    assert current_text() == ""


def test_tail_keeps_only_the_last_characters():
    with StderrTail(max_chars=100) as tail:
        os.write(2, b"x" * 1000 + b"END\n")
    assert len(tail.text()) == 100 and tail.text().endswith("END\n")
