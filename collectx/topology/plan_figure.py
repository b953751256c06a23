"""One figure of a plan: how busy each link is, and each distinct tree or ring on its own.

Left, the *link-load panel*: the allocation's topology in :func:`~collectx.topology.draw.layout`
positions, each link coloured by the load of its busier direction (pale to dark blue), its width
by bandwidth, its style by type (PCIe dashed, socket links dotted), and the bottleneck links, the
ones that bound the plan, thick and red with their percentage. Right, *small multiples*: one
panel per distinct tree or ring, GPUs in the same positions in every panel so shapes compare by
eye, the root marked, edges staged through host memory dashed orange.

Everything comes in as plain data (edges, loads, titles), so the topology package stays below
the planner; ``collectx plan --draw`` builds that data with :mod:`collectx.cli.plan_view`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence

import networkx as nx

from .draw import _draw_nodes, layout, require_matplotlib
from .linkload import BOTTLENECK_COLOUR, IDLE_COLOUR, link_marks, load_colour, percent
from .model import gpus

TREE_COLOUR = "#08519c"
HOST_COLOUR = "#e6550d"
ROOT_FACE = "#fdae6b"
LINK_STYLE = {"pcie": "--", "smp": ":", "net": "-.", "shm": ":"}  # others (NVLink, xGMI, C2C) solid
Panel = tuple[str, Sequence[tuple[str, str]], Sequence[tuple[str, str]], "str | None"]


def _load_panel(ax, G, pos, loads, bottleneck) -> None:
    """Links by load, bottleneck links red, labels where :func:`.link_marks` puts them."""
    marks = link_marks(G, pos, loads, bottleneck)
    widest = max((m.data["bw_gbps"] for m in marks), default=1.0)
    for m in marks:
        (x0, y0), (x1, y1) = pos[m.a], pos[m.b]
        width = 1.2 + 4.0 * m.data["bw_gbps"] / widest + (2.0 if m.hot else 0.0)
        ax.plot([x0, x1], [y0, y1], color=BOTTLENECK_COLOUR if m.hot else load_colour(m.load),
                lw=width, ls=LINK_STYLE.get(m.data["type"], "-"), solid_capstyle="round",
                zorder=1.5 if m.hot else 1 + 0.4 * m.load)
        if m.label_at:
            ax.text(*m.label_at, percent(m.load), fontsize=8 if m.hot else 7,
                    color=BOTTLENECK_COLOUR if m.hot else "#333333",
                    weight="bold" if m.hot else "normal", ha="center", va="center", zorder=4,
                    bbox=dict(boxstyle="round,pad=0.12", fc="white", ec="none", alpha=0.85))
    _draw_nodes(ax, G, pos)
    ax.set_aspect("equal")
    ax.axis("off")


def _load_legend(ax, G) -> None:
    from matplotlib.lines import Line2D
    handles = [Line2D([], [], color=BOTTLENECK_COLOUR, lw=5, label="bottleneck")]
    handles += [Line2D([], [], color=load_colour(f), lw=3, label=f"{100 * f:.0f}% busy")
                for f in (1.0, 0.75, 0.5, 0.25)]
    handles.append(Line2D([], [], color=IDLE_COLOUR, lw=3, label="idle"))
    types = sorted({d["type"] for *_, d in G.edges(data=True)})
    handles += [Line2D([], [], color="#555555", lw=1.5, ls=LINK_STYLE.get(t, "-"), label=t)
                for t in types]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.0, 1.0), fontsize=7,
              frameon=False, handlelength=2.5)


def _arrow(ax, start, end, colour, dashed: bool, shrink: float) -> None:
    ax.annotate("", xy=end, xytext=start, zorder=3,
                arrowprops=dict(arrowstyle="-|>", color=colour, lw=1.6 if dashed else 1.4,
                                ls=(0, (3, 2)) if dashed else "-", shrinkA=shrink,
                                shrinkB=shrink, mutation_scale=9))


def _small_panel(ax, G, pos, panel: Panel, marker_size: float) -> None:
    """One tree/ring over faint GPU-to-GPU links; every panel uses the same ``pos``."""
    title, edges, dashed, root = panel
    dashed = {tuple(e) for e in dashed}
    ranks = gpus(G)
    for a, b in G.edges():
        if a < b and a in ranks and b in ranks:
            ax.plot(*zip(pos[a], pos[b]), color="#e5e5e5", lw=1.0, zorder=1)
    shrink = math.sqrt(marker_size) / 2 + 1
    for a, b in edges:
        staged = (a, b) in dashed
        _arrow(ax, pos[a], pos[b], HOST_COLOUR if staged else TREE_COLOUR, staged, shrink)
    ax.scatter([pos[g][0] for g in ranks], [pos[g][1] for g in ranks], marker="s",
               s=marker_size, zorder=2, linewidths=0.8, edgecolors="black",
               c=[ROOT_FACE if g == root else "#c7e9c0" for g in ranks])
    for g in ranks:
        ax.text(*pos[g], _short(g), fontsize=6 if len(ranks) > 8 else 7, ha="center",
                va="center", zorder=5)
    ax.set_title(title, fontsize=7.5, pad=2)
    ax.set_aspect("equal")
    ax.margins(0.12)
    ax.axis("off")


def _panel_key(panels: Sequence[Panel]) -> str:
    """What the small panels' marks mean."""
    key = "blue arrow = copy over a link"
    if any(root for *_, root in panels):
        key += ", orange square = root"
    if any(dashed for _, _, dashed, _ in panels):
        key += ", dashed orange = staged through host memory"
    return key


