"""Candidates made and simulated as words (collectx._fastpath.lower_words and word_arrays) are
the schedules the Python emitter makes as objects, word for word, simulate the same, and only
the plan kept is unpacked."""

from __future__ import annotations

import importlib
import struct

import pytest

import collectx.topology as topo
from collectx.errors import ArgumentError
from collectx.planner import plan, trees
import collectx.schedule.treesched as ts
from collectx.schedule.treesched import compiled_helper
from collectx.schedule import Ref, ScheduleBuilder, simulate, verify
from collectx.schedule.ir import BUFFER_INDEX, OP_INDEX, PackedSchedule
from test_tree_items import KINDS, NRANKS, _packing

sim = importlib.import_module("collectx.schedule.simulate")
unpacked = sim.unpacked
needs_words = pytest.mark.skipif(
    any(compiled_helper(n) is None for n in ("lower_words", "word_arrays", "schedule_arrays")),
    reason="no compiled collectx._fastpath")
WORDS = (OP_INDEX["copy"], OP_INDEX["reduce"], BUFFER_INDEX["host"], BUFFER_INDEX["output"])


def _both(kind, buffers, staged):
    """``kind`` lowered as words (a candidate) and as objects by the Python emitter."""
    packing, modes, collective = _packing(kind, staged)
    per_group = 6 if collective == "allreduce" and "forest" in kind else 22
    lower = lambda packed: trees.lower(packing, modes, collective, NRANKS,  # noqa: E731
                                       per_group, buffers=buffers, packed=packed)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ts, "compiled_helper", lambda name: None)
        objects = lower(False)
    return lower(True), objects


@needs_words
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("buffers", [1, 2])
@pytest.mark.parametrize("staged", [False, True], ids=["direct", "host"])
def test_words_are_the_schedule_packed(kind, buffers, staged):
    packed, full = _both(kind, buffers, staged)
    assert isinstance(packed, PackedSchedule) and not isinstance(full, PackedSchedule)
    assert packed.code == full.to_packed()["code"]
    assert packed.unpacked() == full and packed.uses_host == full.uses_host == staged
    assert (packed.nranks, packed.nchunks, packed.host_units, packed.meta) == \
        (full.nranks, full.nchunks, full.host_units, full.meta)
    arrays = compiled_helper("word_arrays")(packed.code, *WORDS)
    assert arrays == compiled_helper("schedule_arrays")(full.lanes)
    verify(packed.unpacked())


@needs_words
@pytest.mark.parametrize("kind", ["allreduce/blink", "allgather/forest"])
def test_a_packed_candidate_simulates_as_its_schedule(kind):
    packed, full = _both(kind, 2, True)
    G = topo.switch(NRANKS)
    ranks = topo.gpus(G)
    a = simulate(packed, G, 1 << 26, ranks=ranks)
    b = simulate(full, G, 1 << 26, ranks=ranks)
    assert a.time_us == b.time_us > 0 and a.link_bytes == b.link_bytes
    kept = unpacked(packed)   # what was simulated carries over to the schedule kept
    assert kept == full and sim.known_steps(kept) == sim.known_steps(packed) is not None
    python = simulate(packed, G, 1 << 26, ranks=ranks, native=False)   # walks the objects
    assert python.time_us == pytest.approx(a.time_us, rel=1e-9)


def test_a_packed_schedule_has_no_lanes_to_misread():
    b = ScheduleBuilder("broadcast", 2, 1)
    b.copy(1, 0, Ref(1, "output", 0), Ref(0, "input", 0))
    s = b.build()
    p = PackedSchedule(ScheduleBuilder("broadcast", 2, 1).build(), s.to_packed()["code"])
    for name in ("lanes", "n_instructions", "instructions", "to_packed", "to_dict"):
        with pytest.raises(AttributeError, match="unpacked"):
            getattr(p, name)
    assert p.unpacked() == s and unpacked(s) is s
    with pytest.raises(ArgumentError, match="instructions of its own"):
        b.build_packed(s.to_packed()["code"])


@needs_words
def test_plans_keep_schedules_and_leave_no_packed_candidate_behind(monkeypatch):
    G = topo.load("dgx1v")
    cases = (("allreduce", [0, 1, 2, 5]), ("allgather", [0, 1, 3, 4, 5, 7]),
             ("broadcast", [0, 1, 2, 3, 5, 6, 7]))
    got = [plan(G, coll, 1 << 30, gpus=gpus) for coll, gpus in cases]
    assert all(p.verified and not isinstance(p.schedule, PackedSchedule) for p in got)
    assert {p.algorithm.split("+")[0] for p in got} >= {"blink", "forest"}
    monkeypatch.setattr(ts, "compiled_helper",
                        lambda name: None if name == "lower_words" else compiled_helper(name))
    objects = [plan(G, coll, 1 << 30, gpus=gpus) for coll, gpus in cases]
    assert [p.schedule for p in got] == [p.schedule for p in objects]
    assert [p.predicted.time_us for p in got] == [p.predicted.time_us for p in objects]


@needs_words
@pytest.mark.parametrize("damage", ["truncated", "trailing", "odd bytes", "engine",
                                    "count too large", "bad dep", "negative count"])
def test_word_arrays_gives_none_for_words_it_cannot_read(damage):
    b = ScheduleBuilder("broadcast", 2, 1)
    first = b.copy(1, 0, Ref(1, "output", 0), Ref(0, "input", 0))
    b.copy(0, 0, Ref(0, "output", 0), Ref(1, "output", 0), [first])
    code = b.build().to_packed()["code"]
    words = list(struct.unpack(f"<{len(code) // 8}q", code))
    read = compiled_helper("word_arrays")
    assert read(code, *WORDS) is not None
    if damage == "truncated":
        code = code[:-8]
    elif damage == "trailing":
        code += code[:8]
    elif damage == "odd bytes":
        code += b"\0"
    else:
        at, value = {"engine": (-1, 0), "count too large": (-2, 7), "bad dep": (16, 5),
                     "negative count": (1, -1)}[damage]
        words[at] = value
        code = struct.pack(f"<{len(words)}q", *words)
    assert read(code, *WORDS) is None
