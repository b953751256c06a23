"""Drawing: deterministic layout, files written, highlight validation."""

import pytest

import collectx.topology as topo
from collectx.errors import ArgumentError
from collectx.topology.draw import draw, layout


def test_layout_is_deterministic_and_places_every_node():
    G = topo.load("dgx1v")
    first, second = layout(G), layout(topo.load("dgx1v"))
    assert first == second and set(first) == set(G)
    gpu_radius = {round((x * x + y * y) ** 0.5, 6) for n, (x, y) in first.items() if n.startswith("GPU")}
    assert gpu_radius == {1.0}
    assert all((x * x + y * y) ** 0.5 > 1.2 for n, (x, y) in first.items()
               if G.nodes[n]["kind"] in ("cpu", "nic", "pci_switch"))


def test_multi_node_groups_do_not_overlap():
    pos = layout(topo.multi_node("dgx1v", 3, nic_bw=12.5))
    centres = []
    for k in range(3):
        xs = [pos[f"n{k}/GPU{i}"] for i in range(8)]
        centres.append((sum(x for x, _ in xs) / 8, sum(y for _, y in xs) / 8))
    gaps = [((a[0] - b[0]) ** 2 + (a[1] - b[1]) ** 2) ** 0.5 for a in centres for b in centres if a != b]
    assert min(gaps) > 4.5


@pytest.mark.parametrize("suffix, magic", [(".png", b"\x89PNG"), (".svg", b"<?xml")])
def test_draw_writes_the_requested_format(tmp_path, suffix, magic):
    out = tmp_path / f"dgx2{suffix}"
    draw(topo.load("dgx2"), out)
    assert out.read_bytes()[:len(magic)] == magic


def test_highlight_and_utilisation_overlay(tmp_path):
    ring = [("GPU0", "GPU3"), ("GPU3", "GPU2"), ("GPU2", "GPU1"), ("GPU1", "GPU0")]
    out = draw(topo.load("dgx1v"), tmp_path / "ring.svg", highlight=[("ring 0", ring, "red")],
               utilization={("GPU0", "GPU3"): 0.5}, title="one ring")
    text = open(out).read()
    assert "one ring" in text and "50%" in text and "ring 0" in text


def test_bad_highlight_is_rejected(tmp_path):
    with pytest.raises(ArgumentError, match="GPU9"):
        draw(topo.ring(4), tmp_path / "x.png", highlight=[("r", [("GPU0", "GPU9")], None)])
    with pytest.raises(ArgumentError, match="expected \\(label, edges, colour\\)"):
        draw(topo.ring(4), tmp_path / "x.png", highlight=[("r", [])])
