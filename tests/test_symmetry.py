"""Automorphisms of job graphs, and the multicast LP that solves one root per orbit."""

import networkx as nx
import pytest

import collectx.topology as topo
from collectx.topology.flows import multicast_rate
from collectx.topology.symmetry import orbits
from collectx.topology.view import job_graph, without_turnarounds

from _dumps import REAL


def _split(G, gpus):
    return without_turnarounds(job_graph(G, gpus), gpus)


def _is_automorphism(G, carry, gpus) -> bool:
    """``carry`` maps G onto itself: kinds, the GPU set, links and their capacities kept."""
    if sorted(carry.values(), key=str) != sorted(G, key=str):
        return False
    if any(G.nodes[v].get("kind") != G.nodes[carry[v]].get("kind") for v in G):
        return False
    if {carry[g] for g in gpus} != set(gpus):
        return False
    return all(G.has_edge(carry[u], carry[v]) and G.edges[carry[u], carry[v]]["cap"] == c
               for u, v, c in G.edges(data="cap"))


@pytest.mark.parametrize("machine, gpus, expected", [
    ("dgx1v", None, 2),         # the two quads: each GPU's NVLink mix tells which
    ("dgx1p", None, 1),         # a hybrid cube mesh of equal links: every GPU alike
    ("dgx1v", ["GPU0", "GPU1", "GPU2"], 3),
])
def test_orbits_group_the_gpus_an_automorphism_swaps(machine, gpus, expected):
    G0 = topo.load(machine)
    gpus = gpus or topo.gpus(G0)
    G = _split(G0, gpus)
    found = orbits(G, gpus)
    assert len(found) == expected
    assert sorted(g for _, members in found for g, _ in members) == sorted(gpus)
    for rep, members in found:
        assert members[0] == (rep, {v: v for v in G})
        for gpu, carry in members:
            assert carry[rep] == gpu and _is_automorphism(G, carry, gpus)


def test_gpus_with_different_links_share_no_orbit():
    G = topo.ring(4, bw=25.0)
    nx.set_edge_attributes(G, 25.0, "cap")
    G.edges["GPU2", "GPU3"]["cap"] = G.edges["GPU3", "GPU2"]["cap"] = 50.0
    found = {rep: sorted(g for g, _ in members) for rep, members in orbits(G, list(G))}
    # GPU2 and GPU3 each touch the fast link; the reflection swapping them swaps 1 and 0
    assert found == {"GPU0": ["GPU0", "GPU1"], "GPU2": ["GPU2", "GPU3"]}


@pytest.mark.parametrize("machine, gpus", [
    ("dgx1v", None),
    ("dgx1p", None),
    ("dgx1p", ["GPU0", "GPU1", "GPU4", "GPU5"]),
    (REAL / "mi250_8gcd_8nic_rccl_topo.xml", None),
])
def test_multicast_lp_over_orbits_is_the_lp_over_every_root(machine, gpus):
    G0 = topo.load(machine)
    gpus = gpus or topo.gpus(G0)
    H = _split(G0, gpus)
    assert len(orbits(H, gpus)) < len(gpus)   # the reduction has something to reduce
    assert multicast_rate(H, gpus) == pytest.approx(
        multicast_rate(H, gpus, symmetric=False), rel=1e-9)


def test_gpus_refinement_cannot_tell_apart_are_kept_apart_where_no_automorphism_swaps_them():
    # Every GPU has two equal links: a six-GPU ring and two three-GPU rings look alike to
    # colour refinement, but no automorphism carries a GPU of the long ring onto a short one.
    G = nx.DiGraph()
    for ring in (range(6), range(6, 9), range(9, 12)):
        ring = [f"GPU{i}" for i in ring]
        for a, b in zip(ring, ring[1:] + ring[:1]):
            G.add_edge(a, b, cap=25.0)
            G.add_edge(b, a, cap=25.0)
    nx.set_node_attributes(G, "gpu", "kind")
    found = {rep: sorted(g for g, _ in members) for rep, members in orbits(G, list(G))}
    assert sorted(map(len, found.values())) == [6, 6]
    assert sorted(found["GPU0"], key=lambda g: int(g[3:])) == [f"GPU{i}" for i in range(6)]
    for rep, members in orbits(G, list(G)):
        assert all(_is_automorphism(G, carry, list(G)) for _, carry in members)
