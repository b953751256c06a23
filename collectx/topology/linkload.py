"""How busy each link of a topology is under a plan: the bottleneck, its caption, load colours.

A *load* is the fraction of a directed link's bandwidth that a plan keeps busy, as the simulator
reports it (``SimResult.link_util``: ``(a, b) -> fraction``). The links whose load is within a
percentage point of the highest one are the *bottleneck*: they are what bounds the plan, so drawings
(:mod:`collectx.topology.plan_figure`, ``collectx plan --html``) make them stand out. Everything
here is plain data, without matplotlib, so the figure and the HTML report colour links alike.

>>> loads = {("GPU1", "GPU5"): 0.98, ("GPU5", "GPU1"): 0.974, ("GPU0", "GPU1"): 0.5}
>>> bottleneck_caption(bottleneck_links(loads))
'bottleneck: GPU1<->GPU5 98%'
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import networkx as nx

BOTTLENECK_COLOUR = "#d62728"
IDLE_COLOUR = "#d9d9d9"
# Loads from 0 to 1 run from a pale to a dark blue, so red stays the bottleneck's own colour.
_LOAD_RAMP = ((0.0, (0xc6, 0xdb, 0xef)), (0.5, (0x42, 0x92, 0xc6)), (1.0, (0x08, 0x30, 0x6b)))

Link = tuple[str, str]


def bottleneck_links(loads: Mapping[Link, float], points: int = 1) -> list[tuple[Link, float]]:
    """The directed links as busy as the busiest, give or take ``points`` percent, busiest first.

    Links a point apart bound the plan equally in all but rounding, so all of them are named
    rather than one picked by noise. The test is on loads rounded to whole percents, as they
    are printed, so two links labelled alike are never told apart by colour. Below 1% (a
    latency-bound plan) only links within 1% of the busiest one's load count.

    Parameters
    ----------
    loads : mapping of (a, b) to float
        Fraction of each directed link's bandwidth in use.
    points : int
        How many percentage points below the busiest a link may be and still count.

    Returns
    -------
    list of ((a, b), load)
        Empty when nothing is loaded; ties sorted by name so the order is stable.

    >>> bottleneck_links({("A", "B"): 0.2, ("B", "C"): 0.9, ("C", "A"): 0.886, ("A", "C"): 0.88})
    [(('B', 'C'), 0.9), (('C', 'A'), 0.886)]
    >>> bottleneck_links({("A", "B"): 0.0})
    []
    """
    top = max(loads.values(), default=0.0)
    if top <= 0.0:
        return []
    if top >= 0.01:
        busy = [(tuple(k), f) for k, f in loads.items() if round(100 * f) >= round(100 * top) - points]
    else:
        busy = [(tuple(k), f) for k, f in loads.items() if f >= 0.99 * top]
    return sorted(busy, key=lambda item: (-item[1], item[0]))


def percent(frac: float) -> str:
    """A load as printed on drawings: whole percents, ``<1%`` for a trickle.

    >>> percent(0.984), percent(0.001), percent(0.0)
    ('98%', '<1%', '0%')
    """
    return "<1%" if frac > 0.0 and round(100 * frac) == 0 else f"{100 * frac:.0f}%"


def bottleneck_caption(links: list[tuple[Link, float]], limit: int = 4) -> str:
    """One line naming the bottleneck links; both directions of one link are written ``a<->b``.

    >>> bottleneck_caption([(("GPU1", "GPU5"), 0.981)])
    'bottleneck: GPU1->GPU5 98%'
    >>> links = [((f"G{i}", f"G{i + 1}"), 0.99) for i in range(6)]
    >>> bottleneck_caption(links, limit=2)
    'bottleneck: G0->G1 99%, G1->G2 99% and 4 more links at 99%'
    >>> bottleneck_caption([])
    'bottleneck: none (no link carries data)'
    """
    if not links:
        return "bottleneck: none (no link carries data)"
    load = dict(links)
    names, done = [], set()
    for (a, b), frac in links:
        if (a, b) in done:
            continue
        both = (b, a) in load
        done.update({(a, b), (b, a)} if both else {(a, b)})
        names.append((f"{a}<->{b}" if both else f"{a}->{b}", max(frac, load.get((b, a), 0.0))))
    shown = ", ".join(f"{name} {percent(frac)}" for name, frac in names[:limit])
    rest = len(names) - limit
    return f"bottleneck: {shown}" + (f" and {rest} more links at {percent(names[limit][1])}"
                                     if rest > 0 else "")


def undirected_loads(G: nx.DiGraph, loads: Mapping[Link, float]):
    """``(a, b, data, load a->b, load b->a)`` once per link of ``G``, both directions together.

    >>> from collectx.topology import line
    >>> [(a, b, ab, ba) for a, b, _, ab, ba in undirected_loads(line(2), {("GPU1", "GPU0"): 0.5})]
    [('GPU0', 'GPU1', 0.0, 0.5)]
    """
    seen = set()
    for a, b, data in G.edges(data=True):
        if (b, a) in seen:
            continue
        seen.add((a, b))
        yield a, b, data, float(loads.get((a, b), 0.0)), float(loads.get((b, a), 0.0))


def load_colour(frac: float) -> str:
    """Hex colour of a link carrying ``frac`` of its bandwidth (grey when idle).

    >>> load_colour(0.0), load_colour(1.0), load_colour(0.5)
    ('#d9d9d9', '#08306b', '#4292c6')
    """
    if frac <= 0.0:
        return IDLE_COLOUR
    frac = min(frac, 1.0)
    for (x0, c0), (x1, c1) in zip(_LOAD_RAMP, _LOAD_RAMP[1:]):
        if frac <= x1:
            t = (frac - x0) / (x1 - x0)
            return "#" + "".join(f"{round(u + t * (v - u)):02x}" for u, v in zip(c0, c1))
    return "#%02x%02x%02x" % _LOAD_RAMP[-1][1]


# Half widths and heights, in layout units (a GPU circle has radius 1), of what a label must
# not cover: a node's marker, another "100%" label.
NODE_BOX, LABEL_BOX = (0.17, 0.13), (0.21, 0.07)


def label_spot(p0, p1, taken, crowded_ok: bool = False):
    """The point along p0-p1, nearest the middle, whose label covers nothing ``taken``.

    ``taken`` holds ``(x, y, (half width, half height))`` boxes in layout units.

    Links of a circular layout cross at the centre, and a link between two outer nodes may
    pass over a GPU, so the plain midpoint would put labels on each other or on a node. When
    every spot is covered: None, or with ``crowded_ok`` the least covered one.

    >>> label_spot((0, 0), (2, 0), [])
    (1.0, 0.0)
    >>> label_spot((0, 0), (2, 0), [(1.0, 0.0, LABEL_BOX)])
    (0.5, 0.0)
    """
    best, best_overlap = None, math.inf
    for t in (0.5, 0.4, 0.6, 0.32, 0.68, 0.25, 0.75):
        x, y = p0[0] + t * (p1[0] - p0[0]), p0[1] + t * (p1[1] - p0[1])
        overlap = sum(_overlap((x, y), LABEL_BOX, (qx, qy), box) for qx, qy, box in taken)
        if overlap == 0.0:
            return (x, y)
        if overlap < best_overlap:
            best, best_overlap = (x, y), overlap
    return best if crowded_ok else None


def _overlap(c0, half0, c1, half1) -> float:
    """Area shared by two axis-aligned boxes given by centre and half extents."""
    w = half0[0] + half1[0] - abs(c0[0] - c1[0])
    h = half0[1] + half1[1] - abs(c0[1] - c1[1])
    return w * h if w > 0 and h > 0 else 0.0


@dataclass(frozen=True, slots=True)
class LinkMark:
    """How to draw one link: its ends and data, the busier direction's load, whether it is a
    bottleneck link, and where its percentage goes (None: no label)."""

    a: str
    b: str
    data: dict
    load: float
    hot: bool
    label_at: tuple[float, float] | None


def link_marks(G: nx.DiGraph, pos: Mapping[str, tuple[float, float]], loads: Mapping[Link, float],
               bottleneck: Sequence[tuple[Link, float]], named: int = 4) -> list[LinkMark]:
    """One :class:`LinkMark` per link of ``G``, the labelled bottleneck links first.

    The first ``named`` bottleneck links (those :func:`bottleneck_caption` names) carry their
    percentage: on a plan that saturates sixteen links, sixteen "100%" labels would only bury
    the picture, and the caption counts the rest. Other links above 1% carry theirs where it
    fits, or, where nothing fits, when no label shows the same number yet. Positions are in
    ``pos`` units, so a figure and a page place labels alike.

    >>> from collectx.topology import line
    >>> G = line(3)
    >>> pos = {"GPU0": (0.0, 0.0), "GPU1": (2.0, 0.0), "GPU2": (4.0, 0.0)}
    >>> loads = {("GPU0", "GPU1"): 0.9, ("GPU1", "GPU2"): 0.3}
    >>> [(m.a, m.b, m.hot, m.label_at) for m in link_marks(G, pos, loads, bottleneck_links(loads))]
    [('GPU0', 'GPU1', True, (1.0, 0.0)), ('GPU1', 'GPU2', False, (3.0, 0.0))]
    """
    busiest = {tuple(link) for link, _ in bottleneck}
    labelled = _first_pairs(bottleneck, named)
    taken = [(x, y, NODE_BOX) for x, y in pos.values()]
    shown: set[str] = set()
    marks = []
    # Bottleneck labels are placed first, so they get the best spots.
    for a, b, d, ab, ba in sorted(undirected_loads(G, loads),
                                  key=lambda l: frozenset(l[:2]) not in labelled):
        frac, hot = max(ab, ba), (a, b) in busiest or (b, a) in busiest
        spot = None
        if frac >= 0.01 and (not hot or frozenset((a, b)) in labelled):
            spot = label_spot(pos[a], pos[b], taken)
            if spot is None and (hot or percent(frac) not in shown):
                spot = label_spot(pos[a], pos[b], taken, crowded_ok=True)
            if spot is not None:
                taken.append((*spot, LABEL_BOX))
                shown.add(percent(frac))
        marks.append(LinkMark(a, b, d, frac, hot, spot))
    return marks


def _first_pairs(bottleneck, n: int) -> set[frozenset]:
    """The first ``n`` links of ``bottleneck``, both directions of a link counting once."""
    pairs: list[frozenset] = []
    for (a, b), _ in bottleneck:
        if frozenset((a, b)) not in pairs:
            pairs.append(frozenset((a, b)))
    return set(pairs[:n])
