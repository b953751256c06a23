"""Rank functions for the runtime tests (module level so launch() can pickle them)."""

from __future__ import annotations

import numpy as np

import collectx

REDUCE = {"sum": np.add.reduce, "prod": np.multiply.reduce, "min": np.minimum.reduce,
          "max": np.maximum.reduce}


def rank_input(seed: int, rank: int, n: int, dtype: str) -> np.ndarray:
    """Deterministic per-rank data every rank can recompute for the reference."""
    rng = np.random.default_rng([seed, rank])
    if dtype.startswith("float"):
        return rng.integers(-4, 5, n).astype(dtype)   # small ints: exact sums and products
    return rng.integers(-3, 4 if dtype != "uint8" else 3, n).astype(dtype)


def reference(coll: str, op: str, inputs: list[np.ndarray], rank: int, root: int):
    size = len(inputs)
    stack = np.stack(inputs)
    red = None
    if coll in ("allreduce", "reduce_scatter", "reduce"):
        base = "sum" if op == "avg" else op
        red = REDUCE[base](stack, axis=0).astype(stack.dtype)
        if op == "avg":
            # floats are multiplied by 1/size (like the kernels); integers truncate (NCCL)
            red = (red * stack.dtype.type(1.0 / size)).astype(stack.dtype) \
                if stack.dtype.kind == "f" else np.trunc(red / size).astype(stack.dtype)
    if coll == "allreduce":
        return red
    if coll == "reduce":
        return red if rank == root else inputs[rank]
    if coll == "reduce_scatter":
        n = len(red) // size
        return red[rank * n:(rank + 1) * n]
    if coll == "allgather":
        return np.concatenate(inputs)
    if coll == "broadcast":
        return inputs[root]
    if coll == "alltoall":
        n = len(inputs[0]) // size
        return np.concatenate([inputs[j][rank * n:(rank + 1) * n] for j in range(size)])
    raise ValueError(coll)


def call(comm, coll: str, x: np.ndarray, op: str, root: int):
    if coll == "allreduce":
        return comm.allreduce(x, op=op)
    if coll == "reduce_scatter":
        return comm.reduce_scatter(x, op=op)
    if coll == "allgather":
        return comm.allgather(x)
    if coll == "broadcast":
        return comm.broadcast(x, root=root)
    if coll == "reduce":
        return comm.reduce(x, root=root, op=op)
    if coll == "alltoall":
        return comm.alltoall(x)
    raise ValueError(coll)


def run_cases(cases: list[tuple]) -> list[str]:
    """Run (coll, dtype, op, n, root, seed) cases; return a description of each failure."""
    comm = collectx.init()
    bad = []
    for coll, dtype, op, n, root, seed in cases:
        if coll in ("reduce_scatter", "alltoall"):
            n = n * comm.size
        inputs = [rank_input(seed, r, n, dtype) for r in range(comm.size)]
        x = inputs[comm.rank].copy()
        got = call(comm, coll, x, op, root)
        want = reference(coll, op, inputs, comm.rank, root)
        if got is not None and not np.array_equal(np.asarray(got), want):
            bad.append(f"rank {comm.rank}: {coll} {dtype} {op} n={n} root={root}: "
                       f"got {np.asarray(got)[:6]} want {want[:6]}")
    comm.close()
    return bad


