"""Every real machine description in topology/real/ loads into a usable topology."""

from pathlib import Path

import networkx as nx
import pytest

import collectx.topology as topo

REAL = Path(__file__).resolve().parent.parent / "topology" / "real"
DUMPS = sorted(p for p in REAL.iterdir() if p.is_file() and p.suffix in (".xml", ".txt"))


def test_the_catalogue_is_there_and_every_file_has_a_source():
    assert len(DUMPS) >= 10
    sources = (REAL / "SOURCES.md").read_text()
    assert [p.name for p in DUMPS if f"`{p.name}`" not in sources] == []
    assert [p.name for p in REAL.iterdir() if p.suffix not in (".xml", ".txt", ".md")] == []


@pytest.mark.parametrize("path", DUMPS, ids=[p.name for p in DUMPS])
def test_real_dump_loads_strongly_connected_with_every_gpu_reaching_every_other(path):
    G = topo.load(path)
    gpus = topo.gpus(G)
    assert len(gpus) >= 1
    assert nx.is_strongly_connected(G)
    for a in gpus:
        reach = nx.descendants(G, a)
        assert set(gpus) - {a} <= reach
    for a, b, d in G.edges(data=True):
        assert a != b and d["bw_gbps"] > 0 and G.has_edge(b, a)
