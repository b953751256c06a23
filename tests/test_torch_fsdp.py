"""Callers that reach the group from C++ by name: functional collectives and FSDP2 (fully_shard)."""

from __future__ import annotations

import pytest

import _needs as needs

torch = needs.module("torch")
import torch.distributed as dist  # noqa: E402

from collectx.integrations.torch_testing import run_ranks  # noqa: E402


def _functional(rank, world):
    import torch.distributed._functional_collectives as fc
    group = dist.group.WORLD
    x = torch.full((4,), float(rank + 1))
    return {
        "name": group.group_name,
        "all_reduce": fc.all_reduce(x, "sum", group).tolist(),
        "all_gather": fc.all_gather_tensor(x, 0, group).tolist(),
        "reduce_scatter": fc.reduce_scatter_tensor(torch.arange(4.0), "sum", 0, group).tolist(),
    }


def _fsdp2_params(group, steps: int = 3):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    mesh = DeviceMesh.from_group(group, "cpu")
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(8, 16, generator=gen)).square().mean().backward()
        optimizer.step()
    return [p.full_tensor().detach().clone() for p in model.parameters()]


def _fsdp2(rank, world):
    ours = _fsdp2_params(dist.group.WORLD)
    theirs = _fsdp2_params(dist.new_group(backend="gloo"))
    return [(a - b).abs().max().item() / max(b.abs().max().item(), 1e-12)
            for a, b in zip(ours, theirs)]


def _both(rank, world):
    return {"functional": _functional(rank, world), "fsdp2": _fsdp2(rank, world)}


@pytest.fixture(scope="module")
def results():
    return run_ranks(_both, 2, timeout_s=240)     # one spawn for both tests: ranks start slowly


def test_functional_collectives_find_the_group_by_name(results):
    for rank, result in enumerate(r["functional"] for r in results):
        assert result["name"]
        assert result["all_reduce"] == [3.0] * 4
        assert result["all_gather"] == [1.0] * 4 + [2.0] * 4
        assert result["reduce_scatter"] == ([0.0, 2.0] if rank == 0 else [4.0, 6.0])


def test_fsdp2_trains_like_gloo(results):
    for relative_diffs in (r["fsdp2"] for r in results):
        assert relative_diffs and max(relative_diffs) < 1e-6, relative_diffs
