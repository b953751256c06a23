"""A plan over peer routes with packed trees staged through host memory beside it: the merge of
two schedules (schedule.layers), where the planner offers it (planner.layers), and that the CPU
executor runs it."""

from __future__ import annotations

import dataclasses

import pytest

import _runtime_workers as W
import collectx
import collectx.topology as T
from collectx.errors import ScheduleError
from collectx.planner import make_schedule, plan, select, trees
from collectx.planner.api import allocation
from collectx.schedule import Ref, verify
from collectx.schedule.ir import Lane
from collectx.schedule.layers import side_by_side
from collectx.topology.view import job_graph, staging_apart

DGX1V = T.load("dgx1v")


# -- side_by_side ---------------------------------------------------------------------------------
@pytest.mark.parametrize("coll", ["allreduce", "allgather", "reduce_scatter", "broadcast",
                                  "reduce"])
@pytest.mark.parametrize("share", [0.05, 0.5, 0.93])
def test_two_schedules_side_by_side_verify_and_split_every_unit_by_the_share(coll, share):
    ranks, view = allocation(DGX1V, [0, 1, 2, 4])
    first = plan(view, coll, 1 << 22, algo="ring", root=1, host_relays=False).schedule
    second = plan(view, coll, 1 << 22, gpus=None, algo="blink" if coll in trees.BLINK
                  else "forest", root=1).schedule
    s = side_by_side(first, second, share)
    assert verify(s).instructions == first.n_instructions + second.n_instructions
    part = s.meta_dict()["first_chunks"] / s.nchunks
    assert abs(part - share) <= max(0.02, 1 / s.nchunks)
    assert all(len(s.lanes[r]) == len(first.lanes[r]) + len(second.lanes[r]) for r in range(4))
    assert s.host_units == tuple(map(max, first.host_units, second.host_units))
    assert s.meta_dict()["layers"] == (first.algorithm, second.algorithm)


def test_a_layer_of_a_fiftieth_gets_its_share_to_a_thousandth():
    # A share missed by a few chunks on the small layer's side slows the whole: the scales
    # come within a thousandth of the lesser part.
    ranks, view = allocation(DGX1V, [0, 1, 2, 4])
    first = plan(view, "allgather", 1 << 26, algo="direct").schedule
    second = plan(view, "allgather", 1 << 20, algo="forest").schedule
    s = side_by_side(first, second, 0.98)
    part = 1 - s.meta_dict()["first_chunks"] / s.nchunks
    assert abs(part - 0.02) <= 0.02 / 1000 + 1e-12


def test_side_by_side_refuses_what_it_cannot_merge():
    ranks, view = allocation(DGX1V, [0, 1, 2])
    ring = plan(view, "allgather", 1 << 20, algo="ring").schedule
    with pytest.raises(ScheduleError, match="collective"):
        side_by_side(ring, plan(view, "allreduce", 1 << 20, algo="ring").schedule, 0.5)
    with pytest.raises(ScheduleError, match="share"):
        side_by_side(ring, ring, 1.0)
    bad = ring.lanes[0][0].instrs[0]._replace(dst=Ref(0, "output", 0, ring.nchunks + 1))
    spanning = dataclasses.replace(ring, lanes=((Lane((bad,)),),) + ring.lanes[1:])
    with pytest.raises(ScheduleError, match="past its unit"):
        side_by_side(spanning, ring, 0.5)
    wide = dataclasses.replace(ring, lanes=(ring.lanes[0] * 128,) + ring.lanes[1:])
    with pytest.raises(ScheduleError, match="lanes"):
        side_by_side(wide, ring, 0.5)


# -- the planner ---------------------------------------------------------------------------------
def _dump(name):
    from _dumps import REAL
    return T.load(REAL / name)


def test_where_fabric_and_staging_are_apart_the_staged_layer_runs_beside_the_peer_plan(
        monkeypatch):
    # HGX A100 (NVSwitch, four NICs), allreduce: the one-hop exchange over NVLink reaches its
    # own bound, and trees staged through host memory over PCIe carry the rest of the bound
    # beside it. Within the fill of the bound, the packing program over both kinds of route
    # plans nothing: it is skipped, or refused by its LP's rate before any rounding.
    G = _dump("hgx_a100_8gpu_4nic_nvidia-smi-topo.txt")
    real = trees._planned

    def planned(name, topo, ranks, collective, nbytes, root, inplace, nchunks, host, *rest):
        out = real(name, topo, ranks, collective, nbytes, root, inplace, nchunks, host, *rest)
        assert host is not True, "the program over both kinds of route planned trees"
        return out
    monkeypatch.setattr(trees, "_planned", planned)
    p = plan(G, "allreduce", 1 << 30)
    assert p.verified and p.algorithm == "direct|blink+host"
    assert 0.99 < p.efficiency <= 1.001
    layers = p.schedule.meta_dict()
    assert 0.9 < layers["first_chunks"] / p.schedule.nchunks < 0.99   # PCIe: a few percent


def test_without_the_staged_layer_the_program_plans_as_before(monkeypatch):
    G = _dump("hgx_a100_8gpu_4nic_nvidia-smi-topo.txt")
    layered = plan(G, "allreduce", 1 << 30, verify=False)
    monkeypatch.setattr(select, "beside", lambda best, *args, **kw: best)
    alone = plan(G, "allreduce", 1 << 30, verify=False)
    assert "|" not in alone.algorithm and alone.schedule.uses_host
    assert layered.predicted.time_us < alone.predicted.time_us


def test_no_staged_layer_where_peer_copies_and_staging_share_links():
    G = T.load("pcie_gen4_8gpu")
    assert not staging_apart(job_graph(G, T.gpus(G)), T.gpus(G))
    p = plan(G, "allreduce", 1 << 28, verify=False)
    assert "|" not in p.algorithm


def test_no_staged_layer_without_host_buffers_or_below_a_chunk_per_group():
    assert "|" not in plan(DGX1V, "broadcast", 1 << 30, gpus=[0, 1],
                           host_relays=False).algorithm
    assert "|" not in plan(DGX1V, "broadcast", 1 << 16, gpus=[0, 1]).algorithm
    p = plan(DGX1V, "broadcast", 1 << 30, gpus=[0, 1])
    assert p.algorithm == "ring|blink+host" and p.efficiency > 0.99


def test_layered_plans_are_the_same_plan_after_plan():
    a = plan(DGX1V, "broadcast", 1 << 30, gpus=[0, 1], verify=False).schedule
    b = plan(DGX1V, "broadcast", 1 << 30, gpus=[0, 1], verify=False).schedule
    assert a == b


# -- the CPU executor -----------------------------------------------------------------------------
@pytest.mark.parametrize("coll", ["broadcast", "allreduce"])
def test_cpu_executor_runs_a_layered_plan_at_an_odd_size(monkeypatch, coll):
    monkeypatch.setenv("COLLECTX_TOPO_FILE", "dgx1v")
    n = (64 << 20) // 4 + 3
    s = make_schedule(DGX1V, coll, 2, n * 4)
    assert "|" in s.algorithm and s.uses_host
    cases = [(coll, "float32", "sum", n, 1, 13), (coll, "int8", "max", 4 * n, 0, 2)]
    assert collectx.launch(W.run_cases, 2, args=(cases,), timeout=300) == [[]] * 2
