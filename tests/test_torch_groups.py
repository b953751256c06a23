"""Several collectx groups at once: overlapping subgroups, and collectx next to gloo."""

from __future__ import annotations

import _needs as needs

torch = needs.module("torch")
import torch.distributed as dist  # noqa: E402

from collectx.integrations.torch_testing import run_ranks  # noqa: E402


def _overlapping_subgroups(rank, world):
    # Every rank must call new_group for every group, members or not (torch's rule); only the
    # members build a communicator, so the ranks see different numbers of groups.
    first = dist.new_group([0, 1], backend="collectx")
    second = dist.new_group([1, 2], backend="collectx")
    results = {}
    for name, group, members in (("first", first, (0, 1)), ("second", second, (1, 2))):
        if rank in members:
            x = torch.tensor([float(rank + 1)])
            dist.all_reduce(x, group=group)
            results[name] = x.item()
    everyone = torch.tensor([float(rank + 1)])
    dist.all_reduce(everyone)
    results["world"] = everyone.item()
    return results


def test_overlapping_subgroups():
    results = run_ranks(_overlapping_subgroups, 3, timeout_s=120)
    assert results[0] == {"first": 3.0, "world": 6.0}
    assert results[1] == {"first": 3.0, "second": 5.0, "world": 6.0}
    assert results[2] == {"second": 5.0, "world": 6.0}


def _symmetric_exchange(rank, world, numel):
    peer = 1 - rank
    mine, theirs = torch.full((numel,), float(rank + 1)), torch.empty(numel)
    ops = [dist.P2POp(dist.isend, mine, peer), dist.P2POp(dist.irecv, theirs, peer)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return theirs[0].item(), theirs[-1].item()


def test_batch_isend_irecv_both_ways_does_not_deadlock():
    numel = 1 << 20          # 4 MiB each way: more than any in-flight buffer between the pair
    results = run_ranks(_symmetric_exchange, 2, numel, timeout_s=120)
    assert results == [(2.0, 2.0), (1.0, 1.0)]


def _rebuilt_over_one_store(rank, world, port):
    # A store that outlives the groups, as torchrun's agent store does: the group torch builds
    # again gets the same key prefix in it, where the last group's keys still are.
    import datetime
    import time
    dist.destroy_process_group()
    store = dist.TCPStore("127.0.0.1", port, world, is_master=rank == 0,
                          timeout=datetime.timedelta(seconds=60))
    sums, received = [], None
    for generation in range(3):
        dist.init_process_group("collectx", store=store, rank=rank, world_size=world)
        x = torch.full((1000,), float(rank + 1 + generation))
        dist.all_reduce(x)
        sub = dist.new_group([0, 1], backend="collectx")
        y = torch.ones(10)
        dist.all_reduce(y, group=sub)
        sums.append((x[0].item(), y[0].item()))
        if rank == 0 and generation < 2:     # generation 0's message is never received
            time.sleep(generation)           # a recv that took the old message has by now
            dist.send(torch.full((4,), 10.0 + generation), 1)
        if rank == 1 and generation == 1:
            got = torch.empty(4)
            dist.recv(got, 0)
            received = got[0].item()
        dist.barrier()
        dist.destroy_process_group()
    return sums, received


def test_a_process_group_built_again_over_the_same_store():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = run_ranks(_rebuilt_over_one_store, 2, port, timeout_s=120)
    sums = [(3.0, 2.0), (5.0, 2.0), (7.0, 2.0)]
    assert results == [(sums, None), (sums, 11.0)]   # not the message left over from before
