"""The collective methods of the collectx ProcessGroup, one torch entry point each.

Every method validates its arguments on the caller's thread (so argument errors raise at the call,
not at ``wait()``), then hands a closure that drives the Communicator to the group's runner.
Method names and argument orders are exactly those the C++ ``ProcessGroup`` trampoline and
``torch.distributed.distributed_c10d`` use; both spellings are defined where torch renamed one
(``_allgather_base``/``all_gather_single``, ``_reduce_scatter_base``/``reduce_scatter_single``,
``alltoall_base``/``all_to_all_single``).
"""

from __future__ import annotations

from functools import partial

import numpy as np
import torch

from ..errors import ArgumentError
from .torch_ops import (Flat, concat, copy, device_type, empty, host, premultiply, reduce_op,
                        same_dtype, scatter_back, split_rows)


class Collectives:
    """Mixin: needs ``_comm(device)``, ``_p2p(device)``, ``_submit(run, outputs, opts)``,
    ``group_rank`` and ``group_size``."""

    # -- allreduce -----------------------------------------------------------------------------
    def allreduce(self, tensors, opts):
        op, factor = reduce_op(opts.reduceOp)
        if len(tensors) == 1 and factor is None:
            view = host(tensors[0])
            if type(view) is np.ndarray:    # the common call (DDP buckets): nothing to stage
                return self._submit(partial(self._comm("cpu").allreduce, view, None, op),
                                    tensors, opts)
        comm = self._comm(device_type(tensors))

        def run():
            for tensor in tensors:
                flat = Flat(tensor)
                premultiply(flat.data, factor)
                comm.allreduce(flat.buffer, op=op)
                flat.commit()
        return self._submit(run, tensors, opts)

    def allreduce_coalesced(self, tensors, opts):
        comm = self._comm(device_type(tensors))
        op, factor = reduce_op(opts.reduceOp)
        same_dtype(tensors, "allreduce_coalesced")

        def run():
            # One collective for the whole bucket: small tensors would each pay the latency.
            buffer = concat(tensors)
            premultiply(buffer, factor)
            comm.allreduce(host(buffer), op=op)
            scatter_back(buffer, tensors)
        return self._submit(run, tensors, opts)

    # -- allgather -----------------------------------------------------------------------------
    def allgather(self, output_tensors, input_tensors, opts):
        comm = self._comm(device_type(input_tensors))
        for outputs, tensor in zip(output_tensors, input_tensors):
            self._check_count(outputs, "allgather outputs")
            same_dtype([tensor, *outputs], "allgather")
            self._check_own(outputs, tensor, "allgather outputs")

        def run():
            for outputs, tensor in zip(output_tensors, input_tensors):
                _allgather_list(comm, outputs, tensor)
        return self._submit(run, [t for outs in output_tensors for t in outs], opts)

    def _allgather_base(self, output, input, opts):
        comm = self._comm(device_type([output, input]))
        same_dtype([output, input], "all_gather_into_tensor")
        self._check_multiple(output, input, "all_gather_into_tensor output")

        def run():
            out = Flat(output, read=False)
            comm.allgather(Flat(input).buffer, out=out.buffer)
            out.commit()
        return self._submit(run, [output], opts)

    all_gather_single = _allgather_base

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts):
        works = [self._allgather_base(o, i, opts) for o, i in zip(outputs, inputs)]
        return works[-1] if works else self.barrier(opts)

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    # -- reduce-scatter ------------------------------------------------------------------------
    def reduce_scatter(self, output_tensors, input_tensors, opts):
        comm = self._comm(device_type(output_tensors))
        op, factor = reduce_op(opts.reduceOp)
        for output, inputs in zip(output_tensors, input_tensors):
            self._check_count(inputs, "reduce_scatter inputs")
            same_dtype([output, *inputs], "reduce_scatter")
            self._check_own(inputs, output, "reduce_scatter inputs")

        def run():
            for output, inputs in zip(output_tensors, input_tensors):
                _reduce_scatter_list(comm, output, inputs, op, factor)
        return self._submit(run, output_tensors, opts)

    def _reduce_scatter_base(self, output, input, opts):
        comm = self._comm(device_type([output, input]))
        op, factor = reduce_op(opts.reduceOp)
        same_dtype([output, input], "reduce_scatter_tensor")
        self._check_multiple(input, output, "reduce_scatter_tensor input")

        def run():
            source = Flat(input).data
            if factor is not None:
                source = concat([source])   # a copy: the caller's input must stay untouched
                premultiply(source, factor)
            out = Flat(output, read=False)
            comm.reduce_scatter(host(source), out=out.buffer, op=op)
            out.commit()
        return self._submit(run, [output], opts)

    reduce_scatter_single = _reduce_scatter_base

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts):
        works = [self._reduce_scatter_base(o, i, opts) for o, i in zip(outputs, inputs)]
        return works[-1] if works else self.barrier(opts)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    # -- rooted collectives --------------------------------------------------------------------
    def broadcast(self, tensors, opts):
        comm = self._comm(device_type(tensors))
        root = opts.rootRank

        def run():
            for tensor in tensors:
                flat = Flat(tensor)
                comm.broadcast(flat.buffer, root=root)
                flat.commit()
        return self._submit(run, tensors, opts)

    def reduce(self, tensors, opts):
        comm = self._comm(device_type(tensors))
        op, factor = reduce_op(opts.reduceOp)
        root = opts.rootRank

        def run():
            for tensor in tensors:
                flat = Flat(tensor)
                premultiply(flat.data, factor)
                comm.reduce(flat.buffer, root=root, op=op)
                flat.commit()
        return self._submit(run, tensors, opts)

    def gather(self, output_tensors, input_tensors, opts):
        comm = self._comm(device_type(input_tensors))
        root = opts.rootRank
        is_root = self.group_rank == root

        def run():
            # Gather = allgather with only the root keeping the result: no p2p ordering hazards.
            for i, tensor in enumerate(input_tensors):
                outputs = output_tensors[i] if is_root else [
                    torch.empty_like(tensor) for _ in range(self.group_size)]
                _allgather_list(comm, outputs, tensor)
        outs = [t for outs in output_tensors for t in outs] if is_root else []
        return self._submit(run, outs, opts)

    def scatter(self, output_tensors, input_tensors, opts):
        comm = self._comm(device_type(output_tensors))
        root = opts.rootRank
        is_root = self.group_rank == root

        def run():
            for i, output in enumerate(output_tensors):
                n = output.numel()
                size = n * self.group_size
                buffer = concat(input_tensors[i]) if is_root else empty(size, output)
                comm.broadcast(host(buffer), root=root)
                offset = self.group_rank * n
                copy(output, buffer[offset:offset + n])
        return self._submit(run, output_tensors, opts)

    # -- all-to-all ----------------------------------------------------------------------------
    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts):
        comm = self._comm(device_type([output, input]))
        same_dtype([output, input], "all_to_all_single")
        even = not output_split_sizes and not input_split_sizes
        outs = split_rows(output, output_split_sizes, self.group_size)
        ins = split_rows(input, input_split_sizes, self.group_size)

        def run():
            if even:
                out = Flat(output, read=False)
                comm.alltoall(Flat(input).buffer, out=out.buffer)
                out.commit()
            else:
                _alltoall_list(comm, outs, ins)
        return self._submit(run, [output], opts)

    all_to_all_single = alltoall_base

    def alltoall(self, output_tensors, input_tensors, opts):
        comm = self._comm(device_type([*output_tensors, *input_tensors]))
        self._check_count(output_tensors, "alltoall outputs")
        self._check_count(input_tensors, "alltoall inputs")
        same_dtype([*output_tensors, *input_tensors], "alltoall")
        return self._submit(lambda: _alltoall_list(comm, output_tensors, input_tensors),
                            output_tensors, opts)

    # -- point to point and barrier ------------------------------------------------------------
    def send(self, tensors, dstRank, tag):  # noqa: N803 -- torch's names
        p2p = self._p2p(device_type(tensors))

        def run():
            for tensor in tensors:
                p2p.send(Flat(tensor).data, dstRank)
        return self._submit(run, tensors, None)

    def recv(self, tensors, srcRank, tag):  # noqa: N803
        p2p = self._p2p(device_type(tensors))

        def run():
            for tensor in tensors:
                flat = Flat(tensor, read=False)
                p2p.recv(flat.data, srcRank)
                flat.commit()
        return self._submit(run, tensors, None)

    def recv_anysource(self, tensors, tag):
        raise ArgumentError("recv from any source is not supported by the collectx backend; "
                            "expected an explicit src rank. Pass src= to torch.distributed.recv")

    def barrier(self, opts=None):
        comm = self._comm("cpu")
        return self._submit(comm.barrier, [], opts)

    # -- argument checks -----------------------------------------------------------------------
    def _check_count(self, tensors, what):
        if len(tensors) != self.group_size:
            raise ArgumentError(f"{what}: got {len(tensors)} tensors; expected one per rank "
                                f"({self.group_size})")

    def _check_own(self, parts, mine, what):
        # ranks' parts may differ in size (gloo pads them too), but this rank's is its tensor
        own = parts[self.group_rank]
        if own.numel() != mine.numel():
            raise ArgumentError(f"{what}[{self.group_rank}] (this rank's) has {own.numel()} "
                                f"elements; expected {mine.numel()}, as many as its tensor")

    def _check_multiple(self, big, small, what):
        if big.numel() != small.numel() * self.group_size:
            raise ArgumentError(f"{what} has {big.numel()} elements; expected group size "
                                f"{self.group_size} x {small.numel()}")


