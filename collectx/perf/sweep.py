"""The per-rank sweep: time each collective at each size, then check it, nccl-tests style.

The same function runs on every rank of any communicator that has collectx's method names
(collectx's own, or the MPI / torch.distributed adapters in :mod:`collectx.perf.adapters`), so the
peers are measured by identical code. Per size and variant (out of place, in place):

1. warm up, barrier, then time ``iters`` back-to-back calls on the same buffers;
2. with checking on, fill the inputs with :func:`~collectx.perf.collectives.input_values`, run
   once more, and compare this rank's output with the float64 reference;
3. gather, with the communicator itself, the *slowest* rank's mean time (the row's time) and the
   wrong elements summed over ranks (so every rank knows whether the run failed).
"""

from __future__ import annotations

import sys
import time

import numpy as np
from typing import Callable

from ..errors import ArgumentError
from . import buffers
from .collectives import BENCHES, REDUCING, ROOTED, input_pattern, input_values
from ..schedule.metrics import bus_factor

# Fewer iterations for big messages keeps the default 8 B..64 MiB sweep within seconds while
# small sizes (microseconds each) still average over enough calls to be stable. Every size gets
# at least MIN_WARMUP untimed calls: a library may set up per size on its first calls (collectx
# plans each power-of-two size class and first touches its staging pages: 1-3 ms each for the
# first two calls on a 2-core VM, which one warm-up call left inside the timed loop).
_ITER_TABLE = ((64 << 10, 5, 20), (1 << 20, 5, 20), (16 << 20, 3, 10), (None, 2, 5))
MIN_WARMUP = 2
# Seconds of timed calls aimed for per size and variant when iterations are chosen
# automatically; on a loaded machine a call can take far longer than its size suggests, and this
# keeps the whole default sweep under a minute even then.
TIMED_BUDGET_S = 0.3

# Collectives whose in-place variant a communicator supports unless it says otherwise.
DEFAULT_INPLACE = frozenset({"allreduce", "allgather", "reduce_scatter", "broadcast", "reduce"})


def missing_methods(comm, collective: str) -> list[str]:
    """Methods ``collective`` needs that ``comm`` lacks (the sweep leaves it out then).

    >>> missing_methods(object(), "sendrecv")
    ['send', 'recv']
    """
    needs = ("send", "recv") if collective == "sendrecv" else (collective,)
    return [name for name in needs if not callable(getattr(comm, name, None))]


