"""The per-rank sweep: time each collective at each size, then check it, nccl-tests style.

The same function runs on every rank of any communicator that has collectx's method names
(collectx's own, or the MPI / torch.distributed adapters in :mod:`collectx.perf.adapters`), so the
peers are measured by identical code. Per size and variant (out of place, in place):

1. warm up, barrier, then time ``iters`` back-to-back calls on the same buffers;
2. the row's time is the *slowest* rank's mean, gathered with the communicator itself (max);
3. with checking on, fill the inputs with :func:`~collectx.perf.collectives.input_values`, run
   once more, compare every rank's output with the float64 reference, and sum the wrong elements
   over ranks (so every rank knows whether the run failed).
"""

from __future__ import annotations

import sys
import time
from typing import Callable

from ..errors import ArgumentError
from . import buffers
from .collectives import BENCHES, REDUCING, ROOTED, input_values
from ..schedule.metrics import bus_factor

# Fewer iterations for big messages keeps the default 8 B..64 MiB sweep within seconds while
# small sizes (microseconds each) still average over enough calls to be stable.
_ITER_TABLE = ((64 << 10, 5, 20), (1 << 20, 3, 10), (16 << 20, 1, 5), (None, 1, 3))

# Collectives whose in-place variant a communicator supports unless it says otherwise.
DEFAULT_INPLACE = frozenset({"allreduce", "allgather", "reduce_scatter", "broadcast", "reduce"})


def iterations_for(nbytes: int, iters: int | None = None, warmup: int | None = None):
    """(warm-up, timed) iteration counts for a size; explicit values win.

    >>> iterations_for(8), iterations_for(64 << 20), iterations_for(64 << 20, iters=7)
    ((5, 20), (1, 3), (1, 7))
    """
    for limit, w, n in _ITER_TABLE:
        if limit is None or nbytes <= limit:
            return (w if warmup is None else warmup), (n if iters is None else iters)
    raise AssertionError("unreachable: the table ends with a catch-all")


def run_sweep(comm, spec: dict, *, corrupt: Callable | None = None,
              progress: Callable | None = None) -> list[dict]:
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
    jobs = [(c, s) for c in spec["collectives"] for s in spec["sizes"]]
    rows, seen = [], set()
    for done, (collective, size) in enumerate(jobs):
        if progress is not None and comm.rank == 0:
            progress(done, len(jobs), f"{collective} {size} B")
        row = _run_size(comm, spec, collective, size, corrupt)
        key = (collective, row["size"])
        if key not in seen:  # tiny sizes round up to one element per rank: keep one row each
            seen.add(key)
            rows.append(row)
    if progress is not None and comm.rank == 0:
        progress(len(jobs), len(jobs), "done")
    return rows


def _run_size(comm, spec, collective, size, corrupt) -> dict:
    bench, dtype, op, root = BENCHES[collective], spec["dtype"], spec["op"], spec["root"]
    lay = bench.layout(size, buffers.itemsize(dtype), comm.size)
    warmup, iters = iterations_for(lay.nbytes, spec.get("iters"), spec.get("warmup"))
    x = buffers.alloc(comm, lay.in_elems, dtype)
    y = buffers.alloc(comm, max(lay.in_elems, lay.out_elems), dtype)
    y_oop = y[:lay.out_elems]
    buffers.write(x, input_values(collective, op, comm.rank, lay.in_elems))
    buffers.write(y, input_values(collective, op, comm.rank, int(y.shape[0])))
    variants = {}
    if bench.run_oop is not None:
        run = lambda: bench.run_oop(comm, x, y_oop, op, root)  # noqa: E731
        variants["oop"] = (run, x, y_oop)
    if bench.run_ip is not None and collective in getattr(comm, "inplace", DEFAULT_INPLACE):
        run = lambda: bench.run_ip(comm, y, op, root)  # noqa: E731
        x_view, out_view = bench.ip_views(y, comm.rank, comm.size)
        variants["ip"] = (run, x_view, out_view)
    row = {"collective": collective, "size": lay.nbytes, "count": lay.count, "type": dtype,
           "redop": op if collective in REDUCING else "none",
           "root": root if collective in ROOTED else -1, "nranks": comm.size,
           "warmup": warmup, "iters": iters}
    factor = bus_factor(collective, comm.size)
    for name in ("oop", "ip"):
        if name not in variants:
            row[name] = None
            continue
        run, x_view, out_view = variants[name]
        usec = _slowest(comm, _time(comm, run, warmup, iters))
        wrong = None
        if spec.get("check", 1):
            wrong = _check(comm, spec, collective, name, run, x_view, out_view, corrupt)
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
    sync = getattr(comm, "synchronize", None)  # device communicators finish queued work here
    if sync is not None:
        sync()


def _slowest(comm, value: float) -> float:
    return _reduce_scalar(comm, value, "max")


def _reduce_scalar(comm, value: float, op: str) -> float:
    buf = buffers.alloc(comm, 1, "float64")
    buffers.write(buf, [value])
    comm.allreduce(buf, op=op)
    _sync(comm)
    return float(buffers.read(buf)[0])


def _check(comm, spec, collective, variant, run, x_view, out_view, corrupt) -> int:
    op, root, bench = spec["op"], spec["root"], BENCHES[collective]
    n_in = int(x_view.shape[0])
    buffers.fill_garbage(out_view)
    buffers.write(x_view, input_values(collective, op, comm.rank, n_in))
    run()
    _sync(comm)
    if corrupt is not None:
        corrupt(collective, variant, out_view)
    ref = bench.expected(lambda q: input_values(collective, op, q, n_in), comm.rank,
                         comm.size, op, root)
    mine = 0 if ref is None else buffers.wrong_count(buffers.read(out_view), ref,
                                                     spec["dtype"], op)
    return int(_reduce_scalar(comm, float(mine), "sum"))


def stderr_progress(done: int, total: int, label: str, width: int = 30) -> None:
    """Draw a one-line progress bar on stderr (cleared when ``done == total``)."""
    if done >= total:
        sys.stderr.write("\r" + " " * (width + 50) + "\r")
    else:
        filled = width * done // max(total, 1)
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {label:<30}")
    sys.stderr.flush()
