"""collectx-perf's result check: exact references, planted errors counted, honest timing."""

import numpy as np
import pytest

from collectx.perf import buffers
from collectx.perf.collectives import BENCHES, input_values
from collectx.perf.sweep import run_sweep
from collectx.perf.threadcomm import run_threads

ALL = tuple(BENCHES)


def _spec(**kw):
    spec = {"collectives": ALL, "sizes": (1, 8, 1000), "dtype": "float32", "op": "sum",
            "root": 0, "iters": 1, "warmup": 0, "check": 1}
    spec.update(kw)
    return spec


def _cells(rows):
    return [(r["collective"], v, r[v]) for r in rows for v in ("oop", "ip") if r[v]]


@pytest.mark.parametrize("nranks", [1, 2, 3])
def test_every_collective_checks_clean_on_a_correct_communicator(nranks):
    results = run_threads(run_sweep, nranks, (_spec(root=nranks - 1),))
    rows = results[0]
    assert all(r == rows for r in results)  # every rank reports the same (gathered) rows
    assert {r["collective"] for r in rows} == set(ALL)
    assert all(cell["wrong"] == 0 for _, _, cell in _cells(rows))


@pytest.mark.parametrize("dtype,op", [("float16", "sum"), ("float64", "prod"), ("int8", "min"),
                                      ("uint8", "max"), ("int32", "avg"), ("float32", "avg"),
                                      ("float16", "prod"), ("int64", "sum")])
def test_reductions_are_exact_in_every_dtype(dtype, op):
    spec = _spec(collectives=("allreduce", "reduce_scatter", "reduce"), dtype=dtype, op=op)
    rows = run_threads(run_sweep, 3, (spec,))[0]
    assert all(cell["wrong"] == 0 for _, _, cell in _cells(rows))


@pytest.mark.parametrize("collective", ALL)
def test_a_planted_wrong_element_is_counted_once_per_rank(collective):
    def body(comm, spec):
        def corrupt(coll, variant, out):
            if variant == "oop" or BENCHES[coll].run_oop is None:
                out[0] = 99  # no collective here produces 99
        return run_sweep(comm, spec, corrupt=corrupt)
    rows = run_threads(body, 2, (_spec(collectives=(collective,), sizes=(64,), root=1),))[0]
    first = rows[0]["oop"] or rows[0]["ip"]
    checked_ranks = 1 if collective == "reduce" else 2  # reduce's output exists on the root only
    assert first["wrong"] == checked_ranks


def test_wrong_elements_in_place_are_counted_too():
    def body(comm, spec):
        def corrupt(coll, variant, out):
            if variant == "ip" and comm.rank == 1:
                out[:3] = -5
        return run_sweep(comm, spec, corrupt=corrupt)
    rows = run_threads(body, 2, (_spec(collectives=("allreduce",), sizes=(64,)),))[0]
    assert rows[0]["oop"]["wrong"] == 0 and rows[0]["ip"]["wrong"] == 3


def test_check_off_reports_no_count():
    rows = run_threads(run_sweep, 2, (_spec(collectives=("allreduce",), check=0),))[0]
    assert all(cell["wrong"] is None for _, _, cell in _cells(rows))


def test_the_row_time_is_the_slowest_ranks_mean():
    import time

    class SlowRank1:
        def __init__(self, comm):
            self._comm = comm

        def __getattr__(self, name):
            return getattr(self._comm, name)

        def allreduce(self, x, out=None, op="sum", async_op=False):
            if self._comm.rank == 1 and x.shape[0] == 16:  # only the timed 64 B call
                time.sleep(0.02)
            return self._comm.allreduce(x, out=out, op=op)

    spec = _spec(collectives=("allreduce",), sizes=(64,), iters=2, check=0)
    rows = run_threads(lambda comm, s: run_sweep(SlowRank1(comm), s), 2, (spec,))
    assert rows[0][0]["oop"]["time_us"] >= 20000 and rows[0] == rows[1]


def test_busbw_uses_nccl_tests_factors():
    rows = run_threads(run_sweep, 4, (_spec(collectives=("allreduce", "allgather", "broadcast"),
                                             sizes=(4096,), check=0),))[0]
    factor = {r["collective"]: (r["ip"]["busbw"] / r["ip"]["algbw"]) for r in rows}
    assert factor == pytest.approx({"allreduce": 1.5, "allgather": 0.75, "broadcast": 1.0})


def test_layout_counts_follow_nccl_tests():
    assert BENCHES["allreduce"].layout(1024, 4, 3).count == 256
    lay = BENCHES["reduce_scatter"].layout(1000, 4, 3)  # 250 elements -> 83 per rank
    assert (lay.in_elems, lay.out_elems, lay.nbytes) == (249, 83, 996)
    assert BENCHES["allgather"].layout(1, 4, 3).in_elems == 1  # never an empty row


def test_inputs_are_small_exact_integers_that_differ_between_ranks():
    a, b = input_values("allgather", "sum", 0, 100), input_values("allgather", "sum", 1, 100)
    assert np.all(a != b) and a.max() <= 61
    prod = np.prod([input_values("allreduce", "prod", r, 64) for r in range(16)], axis=0)
    assert prod.max() <= 16  # exact even in bfloat16


def test_wrong_count_tolerates_rounding_only_for_avg():
    ref = np.array([1 / 3, 2.0])
    got = buffers.read(np.array(ref, dtype=np.float16))
    assert buffers.wrong_count(got, ref, "float16", "avg") == 0
    assert buffers.wrong_count(got, ref, "float16", "sum") == 1


def test_tiled_inputs_equal_the_pattern_at_any_offset():
    whole = input_values("alltoall", "sum", 2, 1000)
    assert np.array_equal(input_values("alltoall", "sum", 2, 100, start=437), whole[437:537])
    i = np.arange(1000)
    assert np.array_equal(input_values("allreduce", "sum", 3, 1000), (i * 3 + 15) % 7 + 1)


def test_buffers_fall_back_to_ordinary_memory_when_the_window_is_full():
    from collectx.errors import ArgumentError

    class FullWindow:
        def empty(self, shape, dtype):
            raise ArgumentError("empty(): 64 bytes do not fit in the window heap")

    buf = buffers.alloc(FullWindow(), 16, "float32")
    assert isinstance(buf, np.ndarray) and buf.shape == (16,) and buf.dtype == np.float32
