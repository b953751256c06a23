"""``collectx plan --draw`` / ``--html``: distinct trees with counts, the bottleneck link, files."""

import re
import sys

import pytest

from collectx.cli.main import main
from collectx.cli.plan_view import (PlanView, distinct_structures, figure_panels, plan_view,
                                    schedule_items)
from collectx.errors import ConfigError
from collectx.topology import load
from collectx.topology.linkload import bottleneck_caption, bottleneck_links, link_marks

try:
    import matplotlib  # noqa: F401
    HAVE_MATPLOTLIB = True
except ImportError:
    HAVE_MATPLOTLIB = False
needs_matplotlib = pytest.mark.skipif(not HAVE_MATPLOTLIB,
                                      reason="needs matplotlib: pip install matplotlib")

# A 4-GPU DGX-1V allgather plans in about a second, and its forest has a tree twice and edges
# staged through host memory: everything the drawings fold and mark.
ALLGATHER_4 = ["plan", "dgx1v", "-c", "allgather", "--gpus", "0,1,2,5", "--size", "64M"]


@pytest.fixture(scope="module")
def allgather_plan():
    from collectx.planner import plan
    G = load("dgx1v")
    return G, plan(G, "allgather", 64 << 20, gpus=[0, 1, 2, 5])


def test_identical_trees_fold_whatever_their_edge_order():
    a = [("GPU1", "GPU0"), ("GPU1", "GPU2"), ("GPU2", "GPU5")]
    items = [("tree", a, (), 10), ("tree", list(reversed(a)), (), 20),
             ("tree", [a[1], a[2], a[0]], (), 30),
             ("tree", a, [("GPU2", "GPU5")], 5),           # same edges, one staged: different
             ("tree", [("GPU0", "GPU1"), ("GPU0", "GPU2"), ("GPU0", "GPU5")], (), 40)]
    folded = distinct_structures(items)
    assert [(s.count, s.members, s.chunks) for s in folded] == [
        (3, (0, 1, 2), 60), (1, (4,), 40), (1, (3,), 5)]
    assert folded[0].root == "GPU1" and folded[1].root == "GPU0"
    assert folded[2].host_edges == (("GPU2", "GPU5"),)
    assert "GPU2>GPU5 via host" in folded[2].edge_text()


def test_rings_fold_whatever_node_they_start_from():
    ring = ["GPU0", "GPU1", "GPU2", "GPU3"]
    meta = {"rings": [(tuple(ring), 25.0, 0, 4), (tuple(ring[2:] + ring[:2]), 25.0, 4, 4),
                      (tuple(reversed(ring)), 25.0, 8, 4)]}
    folded = distinct_structures(schedule_items(meta, tuple(ring)))
    assert [(s.kind, s.count, s.chunks) for s in folded] == [("ring", 2, 8), ("ring", 1, 4)]
    assert folded[0].edge_text() == "GPU0 > GPU1 > GPU2 > GPU3 > GPU0"
    assert folded[0].root is None


def test_packed_tree_records_give_edges_staging_and_chunks():
    ranks = ("GPU0", "GPU1", "GPU2", "GPU5")
    meta = {"trees": [("allgather", 0, ((0, 2), (2, 1), (1, 3)), 0, 174),
                      ("allgather", 0, ((1, 3), (0, 1), (1, 2)), 174, 82, "host", ((1, 3),)),
                      ("allgather", 0, ((0, 1), (1, 2), (1, 3)), 256, 10, "host", ((1, 3),)),
                      (-1, 0, 1, 1)]}  # a parent array: no chunk count
    items = schedule_items(meta, ranks)
    assert items[1] == ("tree", [("GPU1", "GPU5"), ("GPU0", "GPU1"), ("GPU1", "GPU2")],
                        [("GPU1", "GPU5")], 82, "allgather")
    folded = distinct_structures(items)
    assert [s.count for s in folded] == [2, 1, 1]
    assert folded[0].chunks == 92 and folded[0].tag == "allgather"
    assert folded[-1].chunks is None and folded[-1].edges == (("GPU0", "GPU1"), ("GPU1", "GPU2"),
                                                              ("GPU1", "GPU5"))


