"""What a drawing of a plan shows, as plain data: distinct trees/rings, link loads, headline.

Packed-tree planners emit many trees, most of them copies carrying different chunks (a 4-GPU
DGX-1V allreduce has 20 trees but 5 shapes), so a picture per tree hides the plan. This module
folds identical trees and rings into one :class:`Structure` with a count, orders them most
frequent first, and gathers the rest of what ``collectx plan --draw`` and ``--html`` show; the
drawing itself lives in :mod:`collectx.topology.plan_figure` and :mod:`.plan_report`.

>>> items = [("tree", (("GPU1", "GPU0"), ("GPU1", "GPU2")), (), None),
...          ("tree", (("GPU1", "GPU2"), ("GPU1", "GPU0")), (), None),
...          ("tree", (("GPU0", "GPU1"), ("GPU0", "GPU2")), (("GPU0", "GPU2"),), None)]
>>> [(s.count, s.root, s.members) for s in distinct_structures(items)]
[(2, 'GPU1', (0, 1)), (1, 'GPU0', (2,))]
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from ..topology import subset
from ..topology.linkload import bottleneck_caption, bottleneck_links
from ..topology.model import natural_key
from .plan import _bytes, _host_edges, _tree_edges, format_plan

Edge = tuple[str, str]


@dataclass(frozen=True, slots=True)
class Structure:
    """One distinct ring or tree of a plan and how many of the schedule's copies share it.

    ``edges`` are directed in the way data flows, sorted; ``host_edges`` the subset staged
    through host memory; ``members`` the indices (``ring k`` / ``tree k`` of ``collectx plan``)
    of the copies; ``chunks`` how many chunks they carry together (None when the schedule's
    record does not say); ``tag`` what the planner wrote beside the tree (e.g. "allgather").
    """

    kind: str
    edges: tuple[Edge, ...]
    host_edges: tuple[Edge, ...]
    members: tuple[int, ...]
    chunks: int | None
    tag: str = ""

    @property
    def count(self) -> int:
        return len(self.members)

    @property
    def root(self) -> str | None:
        """The one node that sends but never receives (None for a ring)."""
        heads = {b for _, b in self.edges}
        roots = sorted({a for a, _ in self.edges} - heads)
        return roots[0] if len(roots) == 1 else None

    def title(self, total_chunks: int | None = None, kind: bool = True) -> str:
        """Short panel title, e.g. ``tree x8, root GPU1, 40% of chunks`` (``kind=False``:
        without "tree", for panels whose heading already says it)."""
        name = f"{self.tag} {self.kind}" if self.tag else self.kind
        parts = [f"{name + ' ' if kind else ''}x{self.count}"]
        if self.root:
            parts.append(f"root {self.root}")
        if self.chunks is not None and total_chunks:
            parts.append(f"{100 * self.chunks / total_chunks:.0f}% of chunks")
        return ", ".join(parts)

    def edge_text(self) -> str:
        """A ring as ``a > b > c > a``; a tree as ``a>b`` for each edge, with ``via host``
        after the staged ones (as ``collectx plan`` prints them)."""
        if self.kind == "ring":
            return " > ".join(_cycle(self.edges))
        staged = set(self.host_edges)
        return ", ".join(f"{a}>{b}{' via host' if (a, b) in staged else ''}" for a, b in self.edges)


@dataclass(frozen=True, slots=True)
class PlanView:
    """Everything a plan drawing shows, without the plan's schedule."""

    topology: object  # nx.DiGraph of the allocation (other GPUs removed)
    ranks: tuple[str, ...]
    title: str
    summary: str
    loads: dict
    bottleneck: tuple[tuple[Edge, float], ...]
    caption: str
    structures: tuple[Structure, ...]

    @property
    def total_chunks(self) -> int | None:
        """Chunks carried by all structures together (None where a record does not say)."""
        if any(s.chunks is None for s in self.structures):
            return None
        return sum(s.chunks for s in self.structures) or None


def distinct_structures(items: Iterable[tuple]) -> list[Structure]:
    """Fold ``(kind, edges, host_edges, chunks)`` items with equal edge sets into Structures.

    Two items are the same when kind, tag, edge set and staged edge set agree, whatever order
    their edges are listed in. The most frequent come first, then those carrying more chunks,
    then the order of first appearance. A 5th element of an item, when present, is its tag.
    """
    groups: dict[tuple, list] = {}
    for index, (kind, edges, host, chunks, *tag) in enumerate(items):
        key = (kind, tag[0] if tag else "", frozenset(map(tuple, edges)), frozenset(map(tuple, host)))
        groups.setdefault(key, []).append((index, chunks))
    out = []
    for (kind, tag, edges, host), members in groups.items():
        counts = [c for _, c in members]
        out.append(Structure(kind, tuple(sorted(edges, key=_edge_key)),
                             tuple(sorted(host, key=_edge_key)),
                             tuple(i for i, _ in members),
                             None if None in counts else sum(counts), tag))
    return sorted(out, key=lambda s: (-s.count, -(s.chunks or 0), s.members[0]))


def _cycle(edges: tuple[Edge, ...]) -> list[str]:
    """The nodes of a ring's edges in ring order, from its first node back to it."""
    following = dict(edges)
    order = [min(following, key=natural_key)]
    while len(order) <= len(following):
        order.append(following[order[-1]])
        if order[-1] == order[0]:
            break
    return order


def _edge_key(edge: Edge) -> tuple:
    return natural_key(edge[0]), natural_key(edge[1])