def iterations_for(nbytes: int, iters: int | None = None, warmup: int | None = None,
                   estimate_us: float | None = None):
    """(warm-up, timed) iteration counts for a size; explicit values win.

    ``estimate_us`` (the expected time of one call, from the previous size) caps the automatic
    count so the timed calls take about :data:`TIMED_BUDGET_S`.

    >>> iterations_for(8), iterations_for(64 << 20), iterations_for(64 << 20, iters=7)
    ((5, 20), (2, 5), (2, 7))
    >>> iterations_for(8, estimate_us=100_000.0)
    (2, 3)
    """
    w, n = next((w, n) for limit, w, n in _ITER_TABLE if limit is None or nbytes <= limit)
    if estimate_us:
        n = max(2, min(n, int(TIMED_BUDGET_S * 1e6 / estimate_us)))
        w = min(w, max(MIN_WARMUP, n // 4))  # warm-up shrinks with the timed count
    return (w if warmup is None else warmup), (n if iters is None else iters)


def run_sweep(comm, spec: dict, *, corrupt: Callable | None = None,
              progress: Callable | None = None, on_row: Callable | None = None) -> list[dict]:
    """Run the sweep described by ``spec`` (see :meth:`Options.spec`) on this rank.

    Parameters
    ----------
    comm : Communicator-like
        Has ``rank``, ``size``, ``barrier`` and the collective methods.
    spec : dict
        ``collectives, sizes, dtype, op, root, iters, warmup, check``.
    corrupt : callable, optional
        Test hook ``corrupt(collective, variant, output_buffer)`` called after the check run and
        before the comparison, to plant a wrong result.
    progress : callable, optional
        ``progress(done, total, label)``, called on rank 0 only.
    on_row : callable, optional
        ``on_row(row)``, called on rank 0 as each row completes (so a crash later in the sweep
        does not lose the rows measured before it).

    Returns
    -------
    list of dict
        One row per collective and size; identical on every rank.

    Raises
    ------
    ArgumentError
        When the root is not a rank of ``comm``.
    """
    if spec.get("root", 0) >= comm.size:
        raise ArgumentError(f"-r {spec['root']}: expected a root rank in [0, {comm.size})")
    jobs = [(c, s) for c in spec["collectives"] if not missing_methods(comm, c)
            for s in spec["sizes"]]
    rows, seen, last, pool = [], set(), {}, {}
    for done, (collective, size) in enumerate(jobs):
        if progress is not None and comm.rank == 0:
            progress(done, len(jobs), f"{collective} {size} B")
        if collective not in pool:  # one pair of buffers per collective, as nccl-tests does
            pool.clear()            # the previous pair goes back to the window heap first
            pool[collective] = _buffers(comm, spec, collective)
        row = _run_size(comm, spec, collective, size, corrupt, pool[collective],
                        _estimate(last.get(collective), size))
        last[collective] = row
        key = (collective, row["size"])
        if key not in seen:  # tiny sizes round up to one element per rank: keep one row each
            seen.add(key)
            rows.append(row)
            if on_row is not None and comm.rank == 0:
                on_row(row)
    if progress is not None and comm.rank == 0:
        progress(len(jobs), len(jobs), "done")
    return rows


def _estimate(previous: dict | None, size: int) -> float | None:
    """Expected microseconds per call at ``size``: the previous size's slowest time, scaled.

    Every rank computes the same value (row times are gathered), so all agree on the counts.
    """
    if previous is None:
        return None
    times = [previous[v]["time_us"] for v in ("oop", "ip") if previous.get(v)]
    return max(times) * max(1.0, size / max(previous["size"], 1)) if times else None


def buffer_elems(collective: str, sizes, itemsize: int, nranks: int) -> tuple[int, int]:
    """(input, output) elements of the buffers a sweep of ``collective`` over ``sizes`` runs on.

    >>> buffer_elems("allgather", [8, 1024], 4, 2)
    (128, 256)
    """
    bench = BENCHES[collective]
    lays = [bench.layout(size, itemsize, nranks) for size in sizes]
    return (max(lay.in_elems for lay in lays),
            max(max(lay.in_elems, lay.out_elems) for lay in lays))


def _buffers(comm, spec, collective) -> tuple:
    """Input and output buffers big enough for the sweep's largest size of ``collective``, and
    where they came from (:func:`~collectx.perf.buffers.alloc_where`; ``"host"`` unless both
    came from the same place).

    Every size runs on leading slices of these, so the timed calls reuse memory that is already
    mapped (no page faults) and the runtime sees the same buffers call after call.
    """
    n_in, n_out = buffer_elems(collective, spec["sizes"], buffers.itemsize(spec["dtype"]),
                               comm.size)
    device = spec.get("device", "cpu")
    x, x_at = buffers.alloc_where(comm, n_in, spec["dtype"], device)
    y, y_at = buffers.alloc_where(comm, n_out, spec["dtype"], device)
    return x, y, x_at if x_at == y_at else "host"


def _variants(comm, bench, x, y, y_oop, op, root) -> dict:
    """name -> (call, input view, output view) for the variants this communicator offers."""
    variants = {}
    if bench.run_oop is not None:
        variants["oop"] = (lambda: bench.run_oop(comm, x, y_oop, op, root), x, y_oop)
    if bench.run_ip is not None and bench.name in getattr(comm, "inplace", DEFAULT_INPLACE):
        x_view, out_view = bench.ip_views(y, comm.rank, comm.size)
        variants["ip"] = (lambda: bench.run_ip(comm, y, op, root), x_view, out_view)
    return variants


def _run_size(comm, spec, collective, size, corrupt, pool, estimate_us=None) -> dict:
    bench, dtype, op, root = BENCHES[collective], spec["dtype"], spec["op"], spec["root"]
    lay = bench.layout(size, buffers.itemsize(dtype), comm.size)
    warmup, iters = iterations_for(lay.nbytes, spec.get("iters"), spec.get("warmup"),
                                   estimate_us)
    x, y = pool[0][:lay.in_elems], pool[1][:max(lay.in_elems, lay.out_elems)]
    pattern = input_pattern(collective, op, comm.rank)
    buffers.fill_tiled(x, pattern)
    buffers.fill_tiled(y, pattern)
    variants = _variants(comm, bench, x, y, y[:lay.out_elems], op, root)
    row = {"collective": collective, "size": lay.nbytes, "count": lay.count, "type": dtype,
           "redop": op if collective in REDUCING else "none",
           "root": root if collective in ROOTED else -1, "nranks": comm.size,
           "warmup": warmup, "iters": iters, "buffers": pool[2], "oop": None, "ip": None}
    factor = bus_factor(collective, comm.size)
    for name, (run, x_view, out_view) in variants.items():
        mine = _time(comm, run, warmup, iters)
        wrong = None
        if spec.get("check", 1):
            wrong = _check(comm, spec, collective, name, run, x_view, out_view, corrupt)
        usec, wrong = _gather(comm, mine, wrong)
        algbw = lay.nbytes / usec / 1e3 if usec > 0 else 0.0
        row[name] = {"time_us": usec, "algbw": algbw, "busbw": algbw * factor, "wrong": wrong}
    return row


def _time(comm, run, warmup: int, iters: int) -> float:
    for _ in range(warmup):
        run()
    _sync(comm)
    comm.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        run()
    _sync(comm)
    return (time.perf_counter() - start) / iters * 1e6


def _sync(comm) -> None:
    """Wait for queued device work, so a timer never stops before a GPU collective finished."""
    sync = getattr(comm, "synchronize", None)
    if sync is not None:
        sync()
    elif "torch" in sys.modules and sys.modules["torch"].cuda.is_initialized():
        sys.modules["torch"].cuda.synchronize()


def _gather(comm, usec: float, wrong: int | None) -> tuple[float, int | None]:
    """(slowest rank's time, wrong elements summed over ranks), in one collective call.

    Each rank writes its time into its own slot and its wrong count into the last one; a sum
    then gives every rank all the times (take the max) and the total wrong count.
    """
    values = [0.0] * (comm.size + 1)
    values[comm.rank], values[-1] = usec, float(wrong or 0)
    buf = buffers.alloc(comm, comm.size + 1, "float64")
    buffers.write(buf, values)
    comm.allreduce(buf, op="sum")
    _sync(comm)
    got = buffers.read(buf)
    return float(got[:-1].max()), (None if wrong is None else int(got[-1]))


def _check(comm, spec, collective, variant, run, x_view, out_view, corrupt) -> int:
    op, root, bench = spec["op"], spec["root"], BENCHES[collective]
    n_in = int(x_view.shape[0])
    buffers.fill_garbage(out_view)
    buffers.fill_tiled(x_view, input_pattern(collective, op, comm.rank))
    run()
    _sync(comm)
    if corrupt is not None:
        corrupt(collective, variant, out_view)
    got = buffers.comparable(out_view)
    # Compare in the buffer's own dtype (exact results are exact there, and no float64 copy of
    # a 64 MiB buffer is needed); avg rounds, so it is compared in float64 with a tolerance.
    dtype = np.float64 if op == "avg" else got.dtype
    ref = bench.expected(lambda q, start, n: input_values(collective, op, q, n, start, dtype),
                         comm.rank, comm.size, op, root, n_in, dtype)
    if ref is None:
        return 0
    return buffers.wrong_count(got, ref, spec["dtype"], op)


def stderr_progress(done: int, total: int, label: str, width: int = 30) -> None:
    """Draw a one-line progress bar on stderr (cleared when ``done == total``)."""
    if done >= total:
        sys.stderr.write("\r" + " " * (width + 50) + "\r")
    else:
        filled = width * done // max(total, 1)
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {label:<30}")
    sys.stderr.flush()
