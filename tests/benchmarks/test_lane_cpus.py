"""The lanes' CPUs (benchmarks/gpu/lane_cpus.py): whole cores near each lane's GPU."""

from __future__ import annotations

import os

import pytest

from benchmarks.gpu.lane_cpus import cpu_list, host_cores, split


def two_sockets() -> tuple[dict[int, set[int]], dict[int, tuple[int, int]]]:
    """A host of two sockets of 8 cores with 2 threads each, numbered as Linux numbers them
    (the second threads after all the first ones), and 4 GPUs, two near each socket."""
    core_of = {}
    for cpu in range(32):
        thread0 = cpu % 16
        core_of[cpu] = (thread0 // 8, thread0 % 8)
    socket0 = {c for c in range(32) if core_of[c][0] == 0}
    socket1 = set(range(32)) - socket0
    return {0: socket0, 1: socket0, 2: socket1, 3: socket1}, core_of


def test_lanes_of_one_socket_split_its_cores_and_keep_both_threads_of_each():
    affinity, core_of = two_sockets()
    lanes = split([0, 1, 2, 3], affinity, core_of)
    assert cpu_list(lanes[0]) == "0-3,16-19"
    assert cpu_list(lanes[1]) == "4-7,20-23"
    assert cpu_list(lanes[2]) == "8-11,24-27"
    assert cpu_list(lanes[3]) == "12-15,28-31"
    # No core is shared: each lane's threads belong to cores no other lane has.
    cores = [{core_of[c] for c in cpus} for cpus in lanes.values()]
    assert sum(len(c) for c in cores) == len(set().union(*cores)) == 16


def test_a_lane_alone_near_a_socket_gets_all_of_it():
    affinity, core_of = two_sockets()
    lanes = split([1, 2], affinity, core_of)
    assert lanes[1] == sorted(affinity[1]) and lanes[2] == sorted(affinity[2])


def test_more_lanes_than_cores_is_refused_naming_the_cpus():
    core_of = {0: (0, 0), 1: (0, 0)}  # one core, two threads
    with pytest.raises(ValueError, match=r"GPUs \[0, 1\] share 1 core\(s\) \(0-1\)"):
        split([0, 1], {0: {0, 1}, 1: {0, 1}}, core_of)


def test_this_hosts_cores_are_read_from_sysfs():
    cores = host_cores()
    assert set(cores) >= os.sched_getaffinity(0)
    assert all(package >= 0 and core >= 0 for package, core in cores.values())
