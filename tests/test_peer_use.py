"""Which buffers peers may read across processes (collectx.runtime.peer_use.PeerUse), and how a
call's input and output share memory (Communicator's alias codes)."""

from __future__ import annotations

import numpy as np
import pytest

from collectx.config import Config
from collectx.errors import ConfigError
from collectx.planner import make_schedule
from collectx.runtime.communicator import _overlap
from collectx.runtime.executor import FlatPlan
from collectx.runtime.peer_use import DISJOINT, IN_AT_UNIT, OUT_AT_UNIT, OVERLAP, SAME, PeerUse
from collectx.runtime.small import replicated_allreduce
from collectx.schedule import Ref, ScheduleBuilder
from collectx import topology


def test_one_hop_allreduce_lets_every_rank_publish_in_place_or_not():
    use = PeerUse(make_schedule(topology.host(4), "allreduce", 4, 8 << 20))
    for r in range(4):
        assert use.buffers(r, DISJOINT) == (True, True)
        assert use.buffers(r, SAME) == (True, True)
        assert use.buffers(r, OVERLAP) == (False, False)
    assert use.everywhere()


def test_replicated_allreduce_in_place_would_clobber_inputs_peers_still_read():
    # every rank reads every input while writing its own output: fine apart, not in place
    use = PeerUse(replicated_allreduce(3))
    assert use.buffers(0, DISJOINT) == (True, False)
    assert use.buffers(0, SAME) == (False, False)
    assert not use.everywhere()


def test_an_output_peers_write_is_published_for_them_to_write_across_processes():
    b = ScheduleBuilder("broadcast", nranks=2, nchunks=1, root=0)
    d = b.copy(0, 0, dst=Ref(0, "output", 0), src=Ref(0, "input", 0))
    b.copy(0, 0, dst=Ref(1, "output", 0), src=Ref(0, "output", 0), deps=[d])  # a push
    use = PeerUse(b.build())
    assert use.buffers(1, DISJOINT) == (False, True)    # rank 0 writes rank 1's output
    assert use.buffers(1, SAME) == (True, True)         # nobody reads the input under it
    assert use.buffers(0, DISJOINT) == (False, False)   # nobody else touches rank 0's
    assert use.everywhere()


@pytest.mark.parametrize("coll, layout", [("allgather", IN_AT_UNIT), ("reduce_scatter",
                                                                      OUT_AT_UNIT)])
def test_nccl_style_in_place_blocks_publish_only_at_their_own_unit(coll, layout):
    use = PeerUse(make_schedule(topology.host(3), coll, 3, 8 << 20))
    for r in range(3):
        assert layout + r in use.layouts(r)
        assert use.buffers(r, layout + r) == (True, True)
        assert use.buffers(r, SAME) == (False, False)       # unequal lengths: impossible
        assert use.buffers(r, layout + 3) == (False, False)  # no such unit
    assert use.everywhere()


def test_in_place_schedules_publish_nothing():
    # a schedule that itself keeps input and output in one storage (refs alias): staged as ever
    b = ScheduleBuilder("allgather", nranks=2, nchunks=1, inplace=True)
    for r in range(2):
        b.copy(r, 0, dst=Ref(r, "output", 1 - r), src=Ref(1 - r, "input", 0))
    use = PeerUse(b.build())
    assert use.read == {(0, "input"), (1, "input")}
    assert use.buffers(0, DISJOINT) == (False, False) and not use.everywhere()
    assert FlatPlan(make_schedule(None, "allreduce", 2, 8 << 20), 0).cma_buffers(DISJOINT) \
        == (True, True)


def test_overlap_codes():
    x = np.zeros(12, np.float32)
    assert _overlap(x, np.zeros(12, np.float32)) == DISJOINT
    assert _overlap(None, x) == DISJOINT
    assert _overlap(x, x) == SAME
    assert _overlap(x, x.reshape(3, 4)) == SAME
    assert _overlap(x[8:], x) == IN_AT_UNIT + 2          # allgather in place, rank 2
    assert _overlap(x, x[4:8]) == OUT_AT_UNIT + 1        # reduce_scatter in place, rank 1
    assert _overlap(x[1:5], x) == OVERLAP                # not on a block boundary
    assert _overlap(x[:5], x) == OVERLAP                 # 12 is not a multiple of 5
    assert _overlap(x[:6], x[3:9]) == OVERLAP


@pytest.mark.parametrize("raw, want", [(None, True), ("1", True), ("on", True), ("0", False),
                                       ("false", False)])
def test_collectx_cma_setting(raw, want):
    env = {} if raw is None else {"COLLECTX_CMA": raw}
    assert Config.from_env(env).cma is want


def test_collectx_cma_setting_rejects_other_values():
    with pytest.raises(ConfigError, match="COLLECTX_CMA='maybe': expected 0 or 1"):
        Config.from_env({"COLLECTX_CMA": "maybe"})


def _hand_built(*instrs, nchunks=2):
    """A 2-rank schedule of (rank, op, dst, srcs) instructions, one lane each, in order."""
    b = ScheduleBuilder("allreduce", nranks=2, nchunks=nchunks)
    for rank, op, dst, srcs in instrs:
        if op == "copy":
            b.copy(rank, 0, dst=dst, src=srcs[0])
        else:
            b.reduce(rank, 0, dst=dst, srcs=srcs)
    return b.build()


def test_a_write_that_reads_what_it_overwrites_at_another_offset_is_not_ordered():
    # Rank 0 copies input chunks 0-1 onto output chunks 1-2: with the two stored as one buffer
    # the piece written over input chunk 1 lands before the piece that reads it.
    s = _hand_built((0, "copy", Ref(0, "output", 1, 2), [Ref(0, "input", 0, 2)]),
                    (1, "copy", Ref(1, "output", 0, 3), [Ref(1, "input", 0, 3)]), nchunks=3)
    use = PeerUse(s)
    assert not use.reads_before_writes(0, 0)
    assert use.reads_before_writes(1, 0)       # a copy onto itself writes nothing


def test_write_through_waits_for_in_place_reads_of_the_same_memory():
    # Rank 0 reduces into output chunk 0 (which rank 1 reads: it goes through the window), then
    # reads input chunk 0 again: in place, writing chunk 0 through early would clobber it.
    s = _hand_built((0, "reduce", Ref(0, "output", 0, 1), [Ref(0, "input", 0, 1),
                                                           Ref(1, "input", 0, 1)]),
                    (0, "copy", Ref(0, "output", 1, 1), [Ref(0, "input", 0, 1)]),
                    (1, "copy", Ref(1, "output", 0, 1), [Ref(0, "output", 0, 1)]))
    fp = FlatPlan(s, 0)
    assert list(fp.through_mask(DISJOINT)) == [1, 0]
    assert fp.through_mask(SAME) is None
    assert PeerUse(s).own_writes(0) == ({0, 1}, {1})
    # Without the second read the same memory may be written through.
    s2 = _hand_built((0, "reduce", Ref(0, "output", 0, 1), [Ref(0, "input", 0, 1),
                                                            Ref(1, "input", 0, 1)]),
                     (1, "copy", Ref(1, "output", 0, 1), [Ref(0, "output", 0, 1)]))
    assert list(FlatPlan(s2, 0).through_mask(SAME)) == [1, 0]
