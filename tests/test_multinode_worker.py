"""Rank program for the multi-host tests (run under mpirun, or spawned with torch gloo).

Not a test module by itself (no test functions); tests/test_multinode.py starts it as
``python tests/test_multinode_worker.py MODE``:

* ``check``: every collective, odd sizes, several dtypes and ops, against numpy;
* ``kill``: rank 1 dies in the middle of a run of allreduces; the others must raise a collectx
  error (printed as ``SURVIVOR <rank> <ExceptionClass>``) instead of hanging;
* ``bulk``: ``check`` (quick) then three 4 MiB allreduces, for the veth test.

Engine: MPI under mpirun; with ``CX_TEST_ENGINE=torch`` a gloo process group from
``MASTER_ADDR``/``MASTER_PORT``/``RANK``/``WORLD_SIZE`` (``CX_TEST_IFNAME`` binds gloo to one
interface, for the network-namespace test).
"""

from __future__ import annotations

import os
import sys

import numpy as np


def make_comm():
    from collectx.runtime.multinode import MPIEngine, TorchEngine, init
    if os.environ.get("CX_TEST_ENGINE") == "torch":
        import datetime

        import torch.distributed as dist
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
        return init(TorchEngine(), timeout=30)
    import collectx
    comm = collectx.init(timeout=30)      # COLLECTX_HOSTS under mpirun: the hierarchical one
    assert type(comm).__name__ == "HierarchicalCommunicator", type(comm)
    assert isinstance(comm.engine, MPIEngine)
    return comm


def data(rank: int, n: int, dtype, salt: int = 0) -> np.ndarray:
    rng = np.random.default_rng(1000 * rank + salt)
    if np.dtype(dtype).kind == "f":
        return rng.integers(-8, 8, n).astype(dtype)    # integers: sums exact in any order
    return rng.integers(0, 5, n).astype(dtype)


def expect(fn, size, n, dtype, salt):
    return fn(np.stack([data(r, n, dtype, salt) for r in range(size)]))


def check(comm) -> None:
    size, rank = comm.size, comm.rank
    ops = {"sum": lambda a: a.sum(0), "max": lambda a: a.max(0), "min": lambda a: a.min(0),
           "prod": lambda a: a.prod(0)}
    salt = 0
    quick = bool(os.environ.get("CX_TEST_QUICK"))
    dtypes = (np.float32, np.int64) if quick else (np.float32, np.float64, np.int32, np.int64,
                                                     np.float16)
    for dtype in dtypes:
        for n in ((0, 3, 1001) if quick else (0, 1, 3, 7, 1001)):
            for op, fn in ops.items():
                salt += 1
                if op == "prod" and np.dtype(dtype).kind == "f" and n > 7:
                    continue
                x = data(rank, n, dtype, salt)
                want = expect(fn, size, n, dtype, salt).astype(dtype)
                out = np.empty_like(x)
                comm.allreduce(x, out=out, op=op)
                np.testing.assert_array_equal(out, want, err_msg=f"allreduce {op} {dtype} {n}")
                comm.allreduce(x, op=op)                                  # in place
                np.testing.assert_array_equal(x, want, err_msg=f"in-place {op} {dtype} {n}")
            salt += 1
            big = data(rank, n * size, dtype, salt)
            full = expect(lambda a: a.sum(0), size, n * size, dtype, salt).astype(dtype)
            got = comm.reduce_scatter(big)
            np.testing.assert_array_equal(got, full[rank * n:(rank + 1) * n],
                                          err_msg=f"reduce_scatter {dtype} {n}")
            x = data(rank, n, dtype, salt)
            got = comm.allgather(x)
            want = np.concatenate([data(r, n, dtype, salt) for r in range(size)])
            np.testing.assert_array_equal(got, want, err_msg=f"allgather {dtype} {n}")
            for root in range(size):
                b = data(rank, n, dtype, salt + root)
                comm.broadcast(b, root=root)
                np.testing.assert_array_equal(b, data(root, n, dtype, salt + root),
                                              err_msg=f"broadcast root {root} {dtype} {n}")
            r = data(rank, n, dtype, salt)
            res = comm.reduce(r.copy(), root=size - 1)
            if rank == size - 1:
                np.testing.assert_array_equal(res, expect(lambda a: a.sum(0), size, n, dtype,
                                                          salt).astype(dtype))
            a2a = data(rank, n * size, dtype, salt)
            got = comm.alltoall(a2a)
            want = np.concatenate([data(r, n * size, dtype, salt)[rank * n:(rank + 1) * n]
                                   for r in range(size)])
            np.testing.assert_array_equal(got, want, err_msg=f"alltoall {dtype} {n}")
    avg = np.full(5, float(rank), np.float32)
    comm.allreduce(avg, op="avg")
    np.testing.assert_allclose(avg, np.full(5, (size - 1) / 2, np.float32))
    comm.barrier()
    report = (f"OK {rank} host {comm.layout.host} local {comm.layout.local_rank} "
              f"machine {comm.local._window.machine_ranks}")
    print(report, flush=True)
    if os.environ.get("CX_TEST_REPORT_DIR"):
        # mpirun may interleave or lose the tail of a rank's stdout at exit; a file cannot be.
        with open(os.path.join(os.environ["CX_TEST_REPORT_DIR"], f"rank{rank}"), "w") as f:
            f.write(report)


def bulk(comm) -> None:
    """Three allreduces of 4 MiB per rank (the veth test counts the bytes that cross)."""
    for k in range(3):
        x = np.full(1 << 20, float(comm.rank + k), np.float32)
        comm.allreduce(x)
        np.testing.assert_array_equal(x[:3], np.full(3, sum(range(comm.size)) + comm.size * k))
    print(f"OK bulk {comm.rank}", flush=True)


def kill(comm) -> None:
    import time
    from collectx.errors import CollectXError
    x = np.ones(1 << 16, np.float32)
    comm.allreduce(x)
    if comm.rank == 1:
        time.sleep(0.5)
        os._exit(9)          # a host's rank dies without a word
    try:
        for _ in range(200):
            comm.allreduce(x)
            time.sleep(0.01)
    except CollectXError as e:
        print(f"SURVIVOR {comm.rank} {type(e).__name__}: {str(e)[:120]}", flush=True)
        os._exit(0)
    print(f"NOERROR {comm.rank}", flush=True)
    os._exit(3)


def main(mode: str) -> None:
    comm = make_comm()
    if mode in ("check", "bulk"):
        check(comm)
    if mode == "bulk":
        bulk(comm)
    elif mode == "kill":
        kill(comm)
    comm.close()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "check")
