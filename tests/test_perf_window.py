"""collectx-perf's sizing of the shared window for its buffers, and the preamble line that says
where collectx's buffers lived."""

import os

from collectx.perf import window
from collectx.perf.driver import _buffer_notes

SPEC = {"collectives": ["allreduce", "allgather"], "sizes": [8, 1 << 20, 256 << 20],
        "dtype": "float32"}


class _Fs:
    def __init__(self, free):
        self.f_bavail, self.f_frsize, self.f_blocks = free, 1, free


def test_heap_holds_the_largest_pair_of_buffers():
    # allreduce at 256 MiB: 256 MiB in + 256 MiB out (allgather: 128 in, 256 out on 2 ranks)
    assert window.heap_bytes_needed(SPEC, 2) == (512 << 20) + window.HEAP_SLACK


def test_window_grows_only_when_shm_has_room_and_nothing_forces_a_size(monkeypatch):
    need = window.heap_bytes_needed(SPEC, 2)
    monkeypatch.setattr(os, "statvfs", lambda path: _Fs(8 << 30))
    assert window.window_for(SPEC, 2, env={}) == need
    assert window.window_for(SPEC, 2, env={"COLLECTX_WINDOW_BYTES": "1000000"}) is None
    assert window.window_for(dict(SPEC, device="cuda"), 2, env={}) is None
    assert window.window_for(dict(SPEC, dtype="bfloat16"), 2, env={}) is None
    assert window.window_for(dict(SPEC, sizes=[8, 1024]), 2, env={}) is None
    monkeypatch.setattr(os, "statvfs", lambda path: _Fs(2 * need))   # room for one rank only
    assert window.window_for(SPEC, 2, env={}) is None
    monkeypatch.setattr(os, "statvfs", lambda path: _Fs(6 * need))   # not in half the room
    assert window.window_for(SPEC, 2, env={}) is None

    def missing(path):
        raise FileNotFoundError(path)
    monkeypatch.setattr(os, "statvfs", missing)
    assert window.window_for(SPEC, 2, env={}) is None


def test_preamble_names_the_buffers_and_which_collectives_ran_on_which():
    rows = [{"collective": "allreduce", "buffers": "comm.empty"},
            {"collective": "allreduce", "buffers": "comm.empty"}]
    assert _buffer_notes(rows) == [
        "# collectx buffers: arrays from comm.empty in the shared window (used in place: zero "
        "copy)"]
    notes = _buffer_notes(rows + [{"collective": "alltoall", "buffers": "host"}])
    assert [n.split(":")[0] for n in notes] == ["# collectx buffers (allreduce)",
                                                "# collectx buffers (alltoall)"]
    assert "COLLECTX_WINDOW_BYTES" in notes[1]
    assert _buffer_notes([{"collective": "allreduce"}]) == []    # peers' rows say nothing


def test_buffers_are_labelled_by_where_the_communicator_put_them():
    import numpy as np
    from collectx.perf import buffers
    from collectx.perf.adapters import MpiComm

    class Window:
        def empty(self, shape, dtype):
            return np.empty(shape, dtype)

    class Plain(Window):
        empty_kind = "host"      # as the Open MPI and gloo adapters hand out ordinary memory

    assert buffers.alloc_where(Window(), 4, "float32")[1] == "comm.empty"
    assert buffers.alloc_where(Plain(), 4, "float32")[1] == "host"
    assert buffers.alloc_where(None, 4, "float32")[1] == "host"
    assert MpiComm.empty_kind == "host"
