"""CPU kernels of libcollectx against numpy: every dtype x op x k, odd sizes, in place.

References: integers wrap like numpy; float32/float64 follow the documented left-to-right order
exactly; float16/bfloat16 must equal the float32 left-to-right chain rounded once (RNE), which
is within one rounding of the float32 reference by construction.
"""

import functools
import zlib

import numpy as np
import pytest

from collectx import _native as nat
from collectx.errors import ArgumentError

INTS = ("int8", "uint8", "int32", "int64")
FLOATS = ("float16", "bfloat16", "float32", "float64")
OPS = ("sum", "prod", "min", "max", "avg")
NP_OPS = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum,
          "avg": np.add}
# (k, n) pairs: every k of the one-pass fused kernels (2..8) and the multi-pass ones (9, 16) x
# sizes {0, 1, 7, 4096+3}; k = 8 and 16 over several 8 KiB blocks of every dtype; 1 MiB + 1
# elements for k <= 3.
CASES = ([(k, n) for k in (2, 3, 4, 5, 6, 7, 8, 9, 16) for n in (0, 1, 7, 4099)]
         + [(8, 20011), (16, 20011), (2, (1 << 20) + 1), (3, (1 << 20) + 1)])


# ---- bfloat16 helpers (numpy has no bfloat16: uint16 arrays hold the bits) ---------------------
def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even float32 -> bfloat16 bits; NaN stays NaN."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    return np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), rounded)


def random_inputs(dtype: str, k: int, n: int, op: str, rng) -> list:
    """k arrays with values that exercise the op without making every result inf or zero."""
    if dtype in INTS:
        info = np.iinfo(dtype)
        return [rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
                for _ in range(k)]
    scale = 1.5 if op == "prod" else 50.0
    values = [(rng.standard_normal(n) * scale).astype(np.float32) for _ in range(k)]
    if dtype == "bfloat16":
        return [f32_to_bf16(v) for v in values]
    return [v.astype(dtype) for v in values]


