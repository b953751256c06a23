"""Draw a topology (and optionally plans on it) to SVG or PNG with matplotlib.

The layout is deterministic so drawings of the same machine compare by eye: GPUs on a circle
(one circle per node of a multi-node topology, ids ``n<k>/...``), NVSwitches and network
switches in the middle, PCIe switches, NICs and CPUs outside at the mean angle of what they
connect. Node shape says the kind, link colour the type, link width the bandwidth.

``highlight`` overlays plans: a list of ``(label, edges, colour)`` where ``edges`` are ``(a, b)``
pairs in the direction data flows and ``colour`` may be None (a palette colour is picked);
``utilization`` maps ``(a, b)`` to a fraction of that link's bandwidth, printed on the link.
``collectx plan --draw`` passes its rings/trees this way.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping

import networkx as nx

from ..errors import ArgumentError, ConfigError
from .model import NODE_KINDS, gpus, natural_key, nodes_of_kind

LINK_COLOURS = {"nvlink": "#76b900", "xgmi": "#d62728", "c2c": "#006d2c", "pcie": "#1f77b4",
                "smp": "#7f7f7f", "net": "#ff7f0e", "shm": "#9467bd"}
NODE_STYLE = {  # kind -> (marker, face colour, size)
    "gpu": ("s", "#2ca02c", 700), "nvswitch": ("D", "#bcbd22", 500),
    "pci_switch": ("^", "#aec7e8", 380), "nic": ("p", "#ffbb78", 380),
    "cpu": ("h", "#c7c7c7", 650), "net_switch": ("v", "#ff9896", 500), "host": ("o", "#dddddd", 500),
}
PALETTE = ("#e41a1c", "#377eb8", "#984ea3", "#ff7f00", "#a65628", "#f781bf", "#17becf", "#4daf4a")
# Radius of each outer kind as a multiple of the GPU circle's radius.
_RING_RADIUS = {"pci_switch": 1.45, "nic": 1.85, "cpu": 2.2, "host": 2.5}

Highlight = tuple[str, Iterable[tuple[str, str]], "str | None"]


def require_matplotlib(path) -> None:
    """Raise ConfigError, with the install hint, when matplotlib (extra ``plot``) is missing.

    Drawing is optional: collectx itself never needs matplotlib, so its absence is reported
    only when a drawing is asked for, as one line instead of an import traceback.
    """
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ConfigError(f"drawing {os.fspath(path)} needs matplotlib, which is not installed: "
                          "pip install 'collectx[plot]' (or pip install matplotlib); "
                          "`collectx plan --html` writes a report without it") from None


def _groups(G: nx.DiGraph) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for g in gpus(G):
        out.setdefault(g.rpartition("/")[0], []).append(g)
    return out


def _on_circle(center, radius, angle):
    return (center[0] + radius * math.cos(angle), center[1] + radius * math.sin(angle))


def layout(G: nx.DiGraph) -> dict[str, tuple[float, float]]:
    """Node positions used by :func:`draw` (deterministic; see the module docstring).

    >>> from collectx.topology import load
    >>> pos = layout(load("dgx1v"))
    >>> len(pos), round(pos["GPU0"][0], 3), round(pos["GPU0"][1], 3)
    (18, 0.0, 1.0)
    """
    groups = _groups(G)
    pos, angle_of = {}, {}
    # Node circles (NICs reach out to 1.85, CPUs 2.2) must not overlap: neighbouring group
    # centres sit ~5.6 apart on the big circle.
    spread = 2.8 / math.sin(math.pi / len(groups)) if len(groups) > 1 else 0.0
    for k, (prefix, members) in enumerate(sorted(groups.items(), key=lambda kv: natural_key(kv[0]))):
        center = _on_circle((0.0, 0.0), spread, math.pi / 2 - 2 * math.pi * k / len(groups))
        for i, g in enumerate(members):
            angle = math.pi / 2 - 2 * math.pi * i / len(members)
            pos[g] = _on_circle(center, 1.0, angle)
            angle_of[g] = (center, angle)
        inner = [n for n in nodes_of_kind(G, "nvswitch") if n.rpartition("/")[0] == prefix]
        for i, n in enumerate(inner):
            pos[n] = _on_circle(center, 0.4 if len(inner) > 1 else 0.0,
                                math.pi / 2 - 2 * math.pi * i / max(1, len(inner)))
            angle_of[n] = (center, None)
    net = nodes_of_kind(G, "net_switch")
    for i, n in enumerate(net):
        pos[n] = ((i - (len(net) - 1) / 2) * 0.6, 0.0)
    for kind in ("pci_switch", "nic", "cpu", "host"):
        _place_outer(G, kind, pos, angle_of)
    rest = [n for n in G if n not in pos]  # unknown kinds go on a far circle
    for i, n in enumerate(rest):
        pos[n] = _on_circle((0.0, 0.0), 3.0, 2 * math.pi * i / len(rest))
    return pos


def _place_outer(G, kind, pos, angle_of) -> None:
    todo = nodes_of_kind(G, kind)
    for i, n in enumerate(todo):
        anchors = [angle_of[m] for m in G.successors(n) if m in angle_of and angle_of[m][1] is not None]
        if anchors:
            center = anchors[0][0]
            x = sum(math.cos(a) for _, a in anchors)
            y = sum(math.sin(a) for _, a in anchors)
            angle = math.atan2(y, x) if abs(x) + abs(y) > 1e-6 else anchors[0][1]
        else:
            center, angle = (0.0, 0.0), math.pi / 2 - 2 * math.pi * i / max(1, len(todo))
        pos[n] = _on_circle(center, _RING_RADIUS[kind], angle)
        angle_of[n] = (center, angle)
    _separate(todo, pos, angle_of)


def _separate(nodes, pos, angle_of, min_gap=0.28) -> None:
    """Nudge nodes of one ring apart along the ring when they landed on the same spot."""
    for i, n in enumerate(nodes):
        for m in nodes[:i]:
            if math.dist(pos[n], pos[m]) < min_gap:
                center, angle = angle_of[n]
                radius = math.dist(center, pos[n])
                angle += min_gap / max(radius, 0.5)
                pos[n] = _on_circle(center, radius, angle)
                angle_of[n] = (center, angle)


def _undirected_links(G: nx.DiGraph):
    seen = set()
    for a, b, data in G.edges(data=True):
        if (b, a) not in seen:
            seen.add((a, b))
            yield a, b, data


def _check_highlight(G: nx.DiGraph, highlight) -> list[tuple[str, list, str]]:
    out = []
    for k, item in enumerate(highlight or ()):
        try:
            label, edges, colour = item
        except (TypeError, ValueError):
            raise ArgumentError(f"highlight[{k}] = {item!r}: expected (label, edges, colour)") from None
        edges = [tuple(e) for e in edges]
        for a, b in edges:
            if a not in G or b not in G:
                raise ArgumentError(f"highlight {label!r} names edge ({a}, {b}) but "
                                    f"{a if a not in G else b!r} is not in the topology")
        out.append((str(label), edges, colour or PALETTE[k % len(PALETTE)]))
    return out


def _draw_links(ax, G, pos, faded: bool) -> None:
    links = list(_undirected_links(G))
    widest = max((d["bw_gbps"] for *_, d in links), default=1.0)
    for a, b, d in links:
        (x0, y0), (x1, y1) = pos[a], pos[b]
        ax.plot([x0, x1], [y0, y1], color=LINK_COLOURS.get(d["type"], "black"),
                lw=0.6 + 5.0 * d["bw_gbps"] / widest, alpha=0.25 if faded else 0.75,
                solid_capstyle="round", zorder=1)


def _draw_overlay(ax, pos, lanes, utilization) -> None:
    for k, (_, edges, colour) in enumerate(lanes):
        shift = 0.035 * (k - (len(lanes) - 1) / 2)  # parallel lanes side by side
        for a, b in edges:
            (x0, y0), (x1, y1) = pos[a], pos[b]
            length = math.hypot(x1 - x0, y1 - y0) or 1.0
            dx, dy = -(y1 - y0) / length * shift, (x1 - x0) / length * shift
            ax.annotate("", xy=(x1 + dx, y1 + dy), xytext=(x0 + dx, y0 + dy), zorder=3,
                        arrowprops=dict(arrowstyle="-|>", color=colour, lw=1.8,
                                        shrinkA=11, shrinkB=11, mutation_scale=12))
    for (a, b), frac in (utilization or {}).items():
        (x0, y0), (x1, y1) = pos[a], pos[b]
        ax.text((2 * x0 + x1) / 3, (2 * y0 + y1) / 3, f"{100 * frac:.0f}%", fontsize=7,
                ha="center", va="center", zorder=4,
                bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.8))


def _draw_nodes(ax, G, pos) -> None:
    n_nodes = G.number_of_nodes()
    scale = 1.0 if n_nodes <= 40 else max(0.35, 40 / n_nodes)
    font = 8 if n_nodes <= 40 else 6
    for kind in NODE_KINDS:
        members = nodes_of_kind(G, kind)
        if not members:
            continue
        marker, face, size = NODE_STYLE[kind]
        ax.scatter([pos[n][0] for n in members], [pos[n][1] for n in members], marker=marker,
                   s=size * scale, c=face, edgecolors="black", linewidths=0.8, zorder=2)
        for n in members:
            ax.text(pos[n][0], pos[n][1], n.rpartition("/")[2], fontsize=font,
                    ha="center", va="center", zorder=5)


def _legend(ax, G, lanes) -> None:
    from matplotlib.lines import Line2D
    handles = [Line2D([], [], marker=NODE_STYLE[k][0], ls="", markerfacecolor=NODE_STYLE[k][1],
                      markeredgecolor="black", markersize=9, label=k)
               for k in NODE_KINDS if nodes_of_kind(G, k)]
    types = sorted({d["type"] for *_, d in G.edges(data=True)})
    handles += [Line2D([], [], color=LINK_COLOURS[t], lw=3, label=t) for t in types]
    handles += [Line2D([], [], color=c, lw=2, marker=">", label=label) for label, _, c in lanes]
    widest = max((d["bw_gbps"] for *_, d in G.edges(data=True)), default=0.0)
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8,
              frameon=False, title=f"link width ∝ GB/s\n(widest {widest:g} GB/s)",
              title_fontsize=8)


def draw(G: nx.DiGraph, path: str | os.PathLike, highlight: list[Highlight] | None = None,
         utilization: Mapping[tuple[str, str], float] | None = None,
         title: str | None = None) -> str:
    """Draw ``G`` to ``path`` (format from its extension: .svg, .png, .pdf).

    Parameters
    ----------
    G : nx.DiGraph
        The topology.
    path : str or os.PathLike
        Output file.
    highlight : list of (label, edges, colour), optional
        Plans to overlay: ``edges`` are directed ``(a, b)`` pairs, ``colour`` a matplotlib
        colour or None for the next palette colour. The topology is faded underneath.
    utilization : mapping of (a, b) to float, optional
        Fraction of each link's bandwidth in use, printed on the link.
    title : str, optional
        Figure title (default: the topology's name).

    Returns
    -------
    str
        ``path``, for chaining.

    Raises
    ------
    ArgumentError
        A highlight that is not (label, edges, colour) or names unknown nodes.
    ConfigError
        When matplotlib is not installed.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> from collectx.topology import ring
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "ring.svg"
    >>> _ = draw(ring(4), out, highlight=[("ring 0", [("GPU0", "GPU1"), ("GPU1", "GPU2")], None)])
    >>> out.read_text().startswith("<?xml")
    True
    """
    require_matplotlib(path)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    lanes = _check_highlight(G, highlight)
    pos = layout(G)
    fig = Figure(figsize=(9.5, 7.5))
    FigureCanvasAgg(fig)  # Agg canvas without pyplot: no global backend state is touched
    ax = fig.add_subplot(1, 1, 1)
    _draw_links(ax, G, pos, faded=bool(lanes))
    _draw_overlay(ax, pos, lanes, utilization)
    _draw_nodes(ax, G, pos)
    for prefix, members in _groups(G).items():
        if prefix:  # name each node of a multi-node topology above its GPU circle
            x = sum(pos[g][0] for g in members) / len(members)
            y = max(pos[g][1] for g in members)
            ax.text(x, y + 1.15, prefix, fontsize=10, ha="center", weight="bold")
    _legend(ax, G, lanes)
    ax.set_title(title or G.graph.get("name", "topology"), fontsize=11, pad=16)
    ax.set_aspect("equal")
    ax.axis("off")
    fig.tight_layout()
    fig.savefig(os.fspath(path), dpi=110)
    return os.fspath(path)
