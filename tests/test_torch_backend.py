"""The collectx torch.distributed backend against gloo, op by op, in the same processes.

Each rank runs every case twice, on the default collectx group and on a gloo group made with
``new_group(backend="gloo")``, from the same deterministic inputs, and reports a mismatch per case.
One spawn per world size covers the whole matrix (spawning torch ranks costs seconds); the
per-case tests then only read the report.
"""

from __future__ import annotations

import pytest

import _needs as needs

torch = needs.module("torch")
import torch.distributed as dist  # noqa: E402

from collectx.integrations.torch_testing import run_ranks  # noqa: E402

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
          "int64": torch.int64}
SIZES = (1, 1027)     # one element; an odd size that no world size divides
REDUCE_OPS = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "PREMUL_SUM")


def _data(rank: int, numel: int, dtype, salt: int, small: bool = False):
    """Deterministic per-rank integers-as-dtype, exact under sums in every dtype tested."""
    gen = torch.Generator().manual_seed(1000 * salt + rank)
    low, high = (1, 3) if small else (-8, 9)
    return torch.randint(low, high, (numel,), generator=gen).to(dtype)


def _op(name):
    return dist._make_nccl_premul_sum(0.5) if name == "PREMUL_SUM" else getattr(dist.ReduceOp,
                                                                                 name)


def _gloo_op(name, tensor, gloo, world):
    """gloo lacks AVG and PREMUL_SUM: emulate both around a SUM."""
    if name == "PREMUL_SUM":
        tensor.mul_(0.5)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM if name in ("AVG", "PREMUL_SUM")
                    else getattr(dist.ReduceOp, name), group=gloo)
    if name == "AVG":
        tensor.div_(world)


# -- cases: each returns (collectx result, reference result) -------------------------------------
def case_all_reduce(rank, world, dtype, numel, gloo, op):
    x = _data(rank, numel, dtype, 1, small=op == "PRODUCT")
    ref = x.clone()
    dist.all_reduce(x, op=_op(op))
    _gloo_op(op, ref, gloo, world)
    return x, ref


def case_all_reduce_strided(rank, world, dtype, numel, gloo):
    base = _data(rank, 2 * numel, dtype, 2).view(numel, 2)
    x, ref = base[:, 0], base[:, 0].clone()     # a non-contiguous view, written back in place
    dist.all_reduce(x)
    dist.all_reduce(ref, group=gloo)
    return base[:, 0], ref


def case_all_reduce_coalesced(rank, world, dtype, numel, gloo):
    xs = [_data(rank, numel + i, dtype, 3 + i) for i in range(3)]
    refs = [x.clone() for x in xs]
    dist.all_reduce_coalesced(xs)
    for ref in refs:
        dist.all_reduce(ref, group=gloo)
    return torch.cat(xs), torch.cat(refs)


def case_all_gather(rank, world, dtype, numel, gloo):
    x = _data(rank, numel, dtype, 4)
    outs = [torch.empty_like(x) for _ in range(world)]
    refs = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(outs, x)
    dist.all_gather(refs, x, group=gloo)
    return torch.cat(outs), torch.cat(refs)


def case_all_gather_uneven(rank, world, dtype, numel, gloo):
    x = _data(rank, numel + rank, dtype, 5)
    outs = [torch.empty(numel + r, dtype=dtype) for r in range(world)]
    dist.all_gather(outs, x)
    expected = [_data(r, numel + r, dtype, 5) for r in range(world)]  # gloo needs equal sizes
    return torch.cat(outs), torch.cat(expected)


def case_all_gather_into_tensor(rank, world, dtype, numel, gloo, in_place=False):
    out, ref = (torch.zeros(world * numel, dtype=dtype) for _ in range(2))
    x = _data(rank, numel, dtype, 6)
    if in_place:            # the input is this rank's slot of the output, as FSDP does
        out[rank * numel:(rank + 1) * numel] = x
        x = out[rank * numel:(rank + 1) * numel]
    dist.all_gather_into_tensor(out, x)
    dist.all_gather_into_tensor(ref, x.clone(), group=gloo)
    return out, ref