def reference(dtype: str, srcs: list, op: str) -> np.ndarray:
    """The documented result: a left-to-right chain (float32 for the 16-bit floats)."""
    k = len(srcs)
    if dtype in ("float16", "bfloat16"):
        wide = [bf16_to_f32(s) if dtype == "bfloat16" else s.astype(np.float32) for s in srcs]
        acc = functools.reduce(NP_OPS[op], wide)
        if op == "avg":  # the 16-bit sum is rounded once, then scaled in float32, rounded again
            acc = _round16(dtype, acc)
            acc = (bf16_to_f32(acc) if dtype == "bfloat16" else acc.astype(np.float32))
            acc = acc * np.float32(1.0 / k)
        return _round16(dtype, acc)
    with np.errstate(over="ignore", invalid="ignore"):
        acc = functools.reduce(NP_OPS[op], srcs)
    if op == "avg" and dtype in INTS:
        wide = acc.astype(np.int64)
        return (np.sign(wide) * (np.abs(wide) // k)).astype(dtype)
    if op == "avg":
        return acc * acc.dtype.type(1.0 / k)
    return acc


def _round16(dtype, x):
    return f32_to_bf16(x) if dtype == "bfloat16" else x.astype(np.float16)


def run_reduce(dtype: str, dst, srcs, op: str):
    override = "bfloat16" if dtype == "bfloat16" else None
    with np.errstate(over="ignore"):
        return nat.reduce(dst, srcs, op=op, dtype=override)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", INTS + FLOATS)
def test_reduce_matches_numpy(dtype, op):
    rng = np.random.default_rng(zlib.crc32(f"{dtype}/{op}".encode()))
    for k, n in CASES:
        srcs = random_inputs(dtype, k, n, op, rng)
        expected = reference(dtype, srcs, op)
        out = run_reduce(dtype, np.empty_like(srcs[0]), srcs, op)
        np.testing.assert_array_equal(out, expected, err_msg=f"k={k} n={n} out of place")
        run_reduce(dtype, srcs[0], srcs, op)  # dst is srcs[0]: accumulate in place
        np.testing.assert_array_equal(srcs[0], expected, err_msg=f"k={k} n={n} in place")


@pytest.mark.parametrize("dtype", ("float32", "float64"))
@pytest.mark.parametrize("op", ("sum", "prod"))
@pytest.mark.parametrize("k", (2, 3, 8))
def test_reductions_past_the_caches_equal_the_numpy_chain(dtype, op, k):
    # Over 24 MiB of traffic a float sum/prod streams its output (non-temporal stores from
    # vectors); a dst off the 32-byte grid exercises the scalar head and tail around them.
    n = (24 << 20) // (np.dtype(dtype).itemsize * (k + 1)) + 1237
    rng = np.random.default_rng(k)
    srcs = [rng.standard_normal(n).astype(dtype) for _ in range(k)]
    expected = functools.reduce(NP_OPS[op], srcs)
    for shift in (0, 1):
        out = np.zeros(n + shift, dtype)[shift:]
        nat.reduce(out, srcs, op=op)
        np.testing.assert_array_equal(out, expected, err_msg=f"dst shifted by {shift}")


@pytest.mark.parametrize("dtype", INTS + FLOATS)
def test_k1_copies(dtype):
    src = random_inputs(dtype, 1, 1001, "sum", np.random.default_rng(1))[0]
    dst = np.zeros_like(src)
    run_reduce(dtype, dst, [src], "sum")
    np.testing.assert_array_equal(dst, src)


def test_float_sum_order_is_left_to_right():
    # 1e8 + 1 - 1e8 in float32: left to right gives 0 (1 is absorbed), other orders give 1.
    a, b, c = (np.full(9, v, np.float32) for v in (1e8, 1.0, -1e8))
    np.testing.assert_array_equal(nat.reduce(np.empty(9, np.float32), [a, b, c]), 0.0)
    np.testing.assert_array_equal(nat.reduce(np.empty(9, np.float32), [a, c, b]), 1.0)


def test_integer_sum_wraps_like_numpy():
    a = np.array([127, -128, 100], np.int8)
    b = np.array([1, -1, 100], np.int8)
    np.testing.assert_array_equal(nat.reduce(np.empty(3, np.int8), [a, b]), [-128, 127, -56])


def test_min_max_propagate_nan_like_numpy():
    a = np.array([np.nan, 1.0, 2.0, np.nan], np.float32)
    b = np.array([1.0, np.nan, 3.0, np.nan], np.float32)
    for op, fn in (("min", np.minimum), ("max", np.maximum)):
        np.testing.assert_array_equal(nat.reduce(np.empty(4, np.float32), [a, b], op), fn(a, b))


# ---- conversions: exhaustive over every 16-bit pattern ------------------------------------------
def test_half_round_trip_is_exact_for_every_value():
    every = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    out = nat.reduce(np.empty_like(every), [every, every], op="max")  # half -> float -> half
    np.testing.assert_array_equal(out, every)


def test_bfloat16_round_trip_is_exact_for_every_value():
    every = np.arange(1 << 16, dtype=np.uint16)
    out = nat.reduce(np.empty_like(every), [every, every], op="min", dtype="bfloat16")
    nan = np.isnan(bf16_to_f32(every))
    np.testing.assert_array_equal(out[~nan], every[~nan])
    assert np.isnan(bf16_to_f32(out[nan])).all()


@pytest.mark.parametrize("op", ("sum", "prod"))
def test_half_rounding_covers_subnormals_and_overflow(op):
    # Random bit patterns: subnormals, ties, overflow to inf, inf and NaN inputs all occur.
    rng = np.random.default_rng(7)
    a = rng.integers(0, 1 << 16, 300_000, dtype=np.uint16).view(np.float16)
    b = rng.integers(0, 1 << 16, 300_000, dtype=np.uint16).view(np.float16)
    with np.errstate(over="ignore", invalid="ignore"):
        expected = NP_OPS[op](a.astype(np.float32), b.astype(np.float32)).astype(np.float16)
    np.testing.assert_array_equal(nat.reduce(np.empty_like(a), [a, b], op=op), expected)


# ---- scale ----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ("float16", "float32", "float64"))
def test_scale_floats(dtype):
    x = (np.random.default_rng(3).standard_normal(1003) * 10).astype(dtype)
    expected = (x.astype(np.float32) * np.float32(0.3)).astype(dtype) if dtype == "float16" \
        else x * x.dtype.type(0.3)
    np.testing.assert_array_equal(nat.scale(x.copy(), 0.3), expected)


def test_scale_bfloat16():
    x = f32_to_bf16(np.linspace(-5, 5, 77, dtype=np.float32))
    expected = f32_to_bf16(bf16_to_f32(x) * np.float32(0.25))
    np.testing.assert_array_equal(nat.scale(x.copy(), 0.25, dtype="bfloat16"), expected)


@pytest.mark.parametrize("dtype", INTS)
def test_scale_integers_truncate_toward_zero(dtype):
    info = np.iinfo(dtype)
    x = np.random.default_rng(4).integers(info.min, info.max, 999, dtype=dtype)
    wide = x.astype(np.int64)
    expected = (np.sign(wide) * (np.abs(wide) // 3)).astype(dtype)
    np.testing.assert_array_equal(nat.scale(x.copy(), 1 / 3), expected)


def test_scale_integers_refuse_non_reciprocal_factor():
    x = np.arange(5, dtype=np.int32)
    with pytest.raises(ArgumentError, match="whole number"):
        nat.scale(x, 0.4)
    np.testing.assert_array_equal(x, np.arange(5))


# ---- copy -----------------------------------------------------------------------------------
def test_copy_and_self_copy():
    src = np.arange(4099, dtype=np.float64)
    np.testing.assert_array_equal(nat.copy(np.empty_like(src), src), src)
    np.testing.assert_array_equal(nat.copy(src, src), np.arange(4099))
