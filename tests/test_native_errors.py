"""Bad input to the native kernels: the right exception type, and the output left untouched.

Every test runs with each fast path in front of the checked path (the compiled collectx._fastpath
module when it is built, and the cffi fallback): either must leave bad input to the checked path.
"""

import numpy as np
import pytest

from collectx import _native as nat
from collectx.errors import ArgumentError, DTypeError, NativeError, PeerFailure, Timeout


pytestmark = pytest.mark.usefixtures("native_fast_path")


def sentinel(n=16, dtype=np.float32):
    return np.full(n, 7, dtype=dtype)


def expect_untouched(exc, call, dst, match=None):
    before = dst.copy()
    with pytest.raises(exc, match=match):
        call()
    np.testing.assert_array_equal(dst, before)


def test_mismatched_lengths():
    dst = sentinel()
    expect_untouched(ArgumentError, lambda: nat.reduce(dst, [sentinel(), sentinel(15)]), dst,
                     "length")


def test_mismatched_dtypes():
    dst = sentinel()
    expect_untouched(ArgumentError,
                     lambda: nat.reduce(dst, [sentinel(), sentinel(dtype=np.float64)]), dst,
                     "dtype")


def test_non_contiguous_output():
    base = sentinel(32)
    dst = base[::2]
    expect_untouched(ArgumentError, lambda: nat.reduce(dst, [sentinel(), sentinel()]), base,
                     "contiguous")


def test_non_contiguous_source():
    dst = sentinel()
    expect_untouched(ArgumentError, lambda: nat.reduce(dst, [sentinel(), sentinel(32)[::2]]),
                     dst, "contiguous")


def test_read_only_output():
    dst = sentinel()
    dst.flags.writeable = False
    expect_untouched(ArgumentError, lambda: nat.reduce(dst, [sentinel(), sentinel()]), dst,
                     "read-only")
    expect_untouched(ArgumentError, lambda: nat.scale(dst, 0.5), dst, "read-only")
    expect_untouched(ArgumentError, lambda: nat.copy(dst, sentinel()), dst, "read-only")


@pytest.mark.parametrize("dtype", [np.bool_, np.complex64, np.uint32, np.int16])
def test_unsupported_dtype(dtype):
    dst = np.ones(8, dtype=dtype)
    expect_untouched(DTypeError, lambda: nat.reduce(dst, [dst.copy(), dst.copy()]), dst,
                     "not supported")


def test_byte_swapped_arrays():
    dst = sentinel(dtype=">f4")
    expect_untouched(DTypeError, lambda: nat.reduce(dst, [dst.copy(), dst.copy()]), dst,
                     "byte-swapped")


def test_object_arrays_are_not_copied_as_bytes():
    dst = np.array([object()] * 4)
    expect_untouched(DTypeError, lambda: nat.copy(dst, np.array([1, 2, 3, 4], dtype=object)),
                     dst, "object")


def test_unsupported_op():
    dst = sentinel()
    expect_untouched(DTypeError, lambda: nat.reduce(dst, [sentinel(), sentinel()], op="mean"),
                     dst, "op 'mean'")


def test_partial_overlap_is_refused():
    buf = np.arange(24, dtype=np.float32)
    dst, src1 = buf[0:16], buf[8:24]
    expect_untouched(ArgumentError, lambda: nat.reduce(dst, [sentinel(), src1]), buf, "overlap")
    expect_untouched(ArgumentError, lambda: nat.copy(dst, src1), buf, "overlap")


def test_dst_may_only_be_the_first_source():
    dst = sentinel()
    expect_untouched(ArgumentError, lambda: nat.reduce(dst, [sentinel(), dst]), dst, "srcs\\[1\\]")
    shifted = np.arange(17, dtype=np.float32)
    expect_untouched(ArgumentError, lambda: nat.reduce(shifted[1:], [shifted[:-1], sentinel()]),
                     shifted, "overlap")


def test_no_sources():
    dst = sentinel()
    expect_untouched(ArgumentError, lambda: nat.reduce(dst, []), dst, "k >= 1")
    expect_untouched(ArgumentError, lambda: nat.reduce(dst, sentinel()), dst, "list")


def test_not_an_array():
    dst = sentinel()
    expect_untouched(ArgumentError, lambda: nat.reduce(dst, [[1.0] * 16, sentinel()]), dst,
                     "numpy.ndarray")


def test_dtype_override_needs_same_element_size():
    dst = sentinel()
    expect_untouched(DTypeError, lambda: nat.reduce(dst, [sentinel(), sentinel()],
                                                    dtype="bfloat16"), dst, "element sizes")


def test_native_status_codes_reach_check_rc():
    ffi, lib = nat.ffi, nat.lib
    a, b = sentinel(), sentinel()
    srcs = ffi.new("void *[]", [nat.ptr(a), nat.ptr(b)])
    assert lib.cx_reduce(nat.ptr(a), srcs, 0, 16, lib.CX_FLOAT32, lib.CX_SUM) == lib.CX_ERR_ARG
    assert lib.cx_reduce(nat.ptr(a), srcs, 2, 16, 99, lib.CX_SUM) == lib.CX_ERR_DTYPE
    assert lib.cx_reduce(nat.ptr(a), srcs, 2, 16, lib.CX_FLOAT32, 99) == lib.CX_ERR_OP
    assert lib.cx_reduce(ffi.NULL, srcs, 2, 16, lib.CX_FLOAT32, lib.CX_SUM) == lib.CX_ERR_ARG
    assert lib.cx_scale(nat.ptr(a), 16, lib.CX_INT32, 0.4) == lib.CX_ERR_ARG
    np.testing.assert_array_equal(a, sentinel())
    for rc, exc in ((-1, DTypeError), (-2, DTypeError), (-3, ArgumentError), (-4, NativeError),
                    (-7, Timeout), (-8, PeerFailure), (-42, NativeError)):
        with pytest.raises(exc):
            nat.check_rc(rc)


def test_cuda_entry_points_fail_cleanly_without_a_device():
    if nat.cuda_available():
        pytest.skip("a CUDA device is visible")
    lib, ffi = nat.lib, nat.ffi
    rc = lib.cx_cuda_copy(ffi.NULL, ffi.NULL, 0, ffi.NULL)
    assert rc in (lib.CX_OK, lib.CX_ERR_NO_CUDA)  # nothing to copy: never touches the driver
    srcs = ffi.new("void *[]", 2)
    assert lib.cx_cuda_reduce(ffi.NULL, srcs, 2, 16, lib.CX_FLOAT32, lib.CX_SUM, ffi.NULL) < 0
