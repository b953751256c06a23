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


@pytest.mark.parametrize("size,ranks,free", [(2, 2, 64 * MiB), (4, 4, 100 * MiB),
                                             (8, 16, 1000 * MiB), (2, 2, 5 * MiB)])
def test_the_fitted_window_is_the_largest_that_fits(size, ranks, free):
    got = fit_window_bytes(256 * MiB, size, ranks, free)
    assert got < 256 * MiB
    assert ranks * Layout.of(got, size).total <= free
    assert ranks * Layout.of(got + 8192, size).total > free   # one step more would not


def test_a_window_that_fits_or_an_unknown_room_is_left_alone():
    assert fit_window_bytes(64 * MiB, 2, 2, 1 << 40) == 64 * MiB
    assert fit_window_bytes(64 * MiB, 2, 2, None) == 64 * MiB


def test_no_room_for_the_smallest_window_is_an_error_naming_the_fix():
    smallest = Layout.of(0, 8).total
    with pytest.raises(CommError, match=r"8 ranks need at least .*--shm-size"):
        fit_window_bytes(64 * MiB, 8, 8, 8 * smallest - 1)
    assert set_bytes_for(fit_window_bytes(64 * MiB, 8, 8, 8 * smallest)) == segment.MIN_SET_BYTES


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
    room = 2 * Layout.of(4 * MiB, 2).total
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
