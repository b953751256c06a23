"""collectx._fastpath, the compiled fast path of collectx._native.reduce/copy.

Its contract: True when the call ran, False with nothing touched for anything off the fast path
(the checked Python path then raises the precise error). These tests call the module directly
with every kind of unusual input, check results against numpy, and check that collectx._native
falls back to cffi calls when the module is missing or speaks another contract version.
"""

import threading

import numpy as np
import pytest

from collectx import _native as nat
from collectx.errors import ArgumentError

fp = nat._compiled_module()
pytestmark = pytest.mark.skipif(fp is None, reason="collectx._fastpath is not built")


@pytest.fixture(autouse=True)
def bound():
    assert nat._bind_fast_paths() == "compiled"
    yield
    nat._bind_fast_paths()


def f32(n=16, value=1.0):
    return np.full(n, value, np.float32)


def test_public_calls_use_the_compiled_module():
    assert nat._fast_reduce is fp.reduce and nat._fast_copy is fp.copy
    assert nat.build_info()["fast_path"] == "compiled"


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "int64", "float16", "float32",
                                   "float64", np.intc, np.longlong])
@pytest.mark.parametrize("op", ["sum", "max", "min", "prod"])
def test_results_match_numpy(dtype, op):
    rng = np.random.default_rng(1)
    srcs = [rng.integers(-3, 4, 37).astype(dtype) for _ in range(5)]
    dst = np.empty_like(srcs[0])
    assert fp.reduce(dst, srcs, op, None) is True
    ufunc = {"sum": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}[op]
    np.testing.assert_array_equal(dst, ufunc.reduce(np.stack(srcs), axis=0).astype(dtype))


def test_avg_divides_once_and_truncates_integers():
    srcs = [np.array([7, -7, 1], np.int32), np.array([0, 0, 2], np.int32)]
    assert fp.reduce(out := np.empty(3, np.int32), srcs, "avg", None)
    np.testing.assert_array_equal(out, [3, -3, 1])
    assert fp.reduce(out32 := f32(4), [f32(4, 1), f32(4, 2), f32(4, 6)], "avg", None)
    np.testing.assert_array_equal(out32, 3.0)


def test_many_sources_large_arrays_and_tuples():
    # k = 20 needs a heap pointer array; 1 MiB per input releases the GIL.
    n = 1 << 18
    srcs = tuple(np.full(n, i, np.float32) for i in range(20))
    assert fp.reduce(out := np.empty(n, np.float32), srcs, "sum", None)
    np.testing.assert_array_equal(out, sum(range(20)))
    assert fp.copy(out, srcs[3]) and (out == 3).all()


def test_in_place_accumulate():
    acc, other = f32(8, 2), f32(8, 5)
    assert fp.reduce(acc, [acc, other], "sum", None)
    np.testing.assert_array_equal(acc, 7)