def test_bottleneck_is_the_busiest_link_and_its_close_peers():
    loads = {("GPU1", "GPU5"): 0.981, ("GPU5", "GPU1"): 0.976, ("GPU0", "GPU1"): 0.95,
             ("PLX0", "CPU0"): 0.30, ("CPU0", "PLX0"): 0.0}
    busiest = bottleneck_links(loads)
    assert busiest == [(("GPU1", "GPU5"), 0.981), (("GPU5", "GPU1"), 0.976)]
    assert bottleneck_caption(busiest) == "bottleneck: GPU1<->GPU5 98%"
    # A host path can be the bottleneck as well as an NVLink.
    host = bottleneck_links({("GPU0", "PLX0"): 0.91, ("PLX0", "CPU0"): 0.99, ("GPU0", "GPU1"): 0.5})
    assert host == [(("PLX0", "CPU0"), 0.99)]
    assert bottleneck_links({}) == [] and bottleneck_links({("A", "B"): 0.0}) == []


def test_plan_view_names_the_simulators_busiest_link(allgather_plan):
    G, p = allgather_plan
    view = plan_view(G, p)
    util = p.predicted.link_util
    top = max(util, key=util.get)
    assert top in {link for link, _ in view.bottleneck}
    assert all(round(100 * f) >= round(100 * util[top]) - 1 for _, f in view.bottleneck)
    assert view.caption.startswith("bottleneck: ") and top[0] in view.caption
    overlays_in_schedule = len(p.schedule.meta_dict()["trees"])
    assert sum(s.count for s in view.structures) == overlays_in_schedule
    assert len(view.structures) < overlays_in_schedule  # this forest repeats a tree
    assert any(s.host_edges for s in view.structures)


def test_labels_name_only_the_first_bottleneck_links():
    from collectx.topology import ring
    G = ring(8)
    pos = {f"GPU{i}": (float(i), float(i % 2)) for i in range(8)}
    loads = {(a, b): 1.0 for a, b in G.edges()}
    marks = link_marks(G, pos, loads, bottleneck_links(loads), named=4)
    assert all(m.hot for m in marks) and sum(m.label_at is not None for m in marks) == 4


def test_panels_are_capped_and_the_rest_counted():
    items = [("tree", [(f"GPU{k}", "GPUx"), (f"GPU{k}", "GPUy")], (), 1) for k in range(20)]
    view = PlanView(None, (), "", "", {}, (), "", tuple(distinct_structures(items)))
    panels, heading = figure_panels(view, limit=12)
    assert len(panels) == 12 and heading.startswith("20 trees, 20 distinct")
    assert "8 more" in heading


@needs_matplotlib
@pytest.mark.parametrize("suffix, magic", [(".png", b"\x89PNG"), (".svg", b"<?xml")])
def test_draw_writes_one_figure(tmp_path, capsys, suffix, magic):
    out = tmp_path / f"plan{suffix}"
    assert main([*ALLGATHER_4, "--draw", str(out)]) == 0
    data = out.read_bytes()
    assert data[:len(magic)] == magic and len(data) > 10_000
    assert f"Drawing written to {out}" in capsys.readouterr().out
    if suffix == ".svg":
        text = data.decode()
        assert "bottleneck: " in text and "root GPU" in text and "distinct" in text


def test_draw_without_matplotlib_is_one_line_with_the_install_hint(tmp_path, capsys,
                                                                   monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails
    assert main([*ALLGATHER_4, "--draw", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "matplotlib" in err and "pip install" in err
    from collectx.topology.draw import draw
    with pytest.raises(ConfigError, match="collectx\\[plot\\]"):
        draw(load("dgx1v"), tmp_path / "topo.png")


def test_html_lists_each_distinct_tree_with_its_edges(tmp_path, capsys, monkeypatch,
                                                       allgather_plan):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # the report must not need it
    out = tmp_path / "plan.html"
    assert main([*ALLGATHER_4, "--html", str(out)]) == 0
    assert f"HTML report written to {out}" in capsys.readouterr().out
    page = out.read_text()
    entries = re.findall(r'<li class="structure"[^>]*data-id="(\d+)"[^>]*'
                         r'data-count="(\d+)" data-edges="([^"]*)"', page)
    expected = plan_view(*allgather_plan).structures
    assert len(entries) == len(expected)
    for (k, count, edges), s in zip(entries, expected):
        assert int(count) == s.count
        assert edges.split() == [f"{a}&gt;{b}" for a, b in s.edges]
        group = re.search(rf'<g class="structure" data-id="{k}">(.*?)</g>', page).group(1)
        assert group.count("<line") == len(s.edges)
    assert "<svg" in page and "<script>" in page and "bottleneck: " in page
    assert "collective   allgather" in page  # the summary collectx plan prints
    assert not re.search(r'(src|href)="(https?:)?//', page)  # self-contained: nothing fetched
