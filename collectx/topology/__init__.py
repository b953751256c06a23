"""collectx.topology: everything the planner knows about a machine.

A topology is a plain ``networkx.DiGraph`` (see :mod:`collectx.topology.model` for the node and
edge conventions). **Bandwidths are line rates** (GB/s per direction, whole link bundle), the
convention of the preset files; the planner uses them as they are.

Sources: presets (:func:`presets`), ``collectx.topology/1`` JSON (:func:`from_json`), NCCL
topology XML (:func:`from_nccl_xml`), ``nvidia-smi topo -m`` text (:func:`from_nvidia_smi`),
``rocm-smi --showtopo`` text (:func:`from_rocm_smi`), ``amd-smi topology`` text or JSON
(:func:`from_amd_smi`), probing this machine (:func:`probe`), and
generators (:func:`ring`, :func:`switch`, :func:`multi_node`, :func:`host`, ...).
:func:`load` accepts any of them.

>>> import collectx.topology as topo
>>> G = topo.load("dgx1v")
>>> topo.gpus(topo.subset(G, [0, 3, 5]))
['GPU0', 'GPU3', 'GPU5']
"""

from __future__ import annotations

from .draw import draw, layout
from .generators import fully_connected, host, line, multi_node, pcie_tree, ring, switch
from .jsonio import from_json, load, parse_text, preset_path, presets, to_json, write_json
from .nccl_xml import from_nccl_xml
from .nvsmi import from_nvidia_smi
from .rocmsmi import from_rocm_smi
from .amdsmi import from_amd_smi
from .probe import local_topology, probe, probe_host
from .paths import Path, PathClass, classify, path_class, paths, widest_path
from .model import (DEFAULT_LATENCY_US, LINK_TYPES, NODE_KINDS, SCHEMA, add_link, add_node,
                    gpu_index, gpus, natural_key, new_graph, nodes_of_kind, parse_gpu_list,
                    resolve_gpus, subset)

__all__ = [
    "load", "from_json", "to_json", "write_json", "parse_text", "presets", "preset_path", "gpus",
    "gpu_index", "parse_gpu_list", "resolve_gpus", "subset", "nodes_of_kind", "natural_key",
    "new_graph", "add_node", "add_link", "ring", "line", "fully_connected", "switch", "pcie_tree",
    "multi_node", "host", "from_nccl_xml", "from_nvidia_smi", "from_rocm_smi", "from_amd_smi",
    "Path", "PathClass",
    "classify", "path_class", "paths", "widest_path", "draw", "layout", "probe", "probe_host",
    "local_topology", "SCHEMA", "NODE_KINDS", "LINK_TYPES", "DEFAULT_LATENCY_US",
]
