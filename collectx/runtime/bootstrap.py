"""Who am I, how many are we, and where do we meet: rank, world size and store from the launcher.

Detected from the environment, first match wins:

========================  =========================================  ===========================
launcher                  variables                                  rendezvous
========================  =========================================  ===========================
collectx (launch, run)    COLLECTX_RANK, COLLECTX_WORLD_SIZE,        FileStore on the directory
                          COLLECTX_RDZV_DIR
torchrun / env://         RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT  torch TCPStore (client)
mpirun / srun             OMPI_COMM_WORLD_RANK, PMI_RANK,            FileStore in a directory
                          SLURM_PROCID                               rank 0 makes and broadcasts
                                                                     over mpi4py COMM_WORLD
none                      --                                         a world of one rank
========================  =========================================  ===========================

>>> detect({"COLLECTX_RANK": "0", "COLLECTX_WORLD_SIZE": "2", "COLLECTX_RDZV_DIR": "/tmp/x"})
'collectx'
>>> detect({"OMPI_COMM_WORLD_RANK": "1"}), detect({})
('mpi', 'single')
"""

from __future__ import annotations

import numbers
import os
import re
import shutil
import tempfile
from typing import Callable, Mapping

from ..errors import ArgumentError, ConfigError
from .store import FileStore, HashStore, Store, TorchStore

_MPI_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")

# The launcher's store, one object per rendezvous in a process: a second init() under torchrun's
# env:// without an agent store would otherwise bind a second TCPStore server to MASTER_PORT.
_LAUNCHER_STORES: dict[tuple, Store] = {}


_RDZV_DIR = re.compile(r"^collectx-(?:rdzv|host)-(\d+)-")


def rendezvous_dir(kind: str = "rdzv") -> str:
    """A new rendezvous directory in the temporary directory, named after this process so that
    one left behind by a process that died (SIGKILL, ``os._exit``) is removed later by
    :func:`sweep_rendezvous`."""
    return tempfile.mkdtemp(prefix=f"collectx-{kind}-{os.getpid()}-")


def sweep_rendezvous(root: str | None = None) -> list[str]:
    """Remove the rendezvous directories whose creator process is gone; returns their paths.

    >>> sweep_rendezvous(tempfile.mkdtemp())
    []
    """
    from .window import _alive
    root = root or tempfile.gettempdir()
    removed = []
    for name in os.listdir(root):
        m = _RDZV_DIR.match(name)
        if m and not _alive(int(m.group(1))):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
            removed.append(os.path.join(root, name))
    return removed


def _launcher_store(key: tuple, make: Callable[[], Store]) -> Store:
    if key not in _LAUNCHER_STORES:
        _LAUNCHER_STORES[key] = make()
    return _LAUNCHER_STORES[key]


def detect(env: Mapping[str, str] | None = None) -> str:
    """Name of the launcher that started this process: collectx, torch, mpi or single."""
    env = os.environ if env is None else env
    if "COLLECTX_RANK" in env and "COLLECTX_RDZV_DIR" in env:
        return "collectx"
    if all(k in env for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
        return "torch"
    if any(k in env for k in _MPI_VARS):
        return "mpi"
    return "single"


def is_seconds(value) -> bool:
    """Whether ``value`` is a number of seconds: a real number (Python's or numpy's), not a bool.

    >>> import numpy as np
    >>> is_seconds(1), is_seconds(np.float32(0.5)), is_seconds(True), is_seconds("1")
    (True, True, False, False)
    """
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def timeout_s(timeout: float | None, config=None) -> float:
    """The seconds a collective may take before it raises Timeout: ``timeout``, or where it is
    None the ``config``'s (``COLLECTX_TIMEOUT``); ArgumentError unless a positive number."""
    if timeout is None:
        from ..config import get_config
        return float((config or get_config()).timeout_s)
    if not is_seconds(timeout) or not timeout > 0:
        raise ArgumentError(f"timeout={timeout!r}: expected seconds > 0 (or None for "
                            f"COLLECTX_TIMEOUT)")
    return float(timeout)


def bootstrap(rank: int | None, world_size: int | None, store, timeout: float
              ) -> tuple[int, int, Store, Callable[[], None], Callable[[], None]]:
    """``(rank, world_size, store, ready, release)``: call ``ready()`` once the windows are
    mapped, and ``release()`` when the communicator closes (the store serves its plan sharing
    until then, so a rendezvous directory made here lives as long as the communicator)."""
    if store is not None:
        rank = _int(rank, "RANK", "rank")
        world_size = _int(world_size, "WORLD_SIZE", "world_size")
        return rank, world_size, store, _nothing, _nothing
    kind = detect()
    env = os.environ
    if kind == "collectx":
        return (_pick(rank, env["COLLECTX_RANK"]), _pick(world_size, env["COLLECTX_WORLD_SIZE"]),
                _launcher_store(("collectx", env["COLLECTX_RDZV_DIR"]),
                                lambda: FileStore(env["COLLECTX_RDZV_DIR"])), _nothing, _nothing)
    if kind == "torch":
        return _torch(rank, world_size, timeout)
    if kind == "mpi":
        return _mpi(timeout)
    if world_size not in (None, 1):
        raise ArgumentError(f"world_size={world_size} with no store and no launcher variables; "
                            f"expected a store=..., or start the ranks with collectx.launch, "
                            f"python -m collectx.run, torchrun or mpirun")
    return rank or 0, 1, HashStore(), _nothing, _nothing


def _nothing() -> None:
    pass


def _pick(given: int | None, env_value: str) -> int:
    return int(env_value) if given is None else int(given)


def _int(value, env_name: str, what: str) -> int:
    if value is not None:
        return int(value)
    if env_name in os.environ:
        return int(os.environ[env_name])
    raise ArgumentError(f"{what} is required with an explicit store (or set {env_name})")


def _torch(rank, world_size, timeout):
    from datetime import timedelta
    try:
        import torch.distributed as dist
    except ImportError as e:
        raise ConfigError("torchrun variables are set (RANK, MASTER_ADDR, ...) but torch is not "
                          "importable; install torch or launch with python -m collectx.run") from e
    env = os.environ
    rank = _pick(rank, env["RANK"])
    world_size = _pick(world_size, env["WORLD_SIZE"])
    # Under torchrun the agent already serves the store at MASTER_ADDR:MASTER_PORT.
    agent = env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    run_id = env.get("TORCHELASTIC_RUN_ID", "default")

    def make():
        tcp = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), world_size,
                            is_master=(rank == 0 and not agent),
                            timeout=timedelta(seconds=timeout), wait_for_workers=False)
        return TorchStore(dist.PrefixStore(f"collectx/{run_id}", tcp))
    key = ("torch", env["MASTER_ADDR"], env["MASTER_PORT"], run_id, rank, world_size)
    return rank, world_size, _launcher_store(key, make), _nothing, _nothing


def _mpi(timeout):
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise ConfigError("MPI launcher variables are set but mpi4py is not importable; install "
                          "mpi4py or launch with python -m collectx.run") from e
    world = MPI.COMM_WORLD
    path = rendezvous_dir() if world.rank == 0 else None
    path = world.bcast(path, root=0)

    def ready():
        world.Barrier()  # every rank has read the keys of the rendezvous

    def release():
        if world.rank == 0:
            shutil.rmtree(path, ignore_errors=True)
    return world.rank, world.size, FileStore(path), ready, release