def _allgather_list(comm, outputs, tensor):
    """Allgather ``tensor`` into per-rank ``outputs``, padding when ranks' sizes differ."""
    width = max(t.numel() for t in outputs)
    source = Flat(tensor).data
    if source.numel() != width:
        source = concat([source], pad_to=width)
    gathered = empty(width * len(outputs), tensor)
    comm.allgather(host(source), out=host(gathered))
    scatter_back(gathered, outputs, stride=width)


def _reduce_scatter_list(comm, output, inputs, op, factor):
    """Reduce-scatter per-rank ``inputs`` into ``output``, padding uneven parts with zeros."""
    width = max(t.numel() for t in inputs)
    buffer = concat(inputs, pad_to=width)
    premultiply(buffer, factor)
    result = empty(width, output)
    comm.reduce_scatter(host(buffer), out=host(result), op=op)
    copy(output, result[:output.numel()])


def _alltoall_list(comm, outputs, inputs):
    """All-to-all of per-peer parts of any sizes: pad every part to the largest, exchange, trim.

    The width must agree on all ranks, so it is the group-wide maximum, found with a one-element
    MAX allreduce (a part's size is known only to its sender and receiver).
    """
    local = max([t.numel() for t in (*outputs, *inputs)] + [0])
    width_t = torch.tensor([local], dtype=torch.int64, device=outputs[0].device)
    comm.allreduce(host(width_t), op="max")
    width = int(width_t.item())
    if width == 0:
        return
    buffer = concat(inputs, pad_to=width)
    received = empty(width * len(outputs), buffer)
    comm.alltoall(host(buffer), out=host(received))
    scatter_back(received, outputs, stride=width)
