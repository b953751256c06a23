"""The topology model: vocabulary, defaults and small queries over a ``networkx.DiGraph``.

A topology is a plain directed graph. Nodes carry ``kind`` (one of :data:`NODE_KINDS`); every
physical link is stored as two directed edges ``a->b`` and ``b->a`` carrying ``type`` (one of
:data:`LINK_TYPES`), ``bw_gbps`` (GB/s per direction, the whole bundle), ``count`` (links in the
bundle) and ``latency_us``.

Bandwidths are **line rates** (e.g. 25 GB/s per NVLink2/3/4 link per direction, 15.75 GB/s for
PCIe Gen3 x16), not the ~80 % that protocols achieve: the planner compares and packs links with
these numbers, and measured throughput is judged against them.

For the planner, kind ``"gpu"`` means *rank endpoint*: CPU ranks of the shared-memory runtime
are nodes ``RANK<i>`` of kind ``"gpu"`` with ``device="cpu"`` (see :func:`collectx.topology.host`).

>>> from collectx.topology import ring
>>> G = ring(3)
>>> gpus(G), G.edges["GPU0", "GPU1"]["type"], G.edges["GPU1", "GPU0"]["bw_gbps"]
(['GPU0', 'GPU1', 'GPU2'], 'nvlink', 25.0)
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path

import networkx as nx

from ..errors import ArgumentError, TopologyError, integral

SCHEMA = "collectx.topology/1"
BW_CONVENTION = "line_rate"
UNITS = {"bw_gbps": "GB/s per direction, all links of the bundle together "
                    "(count x per-link line rate)"}

NODE_KINDS = ("gpu", "cpu", "nvswitch", "pci_switch", "nic", "net_switch", "host")
LINK_TYPES = ("nvlink", "xgmi", "c2c", "pcie", "smp", "net", "shm")
GPU_LINK_TYPES = ("nvlink", "xgmi")   # GPU-to-GPU links: CUDA/HIP peer copies take them first

# Per-hop latency defaults in microseconds. NVLink, PCIe and network values are NCCL's LL
# per-hop hardware latencies (tuning.cc hwLat: NVLink 0.6, PCI 1.0, NET 2.7 for rings, rounded);
# xGMI and C2C (NVLink-C2C between a GPU and its Grace CPU) are taken equal to NVLink
# (point-to-point SerDes links of the same class); smp is one
# cross-socket cache-line transfer (~0.1-0.2 us on UPI/Infinity Fabric, rounded up for the
# flag round trip); shm is a cache-line handoff between cores of one socket (~0.1 us) plus the
# flag poll. They are planning estimates, not measurements of a given machine.
DEFAULT_LATENCY_US = {
    "nvlink": 0.7,
    "xgmi": 0.7,
    "c2c": 0.7,
    "pcie": 1.0,
    "smp": 0.5,
    "net": 2.0,
    "shm": 0.3,
}

_NATURAL_SPLIT = re.compile(r"(\d+)")


def natural_key(name: str) -> tuple:
    """Sort key that orders embedded numbers numerically ("GPU2" before "GPU10").

    >>> sorted(["GPU10", "GPU2", "n1/GPU0", "n0/GPU11"], key=natural_key)
    ['GPU2', 'GPU10', 'n0/GPU11', 'n1/GPU0']
    """
    parts = _NATURAL_SPLIT.split(str(name))
    return tuple(int(p) if p.isdecimal() else p for p in parts)


def new_graph(name: str, description: str = "") -> nx.DiGraph:
    """An empty topology with the graph-level attributes every topology carries.

    >>> new_graph("toy").graph["bw_convention"]
    'line_rate'
    """
    return nx.DiGraph(name=name, description=description, bw_convention=BW_CONVENTION)


def add_node(G: nx.DiGraph, node_id: str, kind: str, **attrs) -> None:
    """Add a node of a known ``kind``; extra attributes are kept (and written to JSON)."""
    if kind not in NODE_KINDS:
        raise TopologyError(f"node {node_id!r} has kind {kind!r}; expected one of "
                            f"{', '.join(NODE_KINDS)}")
    G.add_node(node_id, kind=kind, **attrs)


def add_link(G: nx.DiGraph, a: str, b: str, type: str, bw_gbps: float, count: int = 1,
             latency_us: float | None = None, directed: bool = False, **attrs) -> None:
    """Add one physical link as two directed edges (one when ``directed``).

    ``bw_gbps`` is per direction for the whole bundle of ``count`` links. ``latency_us``
    defaults to :data:`DEFAULT_LATENCY_US` for the link type.
    """
    for end in (a, b):
        if end not in G:
            raise TopologyError(f"link {a}-{b} names node {end!r}, which is not in the "
                                f"topology; declare every node before linking it")
    if type not in LINK_TYPES:
        raise TopologyError(f"link {a}-{b} has type {type!r}; expected one of "
                            f"{', '.join(LINK_TYPES)}")
    if a == b:
        raise TopologyError(f"link {a}-{b} joins a node to itself; remove it")
    if not bw_gbps > 0:
        raise TopologyError(f"link {a}-{b} has bw_gbps={bw_gbps!r}; expected a positive "
                            f"number of GB/s per direction")
    lat = DEFAULT_LATENCY_US[type] if latency_us is None else float(latency_us)
    data = dict(type=type, bw_gbps=float(bw_gbps), count=int(count), latency_us=lat, **attrs)
    G.add_edge(a, b, **data)
    if not directed:
        G.add_edge(b, a, **dict(data))
    # The order and orientation links were declared in, so that to_json() writes a file back
    # exactly as it was read. A tuple, because G.copy() shares graph attributes shallowly.
    G.graph["link_order"] = G.graph.get("link_order", ()) + ((a, b),)


def nodes_of_kind(G: nx.DiGraph, kind: str) -> list[str]:
    """Node ids of one kind, in natural order.

    >>> from collectx.topology import switch
    >>> nodes_of_kind(switch(3), "nvswitch")
    ['NVS0']
    """
    return sorted((n for n, k in G.nodes(data="kind") if k == kind), key=natural_key)


def gpus(G: nx.DiGraph) -> list[str]:
    """The rank endpoints (nodes of kind ``"gpu"``) in natural order.

    Examples
    --------
    >>> from collectx.topology import line
    >>> gpus(line(12))[:3], gpus(line(12))[-1]
    (['GPU0', 'GPU1', 'GPU2'], 'GPU11')
    """
    return nodes_of_kind(G, "gpu")


def gpu_index(G: nx.DiGraph) -> dict[str, int]:
    """Map each GPU id to its position in :func:`gpus` (its rank).

    >>> from collectx.topology import ring
    >>> gpu_index(ring(2))
    {'GPU0': 0, 'GPU1': 1}
    """
    return {g: i for i, g in enumerate(gpus(G))}


def parse_gpu_list(text: str) -> list[int | str]:
    """Parse ``--gpus`` text, ``"0,1,2,5"``, ``"0-3,6"`` or ids (``"GPU0,GPU3"``), into a
    list for :func:`resolve_gpus` and :func:`subset`.

    >>> parse_gpu_list("0-3,6"), parse_gpu_list("GPU1, 4")
    ([0, 1, 2, 3, 6], ['GPU1', 4])
    """
    if not text.strip():   # an empty list is a mistake (an unset variable), not every GPU
        raise ArgumentError(f"--gpus {text!r}: no GPU listed; expected indices and ranges such "
                            f"as 0,1,2,5 or 0-3,6 (or GPU ids), or no --gpus for every GPU")
    out: list[int | str] = []
    for item in (part.strip() for part in text.split(",")):
        lo, dash, hi = item.partition("-")
        if item.isdecimal():
            out.append(int(item))
        elif dash and lo.isdecimal() and hi.isdecimal() and int(lo) <= int(hi):
            out.extend(range(int(lo), int(hi) + 1))
        elif item and not dash and not item[0].isdecimal():
            out.append(item)
        else:
            raise ArgumentError(f"--gpus {text!r}: cannot read {item!r}; expected indices and "
                                f"ranges such as 0,1,2,5 or 0-3,6 (or GPU ids)")
    return out


def resolve_gpus(G: nx.DiGraph, wanted: Iterable[int | str]) -> list[str]:
    """Turn a list of GPU indices (into :func:`gpus`) or ids into ids; reject bad entries."""
    if isinstance(wanted, str):   # its letters would be read as GPU ids, one by one
        raise ArgumentError(f"gpus={wanted!r}: expected a list of GPU indices or ids, such as "
                            f"[{wanted!r}] or [0, 1]")
    order = gpus(G)
    chosen: list[str] = []
    for item in wanted:
        if integral(item) is None and not isinstance(item, str):
            raise TopologyError(f"GPU {item!r}: expected an index (int) or an id such as "
                                f"{order[0] if order else 'GPU0'!r}")
        if not isinstance(item, str):
            item = int(item)   # a numpy index too
            if not 0 <= item < len(order):
                raise TopologyError(f"GPU index {item} is out of range: "
                                    f"{G.graph.get('name', 'this topology')!r} has "
                                    f"{len(order)} GPUs (0-{len(order) - 1})")
            gid = order[item]
        elif item in order:
            gid = item
        else:
            raise TopologyError(f"GPU {item!r} is not in {G.graph.get('name', 'the topology')!r}; "
                                f"known GPUs: {', '.join(order)}")
        if gid in chosen:
            raise TopologyError(f"GPU {gid!r} is listed twice; list each GPU once")
        chosen.append(gid)
    return chosen


def subset(G: nx.DiGraph, wanted: Iterable[int | str]) -> nx.DiGraph:
    """A copy of ``G`` with only the ``wanted`` GPUs; switches, CPUs and NICs stay as relays.

    GPUs outside a job's allocation belong to other jobs, so the planner must not route
    through them; everything else keeps forwarding traffic.

    Parameters
    ----------
    G : nx.DiGraph
        The topology (not modified).
    wanted : iterable of int or str
        GPU indices into :func:`gpus` or GPU ids; each at most once.

    Returns
    -------
    nx.DiGraph
        A new graph; its ``name`` notes the subset.

    Raises
    ------
    TopologyError
        For an unknown id, an index out of range, or a GPU listed twice.

    Examples
    --------
    >>> from collectx.topology import switch
    >>> S = subset(switch(8), [0, "GPU5"])
    >>> gpus(S), "NVS0" in S
    (['GPU0', 'GPU5'], True)
    """
    keep = set(resolve_gpus(G, wanted))
    drop = [g for g in gpus(G) if g not in keep]
    H = G.copy()
    H.remove_nodes_from(drop)
    if drop:
        H.graph["name"] = f"{G.graph.get('name', 'topology')}[{','.join(gpus(H))}]"
    return H


def read_source(source, what: str, is_path: Callable[[str], bool]) -> str:
    """The text of ``source``: a file's where it is an ``os.PathLike`` or a string ``is_path``
    takes for a path, else the string itself (the text given inline). An unreadable file
    raises :class:`TopologyError` naming ``what`` was to be read.

    >>> read_source("GPU0", "a matrix", lambda s: False)
    'GPU0'
    """
    if isinstance(source, os.PathLike) or (isinstance(source, str) and is_path(source)):
        try:
            return Path(source).read_text()
        except OSError as exc:
            raise TopologyError(f"cannot read {what} {str(source)!r}: {exc}") from None
    return source
