"""Windows fit the room in /dev/shm: a small mount (a container's 64 MiB) cuts the window
instead of letting a rank die of SIGBUS on its first write past the room."""

import os
import time

import pytest

from collectx.errors import ArgumentError, CommError
from collectx.runtime import segment, window as window_mod
from collectx.runtime.communicator import _heap_fix
from collectx.runtime.heap import Heap
from collectx.runtime.segment import Layout, fit_window_bytes, set_bytes_for, shm_free
from collectx.runtime.store import HashStore
from collectx.runtime.window import Window

from _threads import on_threads

MiB = 1 << 20


@pytest.fixture(autouse=True)
def _no_held_segments(monkeypatch):
    """Windows other tests of this process left open would count as promised room here."""
    monkeypatch.setattr(segment, "_held", set())


@pytest.mark.parametrize("size,ranks,free", [(2, 2, 64 * MiB), (4, 4, 100 * MiB),
                                             (8, 16, 1000 * MiB), (2, 2, 10 * MiB),
                                             (8, 8, 64 * MiB)])
def test_the_fitted_window_is_the_largest_that_fits_in_half_the_room(size, ranks, free):
    got = fit_window_bytes(256 * MiB, size, ranks, free)
    assert got < 256 * MiB
    assert ranks * Layout.of(got, size).total <= free // 2
    assert ranks * Layout.of(got + 8192, size).total > free // 2   # one step more would not


def test_a_window_that_fits_or_an_unknown_room_is_left_alone():
    assert fit_window_bytes(64 * MiB, 2, 2, 1 << 40) == 64 * MiB
    enough = 2 * 2 * Layout.of(64 * MiB, 2).total
    assert fit_window_bytes(64 * MiB, 2, 2, enough) == 64 * MiB
    assert fit_window_bytes(64 * MiB, 2, 2, enough - 1) < 64 * MiB
    assert fit_window_bytes(64 * MiB, 2, 2, None) == 64 * MiB


def test_no_room_for_the_smallest_window_is_an_error_naming_the_fix():
    smallest = Layout.of(0, 8).total
    with pytest.raises(CommError, match=r"8 ranks need at least .*--shm-size"):
        fit_window_bytes(64 * MiB, 8, 8, 2 * 8 * smallest - 1)
    got = fit_window_bytes(64 * MiB, 8, 8, 2 * 8 * smallest)
    assert set_bytes_for(got) == segment.MIN_SET_BYTES


def test_a_cut_window_cuts_the_point_to_point_slots_with_it():
    # 8 ranks in a container's 64 MiB: 1 MiB slots per peer alone would take 2 x 64 MiB
    got = fit_window_bytes(64 * MiB, 8, 8, 64 * MiB)
    layout = Layout.of(got, 8)
    assert layout.p2p_slot_bytes == layout.set_bytes < segment.P2P_SLOT_BYTES
    assert Layout.of(64 * MiB, 8).p2p_slot_bytes == segment.P2P_SLOT_BYTES


def test_collectives_and_send_recv_run_in_the_smallest_window(monkeypatch):
    import numpy as np

    import collectx
    monkeypatch.setattr(window_mod, "shm_free", lambda path: 2 * 2 * Layout.of(0, 2).total)
    store = HashStore()
    n = (1 << 20) + 3                         # 16 pieces of the 64 KiB slot's halves, and a bit

    def rank_fn(rank):
        with collectx.init(rank, 2, store=store) as comm:
            assert comm._window.set_bytes == comm._window.p2p_slot_bytes == segment.MIN_SET_BYTES
            x = np.arange(n, dtype=np.float32) * (rank + 1)
            comm.allreduce(x)
            msg = np.arange(n, dtype=np.int32)
            if rank == 0:
                comm.send(msg, 1)
                return bool(np.array_equal(x, np.arange(n, dtype=np.float32) * 3))
            got = np.zeros(n, np.int32)
            comm.recv(got, 0)
            return bool(np.array_equal(got, msg)) and bool(x[-1] == (n - 1) * 3)
    results, errors = on_threads(2, rank_fn)
    assert errors == [None, None] and results == [True, True]


def test_room_promised_to_held_segments_is_not_room():
    whole = fit_window_bytes(64 * MiB, 2, 2, 64 * MiB)
    assert fit_window_bytes(64 * MiB, 2, 2, 64 * MiB, promised=32 * MiB) < whole
    assert fit_window_bytes(64 * MiB, 2, 2, 64 * MiB, promised=32 * MiB) == \
        fit_window_bytes(64 * MiB, 2, 2, 32 * MiB)
    assert fit_window_bytes(64 * MiB, 2, 2, 1 << 40, promised=(1 << 40) - 64 * MiB) < 64 * MiB
    with pytest.raises(CommError, match=r"has 64.0 MiB free \(63.0 MiB of it promised to "
                                        r"windows the ranks hold\); 2 ranks need"):
        fit_window_bytes(64 * MiB, 2, 2, 64 * MiB, promised=63 * MiB)