def case_reduce_scatter(rank, world, dtype, numel, gloo):
    xs = [_data(rank, numel, dtype, 7 + r) for r in range(world)]
    out, ref = torch.empty(numel, dtype=dtype), torch.empty(numel, dtype=dtype)
    dist.reduce_scatter(out, xs)
    dist.reduce_scatter(ref, [x.clone() for x in xs], group=gloo)
    return out, ref


def case_reduce_scatter_tensor(rank, world, dtype, numel, gloo, op="SUM", in_place=False):
    x = _data(rank, world * numel, dtype, 8)
    ref_in = x.clone()
    out = x[rank * numel:(rank + 1) * numel] if in_place else torch.empty(numel, dtype=dtype)
    ref = torch.empty(numel, dtype=dtype)
    dist.reduce_scatter_tensor(out, x, op=_op(op))
    dist.reduce_scatter_tensor(ref, ref_in, op=getattr(dist.ReduceOp, op), group=gloo)
    return out.clone(), ref


def case_broadcast(rank, world, dtype, numel, gloo, root=0):
    x = _data(rank, numel, dtype, 9)
    ref = x.clone()
    dist.broadcast(x, src=root)
    dist.broadcast(ref, src=root, group=gloo)
    return x, ref


def case_reduce(rank, world, dtype, numel, gloo, op="SUM"):
    root = world - 1
    x = _data(rank, numel, dtype, 10)
    ref = x.clone()
    dist.reduce(x, dst=root, op=_op(op))
    dist.reduce(ref, dst=root, op=getattr(dist.ReduceOp, op), group=gloo)
    return (x, ref) if rank == root else (ref, ref)    # only the root's result is defined


def case_all_to_all_single(rank, world, dtype, numel, gloo, uneven=False):
    splits = [1 + (rank + r) % 3 for r in range(world)] if uneven else None
    recv = [1 + (r + rank) % 3 for r in range(world)] if uneven else None
    rows_in = sum(splits) if uneven else world * numel
    rows_out = sum(recv) if uneven else world * numel
    x = _data(rank, rows_in * 2, dtype, 11).view(rows_in, 2)
    out, ref = torch.empty(rows_out, 2, dtype=dtype), torch.empty(rows_out, 2, dtype=dtype)
    dist.all_to_all_single(out, x, recv, splits)
    dist.all_to_all_single(ref, x, recv, splits, group=gloo)
    return out, ref


def case_all_to_all(rank, world, dtype, numel, gloo):
    xs = [_data(rank, numel + r, dtype, 12 + r) for r in range(world)]
    outs = [torch.empty(numel + rank, dtype=dtype) for _ in range(world)]
    dist.all_to_all(outs, xs)
    expected = [_data(r, numel + rank, dtype, 12 + rank) for r in range(world)]
    return torch.cat(outs), torch.cat(expected)


def case_gather_scatter(rank, world, dtype, numel, gloo):
    root = world - 1
    x = _data(rank, numel, dtype, 13)
    gathered = [torch.empty_like(x) for _ in range(world)] if rank == root else None
    dist.gather(x, gathered, dst=root)
    back = torch.empty_like(x)
    dist.scatter(back, gathered, src=root)     # scatter what was gathered: each gets its own x
    ref = [torch.empty_like(x) for _ in range(world)] if rank == root else None
    dist.gather(x, ref, dst=root, group=gloo)
    got = torch.cat(gathered) if rank == root else x
    return torch.cat([got, back]), torch.cat([torch.cat(ref) if rank == root else x, x])


def case_send_recv(rank, world, dtype, numel, gloo):
    x = _data(rank, numel, dtype, 14)
    got = torch.empty_like(x)
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    if rank == 0:       # a chain around the ring, so blocking sends cannot deadlock
        dist.send(x, nxt)
        dist.recv(got, prv)
    else:
        dist.recv(got, prv)
        dist.send(x, nxt)
    return got, _data(prv, numel, dtype, 14)


def case_barrier(rank, world, dtype, numel, gloo):
    dist.barrier()
    return torch.ones(1), torch.ones(1)


def case_large(rank, world, dtype, numel, gloo, case=None):
    """``case`` on 64 Ki more elements: staging copies of more than torch's parallel grain."""
    return case(rank, world, dtype, numel + (1 << 16), gloo)


