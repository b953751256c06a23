"""Command-line options of ``collectx-perf``: nccl-tests' flags, parsed into one frozen object.

One deliberate deviation from nccl-tests: ``-n`` is the number of *ranks* (collectx-perf starts its
own ranks, and ``collectx-perf -n 3`` reads like ``mpirun -n 3``); nccl-tests' ``-n`` (iterations)
is ``-I/--iters`` here.

>>> parse_size("64M"), parse_size("1K"), parse_size("8")
(67108864, 1024, 8)
>>> opts = parse_args(["-b", "1K", "-e", "4K", "-f", "2", "-d", "half"])
>>> opts.sizes, opts.dtype
((1024, 2048, 4096), 'float16')
"""

from __future__ import annotations

import argparse
import dataclasses
import re

from ..errors import ArgumentError
from ..topology.model import parse_gpu_list

COLLECTIVES = ("allreduce", "allgather", "reduce_scatter", "broadcast", "reduce", "alltoall",
               "sendrecv")
OPS = ("sum", "prod", "min", "max", "avg")
PEERS = ("mpi", "gloo", "nccl")

# nccl-tests' datatype names (-d) and the usual numpy/torch spellings, to one canonical name.
DTYPE_ALIASES = {
    "float": "float32", "float32": "float32", "f32": "float32", "fp32": "float32",
    "double": "float64", "float64": "float64", "f64": "float64", "fp64": "float64",
    "half": "float16", "float16": "float16", "f16": "float16", "fp16": "float16",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "int8": "int8", "char": "int8", "uint8": "uint8",
    "int32": "int32", "int": "int32", "uint32": "uint32",
    "int64": "int64", "uint64": "uint64",
}
DTYPES = tuple(sorted(set(DTYPE_ALIASES.values())))

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_SUFFIX = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


@dataclasses.dataclass(frozen=True, slots=True)
class Options:
    """Everything one sweep needs; built by :func:`parse_args`."""

    collectives: tuple[str, ...] = ("allreduce",)
    sizes: tuple[int, ...] = ()
    dtype: str = "float32"
    op: str = "sum"
    root: int = 0
    nprocs: int = 2
    iters: int | None = None       # None: chosen per size (see collectx.perf.sweep.iterations_for)
    warmup: int | None = None
    check: int = 1
    algo: str | None = None
    device: str = "cpu"
    compare: tuple[str, ...] = ()
    simulate: str | None = None
    gpus: tuple[int, ...] | None = None
    json: str | None = None
    csv: str | None = None
    plot: str | None = None
    html: str | None = None
    progress: bool = True
    bind: str = "core"
    repeat: int = 1

    def spec(self) -> dict:
        """The JSON-able subset a rank process needs to run the sweep."""
        return {k: getattr(self, k) for k in ("collectives", "sizes", "dtype", "op", "root",
                                              "iters", "warmup", "check", "algo", "progress",
                                              "device", "bind")}


def parse_size(text: str) -> int:
    """Bytes from nccl-tests' size syntax: a number with an optional K, M, G or T (powers of 2)."""
    match = _SIZE.match(str(text))
    if not match:
        raise ArgumentError(f"size {text!r}: expected a byte count such as 8, 1K, 64M or 1G")
    value = float(match.group(1)) * _SUFFIX[match.group(2).lower()]
    return int(value)


def size_sweep(min_bytes: int, max_bytes: int, factor: float = 2.0, step: int = 0) -> tuple:
    """Sizes from ``min_bytes`` to ``max_bytes``, times ``factor`` each step (or + ``step``)."""
    if min_bytes < 0 or max_bytes < min_bytes:
        raise ArgumentError(f"-b {min_bytes} -e {max_bytes}: expected 0 <= min <= max bytes")
    if step <= 0 and factor <= 1:
        raise ArgumentError(f"-f {factor}: expected a step factor > 1 (or a fixed step -i)")
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size)
        nxt = size + step if step > 0 else int(size * factor)
        size = nxt if nxt > size else size + 1  # -b 0 with -f 2 still advances
    return tuple(sizes)


def dtype_name(text: str) -> str:
    """Canonical dtype name for an nccl-tests or numpy spelling (``float`` -> ``float32``)."""
    name = DTYPE_ALIASES.get(text.strip().lower())
    if name is None:
        raise ArgumentError(f"-d {text!r}: expected one of {', '.join(sorted(DTYPE_ALIASES))}")
    return name


def _csv_list(text: str, allowed: tuple[str, ...], flag: str) -> tuple[str, ...]:
    items = tuple(item.strip().lower() for item in text.split(",") if item.strip())
    bad = [item for item in items if item not in allowed]
    if bad:
        raise ArgumentError(f"{flag} {text!r}: unknown {bad}; expected names from {allowed}")
    return items


_EPILOG = """\
Flags follow nccl-tests (-b -e -f -i -w -c -d -o -r), with one deviation: -n is the number of
ranks (as in mpirun -n), and nccl-tests' -n (iterations) is -I/--iters here. Without -I/-w,
iterations and warm-up are chosen per size so that the default sweep finishes in seconds.
Under mpirun, torchrun or python -m collectx.run, the ranks they started are used instead.
"""


