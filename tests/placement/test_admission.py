"""Admission by reservations and by the node's measured figures (pure)."""

from __future__ import annotations

from dataclasses import replace

from dsec.placement.admission import AdmissionPolicy, NodeLoad, admit, fitting, room

# this machine's shape: 2 cores, 24 GiB
IDLE = NodeLoad("node-a", ("container",), cpus=2, memory_mb=24576, sandboxes=0,
                memory_reserved_mb=0, cpu_reserved=0.0, memory_available_mb=22000,
                swap_free_mb=12000, cpu_used=0.2, memory_pressure=0.0, cpu_pressure=1.0)


def test_idle_sandboxes_are_admitted_far_past_the_machine():
    # 3,200 idle busybox sandboxes of 64 MiB, cpu 0.1: 200 GiB and 320 CPUs reserved
    held = replace(IDLE, sandboxes=3199, memory_reserved_mb=3199 * 64, cpu_reserved=319.9)
    assert admit(held, "container", 64, 0.1) is None
    assert fitting(IDLE, "container", 64, 0.1, count=3200) == 3200


def test_short_memory_refuses_whatever_the_reservations_say():
    short = replace(IDLE, memory_available_mb=300, swap_free_mb=200)
    msg = admit(short, "container", 64, 0.1)
    assert msg and "short of memory" in msg and "300 MiB available" in msg
    assert room(short, "container", 64, 0.1) == 0


def test_memory_pressure_refuses_once_memory_is_overcommitted():
    stalled = replace(IDLE, memory_pressure=35.0, memory_reserved_mb=30000)
    msg = admit(stalled, "container", 64, 0.1)
    assert msg and "memory pressure" in msg and "35.0 %" in msg
    within = replace(stalled, memory_reserved_mb=1000)  # reservations fit the machine
    assert admit(within, "container", 64, 0.1) is None


def test_busy_cpus_refuse_once_cpus_are_overcommitted():
    busy = replace(IDLE, cpu_used=1.95, cpu_pressure=97.0, cpu_reserved=40.0)
    msg = admit(busy, "container", 64, 0.1)
    assert msg and "short of CPU" in msg and "1.9 of 2 cores busy" in msg
    assert admit(replace(busy, cpu_reserved=0.5), "container", 64, 0.5) is None
    assert admit(replace(busy, cpu_pressure=20.0), "container", 64, 0.1) is None


def test_a_node_that_measures_nothing_is_judged_on_reservations():
    blind = NodeLoad("node-b", ("container",), cpus=2, memory_mb=1024, sandboxes=0,
                     memory_reserved_mb=0, cpu_reserved=0.0)
    assert admit(blind, "container", 64, 0.1) is None
    assert "MiB reserved" in admit(blind, "container", 64, 0.1, count=1000)


def test_room_is_bounded_by_the_real_headroom():
    tight = replace(IDLE, memory_available_mb=1100, swap_free_mb=0)
    # 76 MiB over the 1024 kept back: each new sandbox takes ~2 MiB at once
    assert room(tight, "container", 64, 0.1) == 38


def test_policy_ratios_still_cap():
    policy = AdmissionPolicy(memory_overcommit=1.0)
    assert "MiB reserved" in admit(IDLE, "container", 64, 0.1, policy, count=400)


def test_a_create_burst_busy_host_is_no_cpu_shortage_while_the_sandboxes_idle():
    # the node's own work (runc starting sandboxes) keeps both cores busy; its 900
    # sandboxes use almost nothing: admitted. Once they are what is busy: refused.
    burst = replace(IDLE, sandboxes=900, cpu_reserved=90.0, cpu_used=1.9, cpu_pressure=93.0,
                    sandbox_cpu_used=0.05)
    assert admit(burst, "container", 32, 0.1) is None
    msg = admit(replace(burst, sandbox_cpu_used=1.9), "container", 32, 0.1)
    assert msg and "short of CPU: its sandboxes keep 1.9 of 2 cores busy" in msg
