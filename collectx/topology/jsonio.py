"""Reading and writing topologies: the ``collectx.topology/1`` JSON schema, presets, ``load``.

The JSON file lists nodes (``id``, ``kind``, any extra attributes) and *undirected* links
(``a``, ``b``, ``type``, ``count``, ``bw_gbps`` per direction, optional ``latency_us`` when it
differs from the per-type default, optional ``directed: true`` for a one-way link). Bandwidths
are line rates. ``to_json(from_json(d)) == d`` for every preset file.

>>> G = load("dgx1v")
>>> len(gpus(G)), G.edges["GPU0", "GPU3"]["bw_gbps"], G.edges["GPU3", "GPU0"]["count"]
(8, 50.0, 2)
>>> to_json(G) == json.loads(preset_path("dgx1v").read_text())
True
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import networkx as nx

from ..errors import TopologyError
from .model import (DEFAULT_LATENCY_US, NODE_KINDS, SCHEMA, UNITS, add_link, add_node, gpus,
                    natural_key, new_graph)

_NODE_KEYS = ("id", "kind")
_LINK_KEYS = ("a", "b", "type", "count", "bw_gbps", "latency_us", "directed")


def _preset_dirs() -> list[Path]:
    here = Path(__file__).resolve().parent
    # A source checkout keeps the catalogue at the repository root; the wheel build installs
    # a copy as collectx/_presets (CMakeLists.txt).
    return [here.parent.parent / "topology", here.parent / "_presets"]


def presets() -> list[str]:
    """Names of the preset topologies shipped with collectx.

    >>> "dgx1v" in presets() and "dgx_h100" in presets()
    True
    """
    names = set()
    for folder in _preset_dirs():
        if folder.is_dir():
            names.update(p.stem for p in folder.glob("*.json"))
    return sorted(names, key=natural_key)


def preset_path(name: str) -> Path:
    """Path of the preset JSON file called ``name``; TopologyError listing presets if unknown.

    >>> preset_path("dgx2").name
    'dgx2.json'
    """
    for folder in _preset_dirs():
        candidate = folder / f"{name}.json"
        if candidate.is_file():
            return candidate
    raise TopologyError(f"unknown topology {name!r}: not a preset and not a file; known "
                        f"presets: {', '.join(presets())}")


def from_json(data: dict | str) -> nx.DiGraph:
    """Build a topology from a ``collectx.topology/1`` dict or JSON text.

    Parameters
    ----------
    data : dict or str
        The parsed document, or its JSON text.

    Returns
    -------
    nx.DiGraph
        Two directed edges per undirected link (see :mod:`collectx.topology.model`).

    Raises
    ------
    TopologyError
        Bad JSON, wrong schema, unknown kinds/types, links to undeclared nodes.

    Examples
    --------
    >>> G = from_json({"schema": "collectx.topology/1", "name": "pair",
    ...                "nodes": [{"id": "GPU0", "kind": "gpu"}, {"id": "GPU1", "kind": "gpu"}],
    ...                "links": [{"a": "GPU0", "b": "GPU1", "type": "nvlink", "count": 2,
    ...                           "bw_gbps": 50.0}]})
    >>> G.edges["GPU1", "GPU0"]["latency_us"], G.graph["bw_convention"]
    (0.7, 'line_rate')
    """
    if isinstance(data, (str, bytes)):
        try:
            data = json.loads(data)
        except json.JSONDecodeError as exc:
            raise TopologyError(f"topology JSON does not parse at line {exc.lineno} column "
                                f"{exc.colno}: {exc.msg}") from None
    if not isinstance(data, dict):
        raise TopologyError(f"topology JSON is a {type(data).__name__}; expected an object "
                            f"with 'schema', 'nodes' and 'links'")
    if data.get("schema") != SCHEMA:
        raise TopologyError(f"topology schema is {data.get('schema')!r}; expected {SCHEMA!r}")
    G = new_graph(str(data.get("name", "topology")), str(data.get("description", "")))
    for i, node in enumerate(_list_of_dicts(data, "nodes")):
        if "id" not in node or "kind" not in node:
            raise TopologyError(f"nodes[{i}] = {node!r} lacks 'id' or 'kind'")
        extra = {k: v for k, v in node.items() if k not in _NODE_KEYS}
        add_node(G, str(node["id"]), str(node["kind"]), **extra)
    for i, link in enumerate(_list_of_dicts(data, "links")):
        _add_json_link(G, i, link)
    return G


def _list_of_dicts(data: dict, key: str) -> list[dict]:
    items = data.get(key, [])
    if not isinstance(items, list) or not all(isinstance(x, dict) for x in items):
        raise TopologyError(f"topology '{key}' must be a list of objects")
    return items


def _add_json_link(G: nx.DiGraph, i: int, link: dict) -> None:
    missing = [k for k in ("a", "b", "type", "bw_gbps") if k not in link]
    if missing:
        raise TopologyError(f"links[{i}] = {link!r} lacks {', '.join(missing)}")
    extra = {k: v for k, v in link.items() if k not in _LINK_KEYS}
    try:
        bw = float(link["bw_gbps"])
        count = int(link.get("count", 1))
    except (TypeError, ValueError):
        raise TopologyError(f"links[{i}]: bw_gbps and count must be numbers, got "
                            f"{link['bw_gbps']!r} and {link.get('count')!r}") from None
    add_link(G, str(link["a"]), str(link["b"]), str(link["type"]), bw, count,
             latency_us=link.get("latency_us"), directed=bool(link.get("directed", False)),
             **extra)


def to_json(G: nx.DiGraph) -> dict:
    """The ``collectx.topology/1`` dict of a topology (links written once per pair).

    Links keep the order and orientation they were declared in; ``latency_us`` is written only
    when it differs from the per-type default. A pair whose two directions differ is written
    as two ``directed`` links.

    >>> from collectx.topology import ring
    >>> doc = to_json(ring(3))
    >>> doc["schema"], len(doc["nodes"]), doc["links"][0]
    ('collectx.topology/1', 3, {'a': 'GPU0', 'b': 'GPU1', 'type': 'nvlink', 'count': 1, 'bw_gbps': 25.0})
    """
    for n, d in G.nodes(data=True):
        if "kind" not in d:
            raise TopologyError(f"node {n!r} has no 'kind'; expected one of {', '.join(NODE_KINDS)}")
    nodes = [{"id": n, "kind": d["kind"], **{k: v for k, v in d.items() if k != "kind"}}
             for n, d in G.nodes(data=True)]
    return {"schema": SCHEMA, "name": G.graph.get("name", "topology"),
            "description": G.graph.get("description", ""), "units": dict(UNITS),
            "nodes": nodes, "links": _links_of(G)}


def _links_of(G: nx.DiGraph) -> list[dict]:
    declared = [(a, b) for a, b in G.graph.get("link_order", ()) if G.has_edge(a, b)]
    done: set[tuple[str, str]] = set()
    links = []
    for a, b in declared + list(G.edges):
        if (a, b) in done or not G.has_edge(a, b):
            continue
        fwd, back = G.edges[a, b], G.edges[b, a] if G.has_edge(b, a) else None
        link = _link_dict(a, b, fwd)
        done.add((a, b))
        if back == fwd:
            done.add((b, a))
        else:
            link["directed"] = True
        links.append(link)
    return links


def _link_dict(a: str, b: str, data: dict) -> dict:
    if "type" not in data or "bw_gbps" not in data:
        raise TopologyError(f"edge {a}->{b} lacks 'type' or 'bw_gbps'; every edge needs both "
                            f"(use collectx.topology.add_link)")
    link = {"a": a, "b": b, "type": data["type"], "count": data.get("count", 1),
            "bw_gbps": data["bw_gbps"]}
    lat = data.get("latency_us")
    if lat is not None and lat != DEFAULT_LATENCY_US.get(data["type"]):
        link["latency_us"] = lat
    link.update({k: v for k, v in data.items() if k not in _LINK_KEYS})
    return link


def write_json(G: nx.DiGraph, path: str | os.PathLike) -> None:
    """Write :func:`to_json` of ``G`` to ``path`` (indented, stable key order)."""
    Path(path).write_text(json.dumps(to_json(G), indent=1) + "\n")


def sniff(text: str) -> str:
    """Guess the format of a topology text: ``"json"``, ``"nccl_xml"``, ``"rocm_smi"``,
    ``"amd_smi"`` or ``"nvidia_smi"``.

    >>> sniff('{"schema": "collectx.topology/1"}'), sniff("<system version='1'>"), sniff("\\tGPU0\\n")
    ('json', 'nccl_xml', 'nvidia_smi')
    >>> sniff("=== Link Type between two GPUs ===")
    'rocm_smi'
    >>> sniff("LINK TYPE TABLE:")
    'amd_smi'
    """
    from .amdsmi import looks_like_amd_smi
    from .rocmsmi import looks_like_rocm_smi
    head = text.lstrip()
    if looks_like_amd_smi(text):   # before JSON: amd-smi's --json is a JSON list
        return "amd_smi"
    if head.startswith("{"):   # rocm-smi's --json is a JSON object too
        return "rocm_smi" if looks_like_rocm_smi(text) else "json"
    if head.startswith("<") or "<system" in text:
        return "nccl_xml"
    return "rocm_smi" if looks_like_rocm_smi(text) else "nvidia_smi"


def load(source) -> nx.DiGraph:
    """Load a topology from a preset name, a file (JSON, NCCL XML, nvidia-smi, rocm-smi or
    amd-smi output) or a graph.

    Parameters
    ----------
    source : str, os.PathLike or nx.DiGraph
        A preset name such as ``"dgx1v"`` (see :func:`presets`), a path to a file whose format
        is sniffed from its content, or a graph (returned as is).

    Raises
    ------
    TopologyError
        Unknown name (the message lists the presets) or a file that cannot be read.

    Examples
    --------
    >>> load("mi300x").graph["name"]
    'mi300x'
    >>> load("no_such_machine")
    Traceback (most recent call last):
    ...
    collectx.errors.TopologyError: unknown topology 'no_such_machine': not a preset and not a file; known presets: ...
    """
    if isinstance(source, nx.DiGraph):
        return source
    if not isinstance(source, (str, os.PathLike)):
        raise TopologyError(f"cannot load a topology from a {type(source).__name__}; expected "
                            f"a preset name, a file path or an nx.DiGraph")
    if str(source).startswith("multi:"):   # a cluster: multi:PRESET:NODES:GBPS[:single]
        from .generators import multi_node_spec
        return multi_node_spec(str(source))
    path = Path(source)
    try:
        is_file = path.is_file()
    except OSError:  # e.g. a name too long to be a path
        is_file = False
    if not is_file:
        path = preset_path(str(source))
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise TopologyError(f"cannot read topology file {str(path)!r}: {exc}") from None
    return parse_text(text, origin=str(path))


def parse_text(text: str, origin: str = "<text>") -> nx.DiGraph:
    """Parse topology text of any supported format (see :func:`sniff`)."""
    if not text.strip():   # else read as a matrix without its header row, which misleads
        raise TopologyError(f"{origin}: the topology text is empty; expected collectx topology "
                            f"JSON, an NCCL/RCCL topology XML, 'nvidia-smi topo -m', "
                            f"'rocm-smi --showtopo' or 'amd-smi topology' output")
    fmt = sniff(text)
    if fmt == "json":
        G = from_json(text)
    elif fmt == "nccl_xml":
        from .nccl_xml import from_nccl_xml
        G = from_nccl_xml(text)
    elif fmt == "rocm_smi":
        from .rocmsmi import from_rocm_smi
        G = from_rocm_smi(text)
    elif fmt == "amd_smi":
        from .amdsmi import from_amd_smi
        G = from_amd_smi(text)
    else:
        from .nvsmi import from_nvidia_smi
        G = from_nvidia_smi(text)
    if not gpus(G):
        raise TopologyError(f"{origin}: the topology has no GPUs (no node of kind 'gpu')")
    return G
