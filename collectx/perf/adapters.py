"""Open MPI (mpi4py) and torch.distributed (gloo, NCCL) behind collectx's method names.

The sweep calls ``comm.allreduce(x, out=y, op="sum")`` and friends; these adapters map each call
onto the peer library's closest primitive so the peers run the identical sweep. Where a library
lacks an exact counterpart the adapter says how it is emulated:

* MPI has no ``avg`` reduction: it is a ``sum`` followed by a division on the result holders.
* torch.distributed collectives are in place only: an out-of-place allreduce/reduce is a copy into
  the output followed by the in-place call (what a torch user writes).
"""

from __future__ import annotations

import warnings

import numpy as np

from ..errors import DTypeError


class MpiComm:
    """collectx-style calls over an mpi4py communicator (numpy buffers)."""

    inplace = frozenset({"allreduce", "allgather", "broadcast", "reduce"})
    empty_kind = "host"      # what empty() hands out (collectx.perf.buffers.alloc_where)
    UNSUPPORTED_DTYPES = ("float16", "bfloat16")  # Open MPI has no half-precision reductions

    def __init__(self, mpi_comm=None):
        from mpi4py import MPI
        self._mpi = MPI
        self._comm = mpi_comm if mpi_comm is not None else MPI.COMM_WORLD
        self.rank, self.size = self._comm.Get_rank(), self._comm.Get_size()

    def _op(self, op: str):
        mpi = self._mpi
        return {"sum": mpi.SUM, "avg": mpi.SUM, "prod": mpi.PROD, "min": mpi.MIN,
                "max": mpi.MAX}[op]

    def _finish(self, buf, op: str):
        if op == "avg":  # MPI has no average: divide the sum where the result lives
            if np.issubdtype(buf.dtype, np.integer):
                np.floor_divide(buf, self.size, out=buf)
            else:
                buf /= self.size
        return buf

    def empty(self, shape, dtype):
        if dtype in self.UNSUPPORTED_DTYPES:
            raise DTypeError(f"dtype {dtype}: Open MPI has no reduction for it; use float32")
        return np.empty(shape, dtype=dtype)

    def barrier(self):
        self._comm.Barrier()

    def allreduce(self, x, out=None, op="sum"):
        if out is None:
            self._comm.Allreduce(self._mpi.IN_PLACE, x, op=self._op(op))
            return self._finish(x, op)
        self._comm.Allreduce(x, out, op=self._op(op))
        return self._finish(out, op)

    def allgather(self, x, out):
        send = self._mpi.IN_PLACE if np.shares_memory(x, out) else x
        self._comm.Allgather(send, out)
        return out

    def reduce_scatter(self, x, out, op="sum"):
        self._comm.Reduce_scatter_block(x, out, op=self._op(op))
        return self._finish(out, op)

    def broadcast(self, x, root=0):
        self._comm.Bcast(x, root=root)
        return x

    def reduce(self, x, root=0, out=None, op="sum"):
        is_root = self.rank == root
        if out is None:
            send = self._mpi.IN_PLACE if is_root else x
            self._comm.Reduce(send, x if is_root else None, op=self._op(op), root=root)
            out = x
        else:
            self._comm.Reduce(x, out if is_root else None, op=self._op(op), root=root)
        return self._finish(out, op) if is_root else out

    def alltoall(self, x, out):
        self._comm.Alltoall(x, out)
        return out

    def send(self, x, dst):
        self._comm.Send(x, dest=dst)

    def recv(self, x, src):
        self._comm.Recv(x, source=src)
        return x

    def close(self):
        pass


class TorchComm:
    """collectx-style calls over an initialised torch.distributed group (torch tensors)."""

    inplace = frozenset({"allreduce", "broadcast", "reduce"})

    def __init__(self, device: str = "cpu"):
        import torch
        import torch.distributed as dist
        self._torch, self._dist, self.device = torch, dist, device
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self.empty_kind = "host" if device == "cpu" else "device"
        ops = dist.ReduceOp
        self._ops = {"sum": ops.SUM, "prod": ops.PRODUCT, "min": ops.MIN, "max": ops.MAX,
                     "avg": ops.AVG}

    def empty(self, shape, dtype):
        return self._torch.empty(shape, dtype=getattr(self._torch, dtype), device=self.device)

    def synchronize(self):
        if self.device != "cpu":
            self._torch.cuda.synchronize()

    def barrier(self):
        self._dist.barrier()

    def allreduce(self, x, out=None, op="sum"):
        if out is not None:
            out.copy_(x)
            x = out
        self._dist.all_reduce(x, op=self._ops[op])
        return x

    def allgather(self, x, out):
        with warnings.catch_warnings():  # the *_tensor names are deprecated aliases in torch 2.9+
            warnings.simplefilter("ignore", FutureWarning)
            self._dist.all_gather_into_tensor(out, x)
        return out

    def reduce_scatter(self, x, out, op="sum"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            self._dist.reduce_scatter_tensor(out, x, op=self._ops[op])
        return out

    def broadcast(self, x, root=0):
        self._dist.broadcast(x, src=root)
        return x

    def reduce(self, x, root=0, out=None, op="sum"):
        if out is not None:
            out.copy_(x)
            x = out
        self._dist.reduce(x, dst=root, op=self._ops[op])
        return x

    def alltoall(self, x, out):
        self._dist.all_to_all_single(out, x)
        return out

    def send(self, x, dst):
        self._dist.send(x, dst=dst)

    def recv(self, x, src):
        self._dist.recv(x, src=src)
        return x

    def close(self):
        self._dist.destroy_process_group()