def _short(node: str) -> str:
    """A node's number, so its label fits a small panel's marker.

    >>> _short("GPU12"), _short("n1/GPU3"), _short("CPU")
    ('12', '1/3', 'CPU')
    """
    prefix, _, name = node.rpartition("/")
    digits = name.lstrip("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
    return (prefix.lstrip("n") + "/" if prefix else "") + (digits or name)


def _grid(n: int) -> tuple[int, int]:
    """Columns and rows of the small multiples for ``n`` panels.

    >>> _grid(1), _grid(5), _grid(12)
    ((1, 1), (3, 2), (4, 3))
    """
    cols = 1 if n <= 1 else 2 if n <= 4 else 3 if n <= 9 else 4
    return cols, math.ceil(n / cols)


def draw_plan(G: nx.DiGraph, path: str | os.PathLike, *, loads: Mapping[tuple[str, str], float],
              bottleneck: Sequence[tuple[tuple[str, str], float]], panels: Sequence[Panel],
              title: str, caption: str, panels_title: str = "") -> str:
    """Draw a plan's link loads and its distinct trees/rings to ``path`` (.png, .svg, .pdf).

    Parameters
    ----------
    G : nx.DiGraph
        The allocation's topology (GPUs of other jobs removed).
    path : str or os.PathLike
        Output file; its extension picks the format.
    loads : mapping of (a, b) to float
        Fraction of each directed link's bandwidth in use.
    bottleneck : sequence of ((a, b), float)
        The links to draw as the bottleneck (see :func:`.linkload.bottleneck_links`).
    panels : sequence of (title, edges, dashed_edges, root)
        One small panel each: directed GPU-to-GPU edges, the ones to draw dashed (staged
        through host memory), and the node to mark as root (or None).
    title, caption : str
        The figure's title and the line under the load panel (the bottleneck).
    panels_title : str
        The line over the small panels (what they are, how many are not drawn).

    Returns
    -------
    str
        ``path``.

    Raises
    ------
    ConfigError
        When matplotlib is not installed.
    """
    require_matplotlib(path)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    pos = layout(G)
    cols, rows = _grid(len(panels))
    fig = Figure(figsize=(7.5 + (2.4 * cols if panels else 0), max(6.8, 2.4 * rows + 1.3)))
    FigureCanvasAgg(fig)  # Agg canvas without pyplot: no global backend state is touched
    outer = fig.add_gridspec(1, 2 if panels else 1, width_ratios=[7.5, 2.4 * cols] if panels
                             else None, left=0.01, right=0.99, top=0.86, bottom=0.07, wspace=0.04)
    ax = fig.add_subplot(outer[0, 0])
    _load_panel(ax, G, pos, loads, bottleneck)
    _load_legend(ax, G)
    ax.set_title("link load (colour: busier direction; width: bandwidth)", fontsize=9)
    fig.text(0.01, 0.025, caption, fontsize=10, color=BOTTLENECK_COLOUR, weight="bold")
    if panels:
        _small_multiples(fig, outer[0, 1], G, pos, panels, panels_title)
    fig.suptitle(title, fontsize=11)
    # About 1400 pixels wide whatever the panel count: legible, and a PNG of a few 100 KB.
    fig.savefig(os.fspath(path), dpi=min(100, 1400 / fig.get_figwidth()))
    return os.fspath(path)


def _small_multiples(fig, area, G, pos, panels, panels_title) -> None:
    cols, rows = _grid(len(panels))
    grid = area.subgridspec(rows, cols, hspace=0.22, wspace=0.06)
    size = 170 if len(gpus(G)) <= 8 else 110
    for k, panel in enumerate(panels):
        _small_panel(fig.add_subplot(grid[k // cols, k % cols]), G, pos, panel, size)
    box = area.get_position(fig)
    fig.text((box.x0 + box.x1) / 2, box.y1 + 0.055, panels_title, fontsize=9, ha="center",
             va="bottom", weight="bold")
    fig.text((box.x0 + box.x1) / 2, box.y1 + 0.03, _panel_key(panels), fontsize=8,
             ha="center", va="bottom")