def _cases():
    """Case id -> (function, keyword arguments), built the same in the parent and the ranks."""
    table = {f"all_reduce-{op}": (case_all_reduce, {"op": op}) for op in REDUCE_OPS}
    table.update({
        "all_reduce-strided": (case_all_reduce_strided, {}),
        "all_reduce_coalesced": (case_all_reduce_coalesced, {}),
        "all_gather": (case_all_gather, {}),
        "all_gather-uneven": (case_all_gather_uneven, {}),
        "all_gather_into_tensor": (case_all_gather_into_tensor, {}),
        "all_gather_into_tensor-inplace": (case_all_gather_into_tensor, {"in_place": True}),
        "reduce_scatter": (case_reduce_scatter, {}),
        "reduce_scatter_tensor": (case_reduce_scatter_tensor, {}),
        "reduce_scatter_tensor-MAX": (case_reduce_scatter_tensor, {"op": "MAX"}),
        "reduce_scatter_tensor-inplace": (case_reduce_scatter_tensor, {"in_place": True}),
        "broadcast-root0": (case_broadcast, {}),
        "broadcast-rootlast": (case_broadcast, {"root": -1}),
        "reduce-SUM": (case_reduce, {}),
        "reduce-MIN": (case_reduce, {"op": "MIN"}),
        "all_to_all_single": (case_all_to_all_single, {}),
        "all_to_all_single-uneven": (case_all_to_all_single, {"uneven": True}),
        "all_to_all-uneven": (case_all_to_all, {}),
        "gather_scatter": (case_gather_scatter, {}),
        "send_recv": (case_send_recv, {}),
        "barrier": (case_barrier, {}),
    })
    table.update({f"{name}-large": (case_large, {"case": fn}) for name, fn in (
        ("all_reduce_coalesced", case_all_reduce_coalesced),
        ("all_gather-uneven", case_all_gather_uneven), ("reduce_scatter", case_reduce_scatter),
        ("all_to_all-uneven", case_all_to_all), ("gather_scatter", case_gather_scatter))})
    return table


def _skip_reason(name: str, dtype) -> str | None:
    if dtype == torch.int64 and name in ("all_reduce-AVG", "all_reduce-PREMUL_SUM"):
        return "AVG and PREMUL_SUM are defined for floating dtypes"
    return None


def _compare(got, want, dtype) -> str | None:
    tol = {"rtol": 1e-2, "atol": 1e-2} if dtype == torch.bfloat16 else {}
    try:
        torch.testing.assert_close(got, want, **tol) if tol else torch.testing.assert_close(
            got, want, rtol=1e-6, atol=1e-6)
    except AssertionError as err:
        return str(err)[:400]
    return None


def _run_matrix(rank, world):
    gloo = dist.new_group(backend="gloo")
    report = {}
    for name, (fn, kwargs) in _cases().items():
        kwargs = {k: (world - 1 if k == "root" and v == -1 else v) for k, v in kwargs.items()}
        for dname, dtype in DTYPES.items():
            for numel in SIZES:
                key = (name, dname, numel)
                if _skip_reason(name, dtype):
                    continue
                try:
                    got, want = fn(rank, world, dtype, numel, gloo, **kwargs)
                    report[key] = _compare(got, want, dtype)
                except Exception as err:  # noqa: BLE001 -- reported per case
                    report[key] = f"{type(err).__name__}: {err}"
                    dist.barrier(group=gloo)   # keep ranks in step after a one-sided failure
    return report


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"{n}ranks")
def matrix_report(request):
    return run_ranks(_run_matrix, request.param, timeout_s=240)


@pytest.mark.parametrize("name", list(_cases()))
def test_matches_gloo(matrix_report, name):
    failures = [f"rank {rank} {dname} n={numel}: {error}"
                for rank, report in enumerate(matrix_report)
                for (case, dname, numel), error in sorted(report.items())
                if case == name and error is not None]
    ran = sum(1 for report in matrix_report for key in report if key[0] == name)
    assert ran > 0
    assert not failures, "\n".join(failures)