def test_unbacked_bytes_counts_what_held_segments_may_still_take(tmp_path):
    before = segment.unbacked_bytes()
    fd = os.memfd_create("test")
    os.ftruncate(fd, 4 * MiB)
    segment.hold(fd)
    try:
        assert segment.unbacked_bytes() - before == 4 * MiB
        os.pwrite(fd, b"x" * MiB, 0)
        assert segment.unbacked_bytes() - before == 3 * MiB
    finally:
        segment.release(fd)
    assert segment.unbacked_bytes() == before


class _Fs:
    def __init__(self, free, blocks):
        self.f_bavail, self.f_frsize, self.f_blocks = free, 4096, blocks


def test_shm_free_reads_the_mount(monkeypatch, tmp_path):
    assert shm_free(str(tmp_path / "missing")) is None
    monkeypatch.setattr(os, "statvfs", lambda path: _Fs(10, 100))
    assert shm_free("/dev/shm") == 40960
    monkeypatch.setattr(os, "statvfs", lambda path: _Fs(0, 0))   # tmpfs without a size limit
    assert shm_free("/dev/shm") is None


def _make_windows(nranks, window_bytes, timeout=10.0):
    """nranks Windows made by threads of this process; returns (windows, errors)."""
    store = HashStore()
    return on_threads(nranks, lambda r: Window(r, nranks, store, "w", window_bytes, timeout,
                                               cma=False))


def test_windows_shrink_to_the_room_and_say_so(monkeypatch):
    room = 2 * 2 * Layout.of(4 * MiB, 2).total
    monkeypatch.setattr(window_mod, "shm_free", lambda path: room)
    windows, errors = _make_windows(2, 64 * MiB)
    try:
        assert errors == [None, None]
        assert [w.fitted_to_shm for w in windows] == [True, True]
        assert windows[0].set_bytes == windows[1].set_bytes == 2 * MiB
        heap = Heap(windows[0].heap_bytes, _heap_fix(windows[0]))
        with pytest.raises(ArgumentError, match="to fit /dev/shm; give the machine more shared"):
            heap.alloc(windows[0].heap_bytes + 1)
    finally:
        for w in windows:
            w.close()


def test_no_room_fails_every_rank_at_once(monkeypatch):
    monkeypatch.setattr(window_mod, "shm_free", lambda path: 1 * MiB)
    start = time.monotonic()
    windows, errors = _make_windows(3, 64 * MiB, timeout=30.0)
    assert windows == [None] * 3
    assert all(isinstance(e, CommError) and "/dev/shm has 1.0 MiB free" in str(e)
               for e in errors)
    assert time.monotonic() - start < 10   # not after the 30 s rendezvous timeout
    assert not [n for n in os.listdir(window_mod.SHM_DIR) if n.startswith(window_mod.PREFIX)
                and n.split("-")[1] == str(os.getpid())]


def _allocated() -> int:
    """Bytes tmpfs has allocated to this process's segments: what a real mount no longer has
    free (the pages the windows wrote, their control blocks first)."""
    return sum(os.fstat(fd).st_blocks * 512 for fd in segment._held)


def test_a_second_communicator_is_fitted_to_the_room_the_first_left(monkeypatch):
    """Two windows among the same ranks (two torch process groups, say). Sparse segments leave
    the room looking free: without counting what the first may still take, the second was
    fitted to the same room, and the two together could overrun it (SIGBUS)."""
    room = 2 * 2 * Layout.of(4 * MiB, 2).total
    monkeypatch.setattr(window_mod, "shm_free", lambda path: room - _allocated())
    first, errors = _make_windows(2, 64 * MiB)
    assert errors == [None, None] and first[0].set_bytes == 2 * MiB
    try:
        second, errors = _make_windows(2, 64 * MiB)   # the room left: half of it
        assert errors == [None, None]
        assert 2 * (second[0]._maps[0].size() + first[0]._maps[0].size()) <= 3 * room // 4
        assert second[0].set_bytes < first[0].set_bytes
        for w in second:
            w.close()
    finally:
        for w in first:
            w.close()
    again, errors = _make_windows(2, 64 * MiB)   # the room is back once both are closed
    assert errors == [None, None] and again[0].set_bytes == 2 * MiB
    for w in again:
        w.close()


def test_when_held_windows_leave_too_little_room_the_error_says_so(monkeypatch):
    smallest = Layout.of(0, 2).total
    room = 2 * 2 * Layout.of(4 * MiB, 2).total
    monkeypatch.setattr(window_mod, "shm_free", lambda path: room)
    first, _ = _make_windows(2, 64 * MiB)
    promised = segment.unbacked_bytes()          # both ranks' segments: threads of this process
    assert promised > room // 3
    monkeypatch.setattr(window_mod, "shm_free", lambda path: promised + 4 * smallest - 8192)
    try:
        second, errors = _make_windows(2, 64 * MiB)
        assert second == [None, None]
        assert all(isinstance(e, CommError) and "promised to windows the ranks hold" in str(e)
                   for e in errors)
    finally:
        for w in first:
            w.close()