def test_bfloat16_names_uint16_bits():
    bits = (np.array([1.5, -2.0, 3.0], np.float32).view(np.uint32) >> 16).astype(np.uint16)
    out = np.empty_like(bits)
    assert fp.reduce(out, [bits, bits], "sum", "bfloat16")
    widened = (out.astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(widened, [3.0, -4.0, 6.0])


def _read_only(a):
    a.flags.writeable = False
    return a


OFF_PATH_REDUCE = {
    "dst not an array": lambda: ([1.0, 2.0], [f32(2), f32(2)], "sum", None),
    "dst strided": lambda: (f32(8)[::2], [f32(4), f32(4)], "sum", None),
    "dst read-only": lambda: (_read_only(f32()), [f32(), f32()], "sum", None),
    "byte-swapped": lambda: (np.ones(4, ">f4"), [np.ones(4, ">f4")] * 2, "sum", None),
    "unsupported dtype": lambda: (np.ones(4, np.uint32), [np.ones(4, np.uint32)] * 2, "sum",
                                  None),
    "bool": lambda: (np.ones(4, bool), [np.ones(4, bool)] * 2, "sum", None),
    "other dtype": lambda: (f32(), [f32(), np.ones(16)], "sum", None),
    "shorter": lambda: (f32(), [f32(), f32(15)], "sum", None),
    "source strided": lambda: (f32(), [f32(), f32(32)[::2]], "sum", None),
    "source not an array": lambda: (f32(), [f32(), [1.0] * 16], "sum", None),
    "no sources": lambda: (f32(), [], "sum", None),
    "srcs an array": lambda: (f32(), f32(), "sum", None),
    "srcs a generator": lambda: (f32(), (a for a in [f32(), f32()]), "sum", None),
    "unknown op": lambda: (f32(), [f32(), f32()], "mean", None),
    "op not a str": lambda: (f32(), [f32(), f32()], 0, None),
    "unknown dtype name": lambda: (f32(), [f32(), f32()], "sum", "float8"),
    "dtype name of other size": lambda: (f32(), [f32(), f32()], "sum", "bfloat16"),
    "dtype not a str": lambda: (f32(), [f32(), f32()], "sum", np.float32),
}


@pytest.mark.parametrize("case", sorted(OFF_PATH_REDUCE))
def test_reduce_declines_unusual_input_untouched(case):
    dst, srcs, op, dtype = OFF_PATH_REDUCE[case]()
    before = np.array(dst, copy=True)
    assert fp.reduce(dst, srcs, op, dtype) is False
    np.testing.assert_array_equal(dst, before)


def test_overlap_is_declined_before_any_write():
    buf = np.arange(48, dtype=np.float32)
    before = buf.copy()
    assert fp.reduce(buf[:32], [f32(32), buf[16:48]], "sum", None) is False
    assert fp.reduce(buf[16:48], [buf[:32], f32(32)], "sum", None) is False
    assert fp.copy(buf[:32], buf[8:40]) is False
    np.testing.assert_array_equal(buf, before)


@pytest.mark.parametrize("case", ["read-only", "strided source", "other dtype", "shorter",
                                  "object", "not an array"])
def test_copy_declines_unusual_input_untouched(case):
    dst = f32(8)
    src = {"read-only": f32(8, 2), "strided source": f32(16, 2)[::2], "other dtype": np.ones(8),
           "shorter": f32(7, 2), "object": np.array([2.0] * 8, dtype=object),
           "not an array": [2.0] * 8}[case]
    if case == "read-only":
        dst = _read_only(dst)
    elif case == "object":
        dst = np.array([1.0] * 8, dtype=object)
    before = dst.copy()
    assert fp.copy(dst, src) is False
    np.testing.assert_array_equal(dst, before)


def test_wrong_argument_counts_raise_type_error():
    with pytest.raises(TypeError, match="4 arguments"):
        fp.reduce(f32(), [f32()])
    with pytest.raises(TypeError, match="2 arguments"):
        fp.copy(f32())


def test_bind_refuses_incomplete_tables():
    lib, ffi = nat.lib, nat.ffi
    address = int(ffi.cast("uintptr_t", lib.cx_reduce))
    with pytest.raises(ValueError, match="'avg'"):
        fp.bind(address, address, address, address, nat.DTYPES, {"sum": 0}, nat.check_rc)
    with pytest.raises(ValueError, match="address is 0"):
        fp.bind(0, address, address, address, nat.DTYPES, nat.OPS, nat.check_rc)


def test_large_calls_from_several_threads():
    n = 1 << 20
    srcs = [np.full(n, 1, np.float32) for _ in range(8)]
    out, errors = np.empty(n, np.float32), []

    def worker():
        try:
            for _ in range(5):
                assert fp.reduce(out, srcs, "sum", None)
        except AssertionError as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    np.testing.assert_array_equal(out, 8)


def test_missing_module_falls_back_to_cffi(monkeypatch):
    monkeypatch.setattr(nat, "_compiled_module", lambda *_: None)
    assert nat._bind_fast_paths() == "cffi"
    np.testing.assert_array_equal(nat.reduce(f32(4), [f32(4, 1), f32(4, 2)]), 3.0)
    with pytest.raises(ArgumentError, match="read-only"):
        nat.reduce(_read_only(f32(4)), [f32(4), f32(4)])


def test_module_of_another_contract_version_is_not_used(monkeypatch):
    monkeypatch.setattr(fp, "API", nat._FASTPATH_API + 1)
    assert nat._compiled_module() is None
