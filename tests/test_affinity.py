"""collectx.runtime.affinity: which CPU each local rank is pinned to."""

from __future__ import annotations

import os

import pytest

from collectx.errors import ArgumentError
from collectx.runtime import affinity


def test_core_policy_pins_rank_r_to_the_rth_allowed_cpu():
    cpus = [3, 5, 8]
    assert [affinity.core_for(r, 3, "core", cpus) for r in range(3)] == cpus
    assert affinity.effective_policy("core", 3, cpus) == "core"


def test_more_ranks_than_cpus_or_policy_none_pins_nothing():
    assert affinity.core_for(0, 4, "core", [0, 1]) is None
    assert affinity.effective_policy("core", 4, [0, 1]) == "none"
    assert affinity.core_for(0, 1, "none", [0, 1]) is None


def test_unknown_policy_is_an_argument_error_naming_the_choices():
    with pytest.raises(ArgumentError, match="expected one of none, core"):
        affinity.core_for(0, 1, "numa", [0])


def test_bind_process_applies_the_mask_to_a_process(tmp_path):
    import subprocess
    import sys
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        cpus = affinity.allowed_cpus()
        got = affinity.bind_process(len(cpus) - 1, len(cpus), "core", pid=child.pid)
        assert got == cpus[-1] and os.sched_getaffinity(child.pid) == {cpus[-1]}
    finally:
        child.kill()
        child.wait()
