"""The cheap-check fast paths of collectx._native.reduce/copy and the C-side overlap checks.

The fast paths (the compiled collectx._fastpath module, and cffi calls without it) skip the
Python overlap test and leave it to cx_reduce / cx_copy, so these tests check that the library
refuses every overlap before writing, that a fast path really runs for plain arrays, and that
anything unusual still reaches the fully checked path. Each test runs with both fast paths.
"""

import numpy as np
import pytest

from collectx import _native as nat
from collectx.errors import ArgumentError


pytestmark = pytest.mark.usefixtures("native_fast_path")


def _checked_path_forbidden(*_args, **_kwargs):
    raise AssertionError("the checked path ran for plain arrays")


def test_plain_arrays_take_the_fast_path(monkeypatch):
    monkeypatch.setattr(nat, "_source_buffers", _checked_path_forbidden)
    monkeypatch.setattr(nat, "_check_output", _checked_path_forbidden)
    srcs = [np.full(33, i, np.float32) for i in range(1, 9)]
    out = nat.reduce(np.empty(33, np.float32), srcs, "avg")
    np.testing.assert_array_equal(out, np.full(33, 4.5, np.float32))
    np.testing.assert_array_equal(nat.copy(np.empty(33, np.float32), srcs[2]), srcs[2])


@pytest.mark.parametrize("k", [1, 2, 5, 8])
def test_library_refuses_partial_overlap_and_writes_nothing(k):
    ffi, lib = nat.ffi, nat.lib
    buf = np.arange(64, dtype=np.float32)
    before = buf.copy()
    dst, others = buf[:32], [np.ones(32, np.float32) for _ in range(k - 1)]
    shifted = buf[16:48]  # overlaps dst by 16 elements
    for position in range(k):
        srcs = others[:position] + [shifted] + others[position:]
        ptrs = ffi.new("void *[]", [nat.ptr(s) for s in srcs])
        rc = lib.cx_reduce(nat.ptr(dst), ptrs, k, 32, lib.CX_FLOAT32, lib.CX_SUM)
        assert rc == lib.CX_ERR_ARG, f"srcs[{position}] overlaps dst"
    np.testing.assert_array_equal(buf, before)


def test_library_allows_exact_in_place_and_disjoint_neighbours():
    ffi, lib = nat.ffi, nat.lib
    buf = np.arange(64, dtype=np.float32)
    dst, neighbour = buf[:32], buf[32:]  # touching, not overlapping
    ptrs = ffi.new("void *[]", [nat.ptr(dst), nat.ptr(neighbour)])
    assert lib.cx_reduce(nat.ptr(dst), ptrs, 2, 32, lib.CX_FLOAT32, lib.CX_SUM) == lib.CX_OK
    np.testing.assert_array_equal(dst, np.arange(32) + np.arange(32, 64))


def test_library_copy_refuses_partial_overlap():
    lib = nat.lib
    buf = np.arange(64, dtype=np.int32)
    assert lib.cx_copy(nat.ptr(buf[:32]), nat.ptr(buf[8:40]), 128) == lib.CX_ERR_ARG
    np.testing.assert_array_equal(buf, np.arange(64))
    assert lib.cx_copy(nat.ptr(buf), nat.ptr(buf), 256) == lib.CX_OK  # self-copy is a no-op


def test_overlap_found_by_the_library_is_named_by_python():
    buf = np.zeros(64, np.float32)
    with pytest.raises(ArgumentError, match=r"dst overlaps srcs\[1\]"):
        nat.reduce(buf[:32], [np.ones(32, np.float32), buf[16:48]])
    with pytest.raises(ArgumentError, match="overlap partially"):
        nat.copy(buf[:32], buf[8:40])
    np.testing.assert_array_equal(buf, 0)


@pytest.mark.parametrize("srcs", [
    pytest.param(lambda a: [a, a[::-1]], id="reversed view"),
    pytest.param(lambda a: [a, a.astype(np.float64)], id="other dtype"),
    pytest.param(lambda a: [a, a[:-1]], id="shorter"),
    pytest.param(lambda a: [a, list(a)], id="python list"),
    pytest.param(lambda a: (a, a), id="tuple of arrays"),
])
def test_unusual_inputs_fall_back_to_the_checked_path(srcs):
    a = np.arange(8, dtype=np.float32)
    build = srcs(a)
    if isinstance(build, tuple):  # any sequence of arrays is accepted, not just lists
        np.testing.assert_array_equal(nat.reduce(np.empty(8, np.float32), build), 2 * a)
        return
    with pytest.raises(ArgumentError):
        nat.reduce(np.empty(8, np.float32), build)


def test_read_only_destination_is_refused_by_the_fast_path_too():
    dst = np.zeros(8, np.float32)
    dst.flags.writeable = False
    with pytest.raises(ArgumentError, match="read-only"):
        nat.reduce(dst, [np.ones(8, np.float32), np.ones(8, np.float32)])
    with pytest.raises(ArgumentError, match="read-only"):
        nat.copy(dst, np.ones(8, np.float32))
