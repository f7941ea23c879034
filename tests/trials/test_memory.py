from __future__ import annotations

import subprocess
import sys
import time

import psutil

from trials import memory
from trials.memory import PeakMemorySampler


def test_cpu_sampler_sees_a_child_process_allocation():
    code = "import time; x = bytearray(300 * 2**20); time.sleep(1.0)"
    with PeakMemorySampler("cpu", interval_s=0.02) as sampler:
        subprocess.run([sys.executable, "-c", code], check=True)
    assert 0.27 < sampler.peak_gib < 0.6  # 300 MiB plus an interpreter


def test_cpu_sampler_reports_growth_over_the_phase_baseline():
    with PeakMemorySampler("cpu", interval_s=0.02) as sampler:
        time.sleep(0.1)
    assert sampler.baseline_gib > 0.0
    assert sampler.peak_gib < 0.05


def test_a_process_of_the_baseline_that_ends_mid_phase_does_not_hide_the_phases_growth():
    # A child holding 300 MiB is part of the baseline; it exits while the phase allocates
    # 100 MiB: the tree's sum falls, yet the phase's peak is its own growth.
    code = "import sys, time; x = bytearray(300 * 2**20); print(flush=True); sys.stdin.read()"
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline()  # allocated
        with PeakMemorySampler("cpu", interval_s=0.02) as sampler:
            assert sampler.baseline_gib > 0.29
            child.kill()
            child.wait()
            time.sleep(0.1)
            held = bytearray(100 * 2**20)
            held[::4096] = b"x" * len(held[::4096])  # touch every page: resident
            time.sleep(0.2)
        assert 0.09 < sampler.peak_gib < 0.2
        del held
    finally:
        child.kill()
        child.wait()


def test_the_tree_walk_counts_grandchildren_and_leaves_out_what_is_not_the_trials():
    # A child whose own child holds 200 MiB: the walk down /proc's children lists counts it
    # as psutil's walk of the whole process table does, and leaves the child's subtree out
    # once it is named not the trial's.
    grandchild = "import time; x = bytearray(200 * 2**20); print(flush=True); time.sleep(60)"
    code = (
        "import subprocess, sys, time; "
        f"p = subprocess.Popen([sys.executable, '-c', {grandchild!r}], stdout=sys.stdout); "
        "time.sleep(60)"
    )
    before = memory.process_tree_rss_bytes()
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline()  # the grandchild allocated
        held = memory.process_tree_rss_bytes() - before
        assert held > 200 * 2**20
        assert abs(memory.process_tree_rss_bytes() - sum(memory._psutil_tree_rss().values())) < 16 * 2**20
        memory.not_the_trials(child.pid)
        try:
            assert memory.process_tree_rss_bytes() - before < 16 * 2**20
            assert abs(memory.process_tree_rss_bytes() - sum(memory._psutil_tree_rss().values())) < 16 * 2**20
        finally:
            memory.not_the_trials(child.pid, leaves=True)
    finally:
        for proc in psutil.Process(child.pid).children(recursive=True):
            proc.kill()
        child.kill()
        child.wait()
