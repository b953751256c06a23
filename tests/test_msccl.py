"""MSCCL XML export: steps and dependencies of an exported 8-rank allreduce match the IR."""

from collections import defaultdict

import pytest

from collectx.errors import ScheduleError
from collectx.schedule import (Ref, ScheduleBuilder, lower_to_msccl, parse_msccl_xml,
                               to_msccl_xml, verify)
from collectx.schedule._graph import build_graph


def two_ring_allreduce(n):
    """Pull ring allreduce on two lanes going opposite ways round, each on half the chunks.

    Lane 0 reduces its predecessor's partial directly (``rrc``); lane 1 stages it in scratch
    first and reduces locally (``cpy`` + ``re``) and hands the allgather to lane 2, so the
    export needs cross-threadblock deps.
    """
    b = ScheduleBuilder("allreduce", n, 2 * n, algorithm="ring2")
    stage = b.scratch(0, 0)
    for q in range(n):
        b.scratch(q, 4)   # (n-1) steps x n chunks of lane 1, in units of 2n chunks
    rs, ag = {}, {}
    for lane, step in ((0, 1), (1, -1)):
        base = lane * n
        for s in range(n - 1):
            for q in range(n):
                p, c = (q - step) % n, base + (q - step * (1 + s)) % n
                prev = Ref(p, "input" if s == 0 else "output", c)
                after = [rs.get((lane, p, s - 1))]
                if lane == 0:
                    rs[lane, q, s] = b.reduce(q, lane, Ref(q, "output", c),
                                              [Ref(q, "input", c), prev], deps=after)
                else:
                    tmp = Ref(q, "scratch", stage + s * n + c - base)
                    got = b.copy(q, lane, tmp, prev, deps=after)
                    rs[lane, q, s] = b.reduce(q, lane, Ref(q, "output", c),
                                              [Ref(q, "input", c), tmp], deps=[got])
        for t in range(n - 1):
            for q in range(n):
                p, c = (q - step) % n, base + (q - step * t) % n
                made = rs[lane, p, n - 2] if t == 0 else ag[lane, p, t - 1]
                ag[lane, q, t] = b.copy(q, 2 * lane, Ref(q, "output", c), Ref(p, "output", c),
                                        deps=[made])
    return b.build()


def expected_steps(schedule):
    """Non-nop MSCCL steps per rank, derived from the IR by hand."""
    count = [0] * schedule.nranks
    for d, ins in schedule.instructions():
        dst = ins.dst.rank
        remote = [x for x in ins.srcs if x.rank != dst]
        local = [x for x in ins.srcs if x.rank == dst]
        for x in remote:
            count[x.rank] += 1                      # s on the source rank
        if ins.op == "copy":
            count[dst] += 1                         # r or cpy
        else:
            count[dst] += len(remote) + len(local) - 1 + (not remote and local[0] != ins.dst)
    return count


def happens_before_on_gpu(gpu):
    """Predecessors of each (tb, step) on one GPU: threadblock order plus depid/deps."""
    preds = defaultdict(list)
    for tb in gpu.tbs:
        for i, st in enumerate(tb.steps):
            if i:
                preds[tb.id, i].append((tb.id, i - 1))
            if st.depid >= 0:
                preds[tb.id, i].append((st.depid, st.deps))
    return preds


def reaches(preds, src, dst):
    seen, todo = set(), [dst]
    while todo:
        v = todo.pop()
        if v == src:
            return True
        if v not in seen:
            seen.add(v)
            todo.extend(preds[v])
    return False


@pytest.fixture(scope="module")
def ring8():
    s = two_ring_allreduce(8)
    verify(s)
    return s


def test_export_round_trips_through_the_parser(ring8):
    algo = lower_to_msccl(ring8, name="ring8")
    text = to_msccl_xml(ring8, name="ring8")
    back = parse_msccl_xml(text)
    assert back == algo
    assert (back.coll, back.ngpus, back.nchannels, back.nchunksperloop) == ("allreduce", 8, 3, 16)
    assert [g.s_chunks for g in back.gpus] == [64] * 8


def test_step_counts_per_rank_match_the_ir(ring8):
    algo = parse_msccl_xml(to_msccl_xml(ring8))
    real = [sum(st.type != "nop" for tb in g.tbs for st in tb.steps) for g in algo.gpus]
    assert real == expected_steps(ring8)
    kinds = {st.type for g in algo.gpus for tb in g.tbs for st in tb.steps}
    assert {"s", "r", "rrc", "cpy", "re"} <= kinds