def async_and_torch(n: int) -> list[str]:
    """Async work, torch tensors (bf16 included), out= buffers and the plan cache."""
    import torch
    comm = collectx.init()
    bad = []
    r, s = comm.rank, comm.size
    works = [comm.allreduce(np.full(n, float(r + i), np.float32), async_op=True)
             for i in range(4)]
    for i, w in enumerate(works):
        want = sum(range(s)) + s * i
        if not np.all(w.result() == want):
            bad.append(f"async {i}: {w.result()[:3]} != {want}")
    t = torch.full((n,), float(r + 1), dtype=torch.bfloat16)
    comm.allreduce(t)
    if not bool((t == float(s * (s + 1) // 2)).all()):
        bad.append(f"bf16 allreduce: {t[:3]}")
    t32 = torch.arange(n, dtype=torch.float32) + r
    g = comm.allgather(t32)
    if not isinstance(g, torch.Tensor) or g.shape != (n * s,):
        bad.append(f"torch allgather returned {type(g)} {getattr(g, 'shape', None)}")
    out = np.empty(n, np.float32)
    comm.allreduce(np.ones(n, np.float32), out=out, op="avg")
    if not np.allclose(out, 1.0):
        bad.append(f"avg into out: {out[:3]}")
    comm.barrier()
    comm.close()
    return bad


def ring_sendrecv(n: int) -> list[str]:
    """Each rank sends to the next and receives from the previous, even ranks first."""
    comm = collectx.init(timeout=60)
    r, s = comm.rank, comm.size
    bad = []
    for k in range(3):   # repeated exchanges reuse the slot halves and counters
        x = np.arange(n, dtype=np.float64) * (r + 1) + k
        y = np.empty(n, np.float64)
        if r % 2 == 0:
            comm.send(x, (r + 1) % s)
            comm.recv(y, (r - 1) % s)
        else:
            comm.recv(y, (r - 1) % s)
            comm.send(x, (r + 1) % s)
        want = np.arange(n, dtype=np.float64) * ((r - 1) % s + 1) + k
        if not np.array_equal(y, want):
            bad.append(f"rank {r} round {k}: got {y[:4]} want {want[:4]}")
    comm.close()
    return bad


def zero_copy(n: int, iters: int) -> list[str]:
    """Collectives on arrays from comm.empty(), reused call after call."""
    comm = collectx.init(timeout=60)
    r, s = comm.rank, comm.size
    bad = []
    x = comm.empty(n, np.float32)
    g = comm.empty(n * s, np.float32)
    for k in range(iters):
        x[:] = np.arange(n, dtype=np.float32) + r + k
        comm.allgather(x, out=g)                   # input and output both in the window
        want = np.concatenate([np.arange(n, dtype=np.float32) + q + k for q in range(s)])
        if not np.array_equal(g, want):
            bad.append(f"allgather iter {k}: {g[:4]} vs {want[:4]}")
        comm.allreduce(x)                          # in place on a window array
        want = s * np.arange(n, dtype=np.float32) + sum(range(s)) + s * k
        if not np.array_equal(x, want):
            bad.append(f"allreduce iter {k}: {x[:4]} vs {want[:4]}")
        y = np.empty(n, np.float32)
        comm.allreduce(x, out=y, op="max")         # window input, private output
        if not np.array_equal(y, want):
            bad.append(f"allreduce max iter {k}")
    for slot in ("_fast_allgather", "_fast", "_fast_allreduce"):   # repeats: compiled calls
        calls = getattr(getattr(comm, slot), "calls", None)        # (None: not built)
        if iters > 1 and calls == 0:
            bad.append(f"{slot}: no call went through the compiled fast call")
    w = comm.empty(n, np.float32)                  # input and output both in the window
    for k in range(iters):
        x[:] = np.arange(n, dtype=np.float32) + r + k
        comm.allreduce(x, out=w, op="min")
        if not np.array_equal(w, np.arange(n, dtype=np.float32) + k):
            bad.append(f"allreduce min into a window output, iter {k}")
        per = n // s
        want_rs = g[r * per:(r + 1) * per] * s     # every rank reduces the same gathered g
        comm.reduce_scatter(g[:per * s], out=w[:per])
        if not np.array_equal(w[:per], want_rs):
            bad.append(f"reduce_scatter window to window iter {k}: {w[:4]} vs {want_rs[:4]}")
    del x, g, w
    comm.close()
    return bad


def aliasing(n: int) -> list[str]:
    """Inputs and outputs that are disjoint, the same memory through another view, or overlap
    the NCCL in-place way (allgather input = own block of the output, reduce_scatter output =
    own block of the input); several tiles each, so chunks used in place and staged chunks mix."""
    comm = collectx.init(timeout=60)
    r, s = comm.rank, comm.size
    bad = []
    inputs = [rank_input(5, q, n * s, "float32") for q in range(s)]
    total = np.add.reduce(np.stack(inputs), axis=0)
    for op in ("sum", "avg"):
        want = total if op == "sum" else total * np.float32(1.0 / s)
        x, out = inputs[r].copy(), np.full(n * s, -7, np.float32)
        comm.allreduce(x, out=out, op=op)                      # disjoint
        if not np.array_equal(out, want) or not np.array_equal(x, inputs[r]):
            bad.append(f"allreduce {op} into a disjoint out: {out[:4]} vs {want[:4]}")
        x = inputs[r].copy()
        comm.allreduce(x, out=x.reshape(s, n), op=op)          # same memory, another view
        if not np.array_equal(x, want):
            bad.append(f"allreduce {op} into another view of x: {x[:4]} vs {want[:4]}")
    g = np.zeros(n * s, np.float32)
    g[r * n:(r + 1) * n] = inputs[r][:n]
    comm.allgather(g[r * n:(r + 1) * n], out=g)                # input inside the output
    want = np.concatenate([inputs[q][:n] for q in range(s)])
    if not np.array_equal(g, want):
        bad.append(f"allgather with the input inside the output: {g[:4]} vs {want[:4]}")
    x = inputs[r].copy()
    comm.reduce_scatter(x, out=x[r * n:(r + 1) * n])          # output inside the input
    if not np.array_equal(x[r * n:(r + 1) * n], total[r * n:(r + 1) * n]):
        bad.append(f"reduce_scatter with the output inside the input: {x[r * n:r * n + 4]}")
    comm.close()
    return bad


def cross_process_reads(n: int) -> dict:
    """Large calls (peers read user buffers across processes where the probe allowed it) with
    each rank choosing its own buffer layout: rank 0 in place, rank 1 into a disjoint output,
    rank 2 into an output overlapping its input at an offset (which must stage instead); then
    allgather and reduce_scatter in place, NCCL style, and the other collectives. Returns the
    failures, whether the window reads across processes, and which buffers this rank
    published for peers to read in the last allreduce, allgather and reduce_scatter."""
    comm = collectx.init(timeout=60)
    r, s = comm.rank, comm.size
    bad = []
    inputs = [rank_input(11, q, n, "float32") for q in range(s)]
    total = np.add.reduce(np.stack(inputs), axis=0)
    published = {}
    for op in ("sum", "avg", "max"):
        want = REDUCE["max"](np.stack(inputs), axis=0) if op == "max" else \
            total if op == "sum" else total * np.float32(1.0 / s)
        if r == 0:
            x = out = inputs[r].copy()
            comm.allreduce(x, op=op)
        elif r == 1:
            x, out = inputs[r].copy(), np.full(n, -7, np.float32)
            comm.allreduce(x, out=out, op=op)
        else:
            buf = np.zeros(n + 1000, np.float32)
            buf[1000:] = inputs[r]
            x, out = buf[1000:], buf[:n]
            comm.allreduce(x, out=out, op=op)
        if not np.array_equal(out, want):
            bad.append(f"rank {r}: allreduce {op}: {out[:4]} vs {want[:4]}")
        if r == 1 and not np.array_equal(x, inputs[r]):
            bad.append(f"rank {r}: allreduce {op} changed its input")
        published["allreduce"] = _published(comm)
    m = n // s * s
    b = m // s                 # NCCL style in place: the input is block r of the output
    g = np.zeros(m, np.float32)
    g[r * b:(r + 1) * b] = inputs[r][:b]
    comm.allgather(g[r * b:(r + 1) * b], out=g)
    if not np.array_equal(g, np.concatenate([i[:b] for i in inputs])):
        bad.append(f"rank {r}: allgather in place: {g[:4]}")
    published["allgather"] = _published(comm)
    x = inputs[r][:m].copy()   # and the output is block r of the input
    comm.reduce_scatter(x, out=x[r * b:(r + 1) * b])
    if not np.array_equal(x[r * b:(r + 1) * b], total[r * b:(r + 1) * b]):
        bad.append(f"rank {r}: reduce_scatter in place: {x[r * b:r * b + 4]}")
    published["reduce_scatter"] = _published(comm)
    for coll in ("allgather", "reduce_scatter", "broadcast", "reduce", "alltoall"):
        x = inputs[r][:m].copy()
        got = call(comm, coll, x, "sum", s - 1)
        want = reference(coll, "sum", [i[:m] for i in inputs], r, s - 1)
        if got is not None and not np.array_equal(np.asarray(got), want):
            bad.append(f"rank {r}: {coll}: {np.asarray(got)[:4]} vs {want[:4]}")
    cma = comm._window.cma
    comm.close()
    return {"bad": bad, "cma": cma, "published": published}


def copies_read_across(sizes: list[int]) -> dict:
    """Each collective at each element count (per rank's block), every rank's results checked.
    Returns whether the window reads across processes and, per case, (coll, n, failure or None,
    whether this rank published its input / output)."""
    comm = collectx.init(timeout=60)
    r, s = comm.rank, comm.size
    rows = []
    for n in sizes:
        inputs = [rank_input(5, q, n * s, "float32") for q in range(s)]
        for coll in ("allgather", "broadcast", "alltoall", "allreduce", "reduce_scatter"):
            x = inputs[r][:n] if coll in ("allgather", "broadcast") else inputs[r]
            x = x.copy()
            got = call(comm, coll, x, "sum", s - 1)
            want = reference(coll, "sum", [i[:len(x)] for i in inputs], r, s - 1)
            bad = None if np.array_equal(np.asarray(got), want) else f"{np.asarray(got)[:4]}"
            rows.append((coll, n, bad, _published(comm)))
    cma = comm._window.cma
    comm.close()
    return {"cma": cma, "rows": rows}


def _published(comm) -> list[bool]:
    """Whether this rank's last call let peers read its input / output across processes."""
    from collectx.runtime.window import DESC_WORDS, W_DESC
    slot = W_DESC + DESC_WORDS * ((comm._engine._seq - 1) & 1)
    return [int(v) != 0 for v in comm._window.ctl[comm.rank][slot + 8:slot + 10]]


LAYOUT_CASES = [("allreduce", "sum"), ("allreduce", "avg"), ("allreduce", "max"),
                ("reduce_scatter", "sum"), ("reduce_scatter", "avg"), ("allgather", None),
                ("broadcast", None), ("reduce", "sum"), ("reduce", "avg")]


def every_layout(algo: str, sizes: list[int]) -> list[str]:
    """Each collective the schedule family ``algo`` (forced through COLLECTX_ALGO by the caller)
    serves, at each element count per rank's block, out of place and in place (NCCL's layouts
    for allgather and reduce_scatter): the failures, compared with numpy."""
    from collectx.planner.registry import supports
    comm = collectx.init(timeout=60)
    r, s = comm.rank, comm.size
    root = s - 1
    bad = []
    for n in sizes:
        for coll, op in LAYOUT_CASES:
            if not supports(algo, coll):
                continue
            for in_place in (False, True):
                m = n * s if coll == "reduce_scatter" else n
                inputs = [rank_input(n + len(coll), q, m, "float32") for q in range(s)]
                want = reference(coll, op or "sum", inputs, r, root)
                x = inputs[r].copy()
                if coll == "allreduce":
                    got = comm.allreduce(x, op=op) if in_place else \
                        comm.allreduce(x, out=np.empty_like(x), op=op)
                elif coll == "reduce_scatter":
                    out = x[r * n:(r + 1) * n] if in_place else np.empty(n, np.float32)
                    got = comm.reduce_scatter(x, out=out, op=op).copy()
                elif coll == "allgather":
                    buf = np.zeros(n * s, np.float32)
                    buf[r * n:(r + 1) * n] = x
                    got = comm.allgather(buf[r * n:(r + 1) * n] if in_place else x, out=buf)
                elif coll == "broadcast":
                    got = comm.broadcast(x, root)
                else:
                    got = comm.reduce(x, root, op=op) if in_place else \
                        comm.reduce(x, root, out=np.empty_like(x), op=op)
                    got = x if got is None else got
                if not np.allclose(np.asarray(got), want, rtol=1e-6, atol=1e-6):
                    bad.append(f"rank {r}: {coll} {op} n={n} in_place={in_place}: "
                               f"{np.asarray(got)[:4]} vs {want[:4]}")
    comm.close()
    return bad
