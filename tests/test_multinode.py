"""Multi-host runtime: pseudo-hosts under mpirun, a torch gloo engine, a dead rank, and two
network namespaces joined by a veth pair (the inter-host stage really crosses a link).

The rank program is tests/test_multinode_worker.py; every run has a timeout.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

import _needs as needs

from collectx.errors import ConfigError, EngineError
from collectx.runtime.multinode import LoopbackEngine, hosts_from_spec, init
from collectx.runtime.multinode.engines import _failures
from collectx.runtime.multinode.hosts import layout_of

ROOT = Path(__file__).resolve().parents[1]
WORKER = str(ROOT / "tests" / "test_multinode_worker.py")
TIMEOUT = 240


def _env(**extra) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLLECTX_HOSTS="2,2", OMP_NUM_THREADS="1")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _have_mpi() -> str | None:
    if shutil.which("mpirun") is None:
        return needs.reason("mpirun")
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return needs.reason("mpi4py")
    return None


def _torch_ranks(mode: str, wrap=lambda r: [], **extra) -> list[subprocess.CompletedProcess]:
    """Start 4 ranks with a gloo process group; ``wrap(rank)`` prefixes each command."""
    port = random.randint(20000, 40000)
    procs = []
    for r in range(4):
        env = _env(RANK=r, WORLD_SIZE=4, MASTER_ADDR=extra.get("addr", "127.0.0.1"),
                   MASTER_PORT=port, CX_TEST_ENGINE="torch", **extra.get("env", {}).get(r, {}))
        procs.append(subprocess.Popen([*wrap(r), sys.executable, WORKER, mode], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    out = []
    for p in procs:
        try:
            text, _ = p.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"rank timed out after {TIMEOUT} s (a hang)")
        out.append(subprocess.CompletedProcess(p.args, p.returncode, text, ""))
    return out


# -- units -------------------------------------------------------------------------------------
def test_pseudo_host_spec_and_layout():
    assert hosts_from_spec("1,3", 4) == [0, 1, 1, 1]
    with pytest.raises(ConfigError, match="summing to 4"):
        hosts_from_spec("2,3", 4)
    lay = layout_of([0, 0, 1, 1], 2)
    assert (lay.host, lay.local_rank, lay.rail(), lay.regular) == (1, 0, (0, 2), True)
    assert not layout_of([0, 1, 0, 1], 0).regular


def test_engine_failures_become_engine_errors():
    with pytest.raises(EngineError, match="peer host or rank has probably died"):
        with _failures("torch", "allreduce"):
            raise RuntimeError("Connection closed by peer")


def test_engines_that_cannot_run_here_say_why():
    from collectx.runtime.multinode import NCCLEngine, TorchEngine
    try:
        import cupy.cuda.nccl  # noqa: F401
    except ImportError:
        with pytest.raises(EngineError, match="CuPy built with NCCL"):
            NCCLEngine(LoopbackEngine())
    dist = needs.module("torch.distributed")
    if not dist.is_initialized():
        with pytest.raises(EngineError, match="init_process_group"):
            TorchEngine()


def test_world_of_one_runs_every_collective():
    with init(LoopbackEngine()) as comm:
        x = np.arange(5, dtype=np.float32)
        assert comm.allreduce(x.copy(), op="max").tolist() == x.tolist()
        assert comm.allgather(x).tolist() == x.tolist()
        assert comm.reduce_scatter(x).tolist() == x.tolist()
        assert comm.alltoall(x).tolist() == x.tolist()
        comm.barrier()


# -- processes -----------------------------------------------------------------------------------
@pytest.mark.mpi
def test_mpi_pseudo_hosts_every_collective(tmp_path):
    why = _have_mpi()
    if why:
        pytest.skip(why)
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-n", "4", "-x", "COLLECTX_HOSTS",
           "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS", "-x", "CX_TEST_REPORT_DIR",
           sys.executable, WORKER, "check"]
    r = subprocess.run(cmd, env=_env(CX_TEST_REPORT_DIR=tmp_path), capture_output=True,
                       text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    reports = sorted(p.read_text() for p in tmp_path.glob("rank*"))
    assert [x.split()[1] for x in reports] == ["0", "1", "2", "3"], r.stdout[-3000:]
    assert "OK 2 host 1 local 0 machine 4" in reports  # pseudo-hosts share this machine's CPUs


@pytest.mark.slow
def test_torch_gloo_engine_every_collective():
    needs.module("torch.distributed")
    runs = _torch_ranks("check", env={r: {"CX_TEST_QUICK": 1} for r in range(4)})
    for r in runs:
        assert r.returncode == 0 and "OK" in r.stdout, r.stdout[-3000:]


@pytest.mark.slow
def test_dead_rank_raises_on_every_survivor():
    needs.module("torch.distributed")
    runs = _torch_ranks("kill")
    assert runs[1].returncode != 0
    for rank in (0, 2, 3):
        assert f"SURVIVOR {rank}" in runs[rank].stdout, runs[rank].stdout[-2000:]
        assert any(k in runs[rank].stdout for k in ("EngineError", "PeerFailure", "Timeout"))


# -- two network namespaces ----------------------------------------------------------------------
def _netns_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if shutil.which("ip") is None:
        return "the ip tool is not installed"
    return None


@pytest.fixture
def veth_hosts():
    """Namespaces A (10.77.0.1) and B (10.77.0.2) joined by a veth pair; removed afterwards."""
    why = _netns_reason()
    if why:
        pytest.skip(why)
    tag = uuid.uuid4().hex[:6]
    ns, links = (f"cxa{tag}", f"cxb{tag}"), (f"va{tag}", f"vb{tag}")
    steps = [["ip", "netns", "add", ns[0]], ["ip", "netns", "add", ns[1]],
             ["ip", "link", "add", links[0], "type", "veth", "peer", "name", links[1]],
             ["ip", "link", "set", links[0], "netns", ns[0]],
             ["ip", "link", "set", links[1], "netns", ns[1]]]
    for k, (space, link) in enumerate(zip(ns, links)):
        run = ["ip", "netns", "exec", space]
        steps += [run + ["ip", "addr", "add", f"10.77.0.{k + 1}/24", "dev", link],
                  run + ["ip", "link", "set", link, "up"], run + ["ip", "link", "set", "lo", "up"]]
    try:
        for step in steps:
            r = subprocess.run(step, capture_output=True, text=True, timeout=30)
            if r.returncode:
                pytest.skip(f"cannot set up network namespaces ({' '.join(step)}: "
                            f"{r.stderr.strip()})")
        yield ns, links
    finally:
        for space in ns:
            subprocess.run(["ip", "netns", "del", space], capture_output=True, timeout=30)


def _tx_bytes(space: str, link: str) -> int:
    r = subprocess.run(["ip", "netns", "exec", space, "cat",
                        f"/sys/class/net/{link}/statistics/tx_bytes"],
                       capture_output=True, text=True, timeout=30)
    return int(r.stdout.strip())


@pytest.mark.slow
def test_inter_host_stage_crosses_a_veth_pair(veth_hosts):
    needs.module("torch.distributed")
    ns, links = veth_hosts
    host = lambda r: r // 2                                            # noqa: E731
    before = _tx_bytes(ns[0], links[0])
    runs = _torch_ranks(
        "bulk", wrap=lambda r: ["ip", "netns", "exec", ns[host(r)]], addr="10.77.0.1",
        env={r: {"GLOO_SOCKET_IFNAME": links[host(r)], "CX_TEST_QUICK": 1} for r in range(4)})
    for r in runs:
        assert r.returncode == 0 and "OK" in r.stdout, r.stdout[-3000:]
    # Each 4 MiB allreduce sends at least a 1 MiB half-shard per rail out of namespace A.
    assert _tx_bytes(ns[0], links[0]) - before >= 3 * 2 * (1 << 20)