def build_parser() -> argparse.ArgumentParser:
    """The ``collectx-perf`` argument parser (nccl-tests' flags plus collectx's own)."""
    p = argparse.ArgumentParser(prog="collectx-perf", epilog=_EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                description="Bus-bandwidth sweep of collectx collectives, "
                                            "printed like nccl-tests.")
    p.add_argument("-b", "--minbytes", default="8", help="smallest size (default 8; K/M/G)")
    p.add_argument("-e", "--maxbytes", default="64M", help="largest size (default 64M)")
    p.add_argument("-f", "--stepfactor", type=float, default=2.0, help="size factor (default 2)")
    p.add_argument("-i", "--stepbytes", default="0", help="fixed size step instead of -f")
    p.add_argument("-n", "--nprocs", type=int, default=2,
                   help="ranks to start locally (default 2; NOT iterations as in nccl-tests)")
    p.add_argument("-I", "--iters", type=int, default=None,
                   help="timed iterations per size (nccl-tests' -n; default: by size)")
    p.add_argument("-w", "--warmup_iters", type=int, default=None,
                   help="warm-up iterations per size (default: by size)")
    p.add_argument("-c", "--check", type=int, default=1, help="check results (1) or not (0)")
    p.add_argument("-d", "--datatype", default="float", help="float, half, bfloat16, int32, ...")
    p.add_argument("-o", "--op", default="sum", help="sum, prod, min, max or avg")
    p.add_argument("-r", "--root", type=int, default=0, help="root of broadcast/reduce")
    p.add_argument("--collective", default="allreduce",
                   help=f"one of {', '.join(COLLECTIVES)}, a comma list, or all")
    p.add_argument("--algo", default=None, help="force a planner algorithm (e.g. ring)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--compare", default="", help="peers beside collectx: mpi,gloo[,nccl]")
    p.add_argument("--simulate", default=None, metavar="SOURCE",
                   help="predict the table for a topology (preset name or file) instead")
    p.add_argument("--gpus", default=None,
                   help="with --simulate: GPUs, e.g. 0,1,2,5 or 0-3 (default all)")
    p.add_argument("--json", default=None, metavar="FILE", help="write results as JSON")
    p.add_argument("--csv", default=None, metavar="FILE", help="write results as CSV")
    p.add_argument("--plot", default=None, metavar="FILE", help="busbw plot (.png or .svg)")
    p.add_argument("--html", default=None, metavar="FILE", help="self-contained HTML report")
    p.add_argument("--bind", choices=("core", "none"), default="core",
                   help="ranks it starts, its own and its peers': core pins rank r to the r-th "
                        "allowed CPU when they fit, as mpirun does (default); none leaves them "
                        "to the scheduler")
    p.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="run collectx and the --compare peers round-robin N times and report "
                        "each cell's median (steadier on a shared machine; default 1)")
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bar on stderr")
    return p


def parse_args(argv: list[str] | None = None) -> Options:
    """Parse ``collectx-perf`` arguments into :class:`Options`; raises ArgumentError when bad."""
    a = build_parser().parse_args(argv)
    collectives = COLLECTIVES if a.collective == "all" else _csv_list(
        a.collective.replace("-", "_"), COLLECTIVES, "--collective")
    op = a.op.lower()
    if op not in OPS:
        raise ArgumentError(f"-o {a.op!r}: expected one of {', '.join(OPS)}")
    for flag, value, low in (("-n", a.nprocs, 1), ("-I", a.iters, 1), ("-w", a.warmup_iters, 0),
                             ("-c", a.check, 0), ("--repeat", a.repeat, 1)):
        if value is not None and value < low:
            raise ArgumentError(f"{flag} {value}: expected an integer >= {low}")
    if a.root < 0:  # the upper limit is the rank count, known once ranks exist
        raise ArgumentError(f"-r {a.root}: expected a root rank >= 0")
    if a.gpus is not None and a.simulate is None:   # a run takes rank r's GPU by its rank
        raise ArgumentError(f"--gpus {a.gpus}: only with --simulate SOURCE; a run gives rank r "
                            f"GPU r (set CUDA_VISIBLE_DEVICES to choose them)")
    sizes = size_sweep(parse_size(a.minbytes), parse_size(a.maxbytes), a.stepfactor,
                       parse_size(a.stepbytes))
    return Options(collectives=collectives, sizes=sizes, dtype=dtype_name(a.datatype), op=op,
                   root=a.root, nprocs=a.nprocs, iters=a.iters, warmup=a.warmup_iters,
                   check=a.check, algo=a.algo, device=a.device,
                   compare=_csv_list(a.compare, PEERS, "--compare"), simulate=a.simulate,
                   gpus=None if a.gpus is None else tuple(parse_gpu_list(a.gpus)),
                   json=a.json, csv=a.csv, plot=a.plot, html=a.html, progress=a.progress,
                   bind=a.bind, repeat=a.repeat)
