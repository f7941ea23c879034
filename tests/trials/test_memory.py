from __future__ import annotations

import subprocess
import sys
import time

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