def schedule_items(meta: dict, ranks: tuple[str, ...]) -> list[tuple]:
    """``(kind, edges, host_edges, chunks, tag)`` per ring and tree the schedule's meta records.

    Ring records are ``(order, GB/s, first chunk, chunks)``; tree records a parent array, or a
    tuple holding the (from, to) rank pairs followed by first chunk and chunk count (see
    :func:`collectx.cli.plan.overlays`, whose numbering this keeps).
    """
    items = []
    for ring in meta.get("rings", ()):
        order = list(ring[0])
        if len(order) > 1:
            chunks = ring[3] if len(ring) > 3 and isinstance(ring[3], int) else None
            items.append(("ring", list(zip(order, order[1:] + order[:1])), (), chunks, ""))
    for tree in meta.get("trees", ()):
        edges = _tree_edges(tree, ranks)
        if edges:
            tag = " ".join(x for x in tree if isinstance(x, str) and x != "host")
            items.append(("tree", edges, sorted(_host_edges(tree, ranks)), _tree_chunks(tree), tag))
    return items


def _tree_chunks(tree) -> int | None:
    """The chunk count after a packed-tree record's edge tuple (None for a parent array)."""
    for i, item in enumerate(tree):
        if isinstance(item, (tuple, list)):
            after = tree[i + 1:i + 3]
            ints = len(after) == 2 and all(isinstance(x, int) for x in after)
            return after[1] if ints else None
    return None


def headline(p) -> str:
    """``allreduce of 1 GiB on 4 GPUs (GPU0-GPU2, GPU5) | blink+host | predicted busbw ...``."""
    d = p.summary()
    gpus = "1 GPU" if len(p.ranks) == 1 else f"{len(p.ranks)} GPUs"
    parts = [f"{p.collective} of {_bytes(p.nbytes)} on {gpus} ({rank_span(p.ranks)})",
             p.algorithm]
    if getattr(p, "no_communication", None):
        parts.append(f"no traffic: {p.no_communication}")
    elif d["predicted_busbw_GBps"] is not None:
        busbw = f"predicted busbw {d['predicted_busbw_GBps']:.2f} GB/s"
        if d["efficiency"] is not None:
            busbw += f", {d['efficiency']:.3f} of the bound"
        parts.append(busbw)
    return " | ".join(parts)


def rank_span(ranks: Iterable[str]) -> str:
    """GPU names with runs of consecutive numbers folded, so 16 GPUs fit a title.

    >>> rank_span(["GPU0", "GPU1", "GPU2", "GPU5"]), rank_span([f"GCD{i}" for i in range(16)])
    ('GPU0-GPU2, GPU5', 'GCD0-GCD15')
    >>> rank_span(["n0/GPU0", "n0/GPU1", "n1/GPU0", "n1/GPU1"])
    'n0/GPU0-n0/GPU1, n1/GPU0-n1/GPU1'
    """
    runs: list[list] = []  # [prefix, first, last] for each run
    for name in ranks:
        m = re.fullmatch(r"(.*?)(\d+)", name)
        prefix, number = (m.group(1), int(m.group(2))) if m else (name, None)
        if runs and number is not None and runs[-1][0] == prefix and runs[-1][2] == number - 1:
            runs[-1][2] = number
        else:
            runs.append([prefix, number, number])
    return ", ".join(p if a is None else f"{p}{a}" if a == b else f"{p}{a}-{p}{b}"
                     for p, a, b in runs)


def plan_view(G, p) -> PlanView:
    """Gather what ``collectx plan --draw`` / ``--html`` show of plan ``p`` on topology ``G``."""
    loads = dict(getattr(p.predicted, "link_util", None) or {})
    busiest = tuple(bottleneck_links(loads))
    items = schedule_items(p.schedule.meta_dict(), tuple(p.ranks))
    return PlanView(topology=subset(G, list(p.ranks)), ranks=tuple(p.ranks), title=headline(p),
                    summary=format_plan(p), loads=loads, bottleneck=busiest,
                    caption=bottleneck_caption(list(busiest)),
                    structures=tuple(distinct_structures(items)))


def figure_panels(view: PlanView, limit: int = 12) -> tuple[list[tuple], str]:
    """Small-multiple panels for the ``limit`` most frequent structures, and their heading:
    how many trees/rings the schedule has, how many distinct, how many not drawn.

    >>> view = PlanView(None, (), "", "", {}, (), "", tuple(distinct_structures(
    ...     [("ring", [("A", "B"), ("B", "A")], (), 4)] * 3 + [("ring", [("B", "A"), ("A", "B")], (), 2)])))
    >>> figure_panels(view)
    ([('x4, 100% of chunks', (('A', 'B'), ('B', 'A')), (), None)], '4 rings, 1 distinct')
    """
    shown = view.structures[:limit]
    one_kind = len(_kind_names(view.structures)) == 1
    panels = [(s.title(view.total_chunks, kind=not one_kind), s.edges, s.host_edges, s.root)
              for s in shown]
    heading = structures_heading(view.structures)
    if len(view.structures) > len(shown):
        heading += (f"; the {len(shown)} most used are drawn, {len(view.structures) - len(shown)} "
                    "more are listed by collectx plan --html")
    return panels, heading


def structures_heading(structures: tuple[Structure, ...]) -> str:
    """``20 trees, 5 distinct``: how many copies the schedule has, and how many shapes."""
    names = _kind_names(structures)
    what = names[0] if len(names) == 1 else "trees and rings"
    return f"{sum(s.count for s in structures)} {what}, {len(structures)} distinct"


def _kind_names(structures) -> list[str]:
    return sorted({f"{s.tag} {s.kind}s" if s.tag else f"{s.kind}s" for s in structures})