def test_every_ir_dependency_is_kept_on_each_shared_gpu(ring8):
    algo = lower_to_msccl(ring8)
    g = build_graph(ring8)
    steps = defaultdict(list)   # (IR node, gpu) -> its MSCCL steps there
    for gpu in algo.gpus:
        for tb in gpu.tbs:
            for i, st in enumerate(tb.steps):
                if st.type != "nop":
                    steps[g.node(st.origin), gpu.id].append((tb.id, i))
    hb = [happens_before_on_gpu(gpu) for gpu in algo.gpus]
    checked = 0
    for v in range(len(g)):
        for p in g.preds[v]:
            for rank in range(ring8.nranks):
                for a in steps.get((p, rank), ()):
                    for b in steps.get((v, rank), ()):
                        assert reaches(hb[rank], a, b), (g.name(p), g.name(v), rank)
                        checked += 1
    assert checked > 100
    cross_tb = sum(st.depid >= 0 for gpu in algo.gpus for tb in gpu.tbs for st in tb.steps)
    assert cross_tb > 0


def test_connections_match_in_fifo_order(ring8):
    algo = lower_to_msccl(ring8)
    sends, recvs = defaultdict(list), defaultdict(list)
    for gpu in algo.gpus:
        for tb in gpu.tbs:
            for st in tb.steps:
                if st.type == "s":
                    sends[gpu.id, tb.send, tb.chan].append((st.dstbuf, st.dstoff, st.cnt))
                elif st.type in ("r", "rrc"):
                    recvs[tb.recv, gpu.id, tb.chan].append((st.dstbuf, st.dstoff, st.cnt))
    assert sends and sends == recvs
    for gpu in algo.gpus:  # one threadblock per (peer, channel) and direction
        for role in ("send", "recv"):
            keys = [(getattr(tb, role), tb.chan) for tb in gpu.tbs if getattr(tb, role) >= 0]
            assert len(keys) == len(set(keys))


def test_multiple_waits_become_nops():
    b = ScheduleBuilder("reduce", 3, 1, root=0)
    b.scratch(0, 2)
    d1 = b.copy(0, 1, Ref(0, "scratch", 0), Ref(1, "input", 0))
    d2 = b.copy(0, 2, Ref(0, "scratch", 1), Ref(2, "input", 0))
    b.reduce(0, 0, Ref(0, "output", 0), [Ref(0, "input", 0), Ref(0, "scratch", 0),
                                         Ref(0, "scratch", 1)], deps=[d1, d2])
    s = b.build()
    verify(s)
    gpu0 = lower_to_msccl(s).gpus[0]
    home = next(tb for tb in gpu0.tbs if any(st.type == "cpy" for st in tb.steps))
    assert [st.type for st in home.steps] == ["nop", "cpy", "re", "re"]
    waited = {(home.steps[0].depid, home.steps[0].deps), (home.steps[1].depid, home.steps[1].deps)}
    assert all(gpu0.tbs[t].steps[i].type == "r" and gpu0.tbs[t].steps[i].hasdep for t, i in waited)
    assert len({t for t, _ in waited}) == 2


def test_parser_reads_msccl_generated_xml_and_rejects_bad_input():
    text = """<algo name="allreduce_small" nchunksperloop="2" nchannels="1" proto="LL" ngpus="2"
      coll="allreduce" inplace="1" minBytes="8" maxBytes="409600">
      <gpu id="0" i_chunks="2" o_chunks="2" s_chunks="2">
        <tb id="0" send="1" recv="1" chan="0">
          <step s="0" type="s" srcbuf="i" srcoff="1" dstbuf="s" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
          <step s="1" type="r" srcbuf="i" srcoff="0" dstbuf="s" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="1"/>
          <step s="2" type="re" srcbuf="s" srcoff="1" dstbuf="i" dstoff="0" cnt="1" depid="0" deps="1" hasdep="0"/>
        </tb>
      </gpu>
      <gpu id="1" i_chunks="2" o_chunks="2" s_chunks="2">
        <tb id="0" send="0" recv="0" chan="0">
          <step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="s" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
        </tb>
      </gpu>
    </algo>"""
    algo = parse_msccl_xml(text)
    assert algo.proto == "LL" and algo.inplace and algo.extra == {"minBytes": "8",
                                                                  "maxBytes": "409600"}
    assert algo.steps_per_gpu() == [3, 1]
    with pytest.raises(ScheduleError, match="waits on tb 0 step 7"):
        parse_msccl_xml(text.replace('depid="0" deps="1"', 'depid="0" deps="7"'))
    with pytest.raises(ScheduleError, match="does not parse"):
        parse_msccl_xml("<algo")
    with pytest.raises(ScheduleError, match="type='zz'"):
        parse_msccl_xml(text.replace('type="re"', 'type="zz"'))


def test_unknown_protocol_is_refused(ring8):
    from collectx.errors import ArgumentError

    with pytest.raises(ArgumentError, match="protocol 'LL256'"):
        to_msccl_xml(ring8, proto="LL256")
    assert 'proto="LL128"' in to_msccl_xml(ring8, proto="LL128")


def test_engine_steps_cannot_be_exported():
    b = ScheduleBuilder("allreduce", 2, 1)
    for r in range(2):
        b.engine(r, 0, Ref(r, "output", 0), [Ref(r, "input", 0)], "allreduce", (0, 1))
    with pytest.raises(ScheduleError, match="MSCCL has no inter-node engine steps"):
        to_msccl_xml(b.build())
