"""``collectx plan SOURCE --collective C --gpus LIST --size BYTES``: plan and judge a collective.

Prints the chosen algorithm, its rings/trees, the predicted time and bandwidths, the bound
(for allreduce: the reference and the ceiling), the efficiency and the planning time; ``--json``
prints :meth:`collectx.planner.Plan.to_dict` instead. ``--draw`` draws the predicted load of
every link with the bottleneck marked, beside one small panel per distinct ring/tree; ``--html``
writes the same as an interactive page (pick a tree to follow it); ``--export-msccl`` writes
MSCCL XML.

>>> parse_size("8K"), parse_size("1GiB"), parse_size("1536")
(8192, 1073741824, 1536)
"""

from __future__ import annotations

import argparse
import json
import re

from ..config import get_config
from ..errors import ArgumentError
from ..topology import load, local_topology
from .topo import parse_gpu_list

_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)
_SCALE = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes from ``"1048576"``, ``"8K"``, ``"64M"``, ``"1G"`` (binary multiples; B/iB optional)."""
    m = _SIZE.match(str(text))
    if not m:
        raise ArgumentError(f"--size {text!r}: expected a byte count such as 1048576, 8K, 64M "
                            f"or 1G (K/M/G are powers of 1024)")
    return int(m.group(1)) * _SCALE[m.group(2).lower()]


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``collectx plan``."""
    p = subparsers.add_parser(
        "plan", help="plan a collective on a topology and predict how fast it is",
        description="Plan COLLECTIVE on GPUs of SOURCE (a preset name, a collectx JSON file, "
                    "an NCCL topology XML, 'nvidia-smi topo -m', 'rocm-smi --showtopo' or "
                    "'amd-smi topology' output; default this machine), simulate it and compare it with the cut bound.")
    p.add_argument("source", nargs="?", metavar="SOURCE", help="preset name or file")
    p.add_argument("--collective", "-c", required=True, metavar="C",
                   help="allreduce, reduce_scatter, allgather, broadcast, reduce, alltoall, "
                        "sendrecv")
    p.add_argument("--gpus", metavar="LIST", help="GPUs to use, e.g. 0,1,2,5 or 0-3 "
                                                  "(default: all)")
    p.add_argument("--size", default="1G", metavar="BYTES",
                   help="message size in bytes, K/M/G suffixes allowed (default 1G)")
    p.add_argument("--algo", metavar="A", help="force an algorithm (default: COLLECTX_ALGO, "
                                               "else the cost model chooses)")
    p.add_argument("--root", type=int, default=0, help="root rank of broadcast/reduce")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="the executor to plan for: cpu (default; host staging allowed) or cuda "
                        "(exactly the schedule the CUDA runtime runs: no host staging, GPUs in "
                        "device order)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--draw", metavar="OUT", help="draw the plan (.svg/.png): link loads with "
                                                 "the bottleneck, one panel per distinct "
                                                 "tree/ring (needs matplotlib)")
    p.add_argument("--html", metavar="OUT", help="write an interactive, self-contained HTML "
                                                 "report of the plan (no matplotlib needed)")
    p.add_argument("--export-msccl", metavar="OUT", help="write the schedule as MSCCL XML")
    return p


def run(args) -> int:
    """Carry out ``collectx plan``; errors propagate as CollectXError (one line, exit 2)."""
    from ..planner import plan
    G = load(args.source) if args.source else local_topology()
    gpus = parse_gpu_list(args.gpus) if args.gpus is not None else None
    algo = args.algo or get_config().algo
    if args.device == "cuda":
        from ..runtime.cuda.planning import cuda_plan
        p = cuda_plan(G, args.collective, parse_size(args.size), gpus=gpus, algo=algo,
                      root=args.root)
    else:
        p = plan(G, args.collective, parse_size(args.size), gpus=gpus, algo=algo,
                 root=args.root)
    if args.export_msccl:
        from ..schedule.msccl import to_msccl_xml
        with open(args.export_msccl, "w") as f:
            f.write(to_msccl_xml(p.schedule))
    if args.draw:
        _draw(G, p, args.draw)
    if args.html:
        from .plan_report import write_plan_html
        from .plan_view import plan_view
        write_plan_html(args.html, plan_view(G, p))
    if args.json:
        print(json.dumps(p.to_dict(), indent=1))
    else:
        print(format_plan(p, flat_ring_busbw(G, p)))
        for what, out in (("MSCCL XML", args.export_msccl), ("Drawing", args.draw),
                          ("HTML report", args.html)):
            if out:
                print(f"{what} written to {out}")
    return 0


def flat_ring_busbw(topo, p) -> float | None:
    """Predicted busbw (GB/s) of flat rings over all ranks of the hierarchical plan ``p``,
    for comparison: the ring plan over its first two machines, predicted as every plan is.

    Every machine boundary of a flat ring looks alike, so two machines show its rate (planning
    or simulating rings over 128 GPUs takes minutes); more machines only add hops, so the
    figure is, if anything, the flat ring's best case. It is simulated rather than summed from
    the rings' bandwidths: pipeline fill and per-hop latency are part of what a flat ring
    costs (two dgx_h100 machines joined by eight 50 GB/s rails: rings of 400 GB/s in all,
    predicted 364). None for other plans, or when no ring plan exists.
    """
    from ..errors import PlanError
    from ..planner.hierarchical import machine_of
    from ..planner.ring import SUPPORTED, plan_ring
    from ..planner.select import predict
    from ..planner.api import allocation
    if p.algorithm != "hierarchical" or p.collective not in SUPPORTED:
        return None
    nodes = p.schedule.meta_dict().get("nodes") or []
    if len(nodes) < 2:
        return None
    _, topo = allocation(topo, list(p.ranks))   # other jobs' GPUs relay nothing
    part = machine_of(topo)
    ids = tuple(p.ranks[r] for node in nodes[:2] for r in node)
    keep = {part[i] for i in ids}
    view = topo.subgraph([v for v in topo if part.get(v, -1) in keep or v not in part]).copy()
    try:
        ring = plan_ring(view, ids, p.collective, p.nbytes)
    except PlanError:
        return None
    return getattr(predict(ring, view, p.nbytes, ids, "ring"), "busbw_GBps", None) or None


def format_plan(p, flat_ring: float | None = None) -> str:
    """The human-readable summary ``collectx plan`` prints."""
    d = p.summary()
    gpus = "1 GPU" if len(p.ranks) == 1 else f"{len(p.ranks)} GPUs"
    lines = [f"collective   {p.collective} of {_bytes(p.nbytes)} on {gpus}: "
             f"{', '.join(p.ranks)}",
             f"algorithm    {p.algorithm} ({p.schedule.nchunks} chunks, "
             f"{max(len(lanes) for lanes in p.schedule.lanes)} lanes, "
             f"{p.schedule.n_instructions} instructions)"]
    lines += [f"  {label}" for label, _ in overlays(p)]
    if p.no_communication:   # no bandwidth to predict or bound: say so once
        lines.append(f"no traffic   {p.no_communication}; no bandwidth bound applies")
        if d["predicted_time_us"] is not None:
            lines.append(f"predicted    {d['predicted_time_us']:.1f} us (local work and "
                         f"synchronization only)")
    elif d["predicted_time_us"] is not None:
        lines.append(f"predicted    {d['predicted_time_us']:.1f} us, algbw "
                     f"{_rate(d['predicted_algbw_GBps'])} GB/s, busbw "
                     f"{_rate(d['predicted_busbw_GBps'])} GB/s")
    else:
        lines.append("predicted    (no simulator available)")
    if flat_ring:
        lines.append(f"flat ring    busbw {flat_ring:.2f} GB/s (rings over all GPUs, for "
                     f"comparison)")
    if d["bound_busbw_GBps"] is not None:
        if p.collective == "allreduce" and d["ceiling_busbw_GBps"] is not None:
            lines.append(f"bound        reference busbw {d['bound_busbw_GBps']:.2f} GB/s, "
                         f"ceiling {d['ceiling_busbw_GBps']:.2f} GB/s")
        else:
            lines.append(f"bound        busbw {d['bound_busbw_GBps']:.2f} GB/s")
    if d["efficiency"] is not None:
        lines.append(f"efficiency   {_fraction(d['efficiency'])} of the bound")
    checked = f"yes (in {p.verify_time_s:.3f} s)" if p.verified else "no"
    lines.append(f"verified     {checked}; planned in {p.planning_time_s:.3f} s")
    return "\n".join(lines)


def overlays(p) -> list[tuple[str, list[tuple[str, str]]]]:
    """(label, directed node-id edges) for each ring and tree named in the schedule's meta."""
    meta = p.schedule.meta_dict()
    out = []
    for k, ring in enumerate(meta.get("rings", ())):
        order, bw = list(ring[0]), ring[1]
        if len(order) > 1:
            edges = list(zip(order, order[1:] + order[:1]))
            out.append((f"ring {k}: {' > '.join(order)} ({bw:g} GB/s)", edges))
    for k, tree in enumerate(meta.get("trees", ())):
        edges = _tree_edges(tree, p.ranks)
        if edges:
            tag = " ".join(str(x) for x in tree if isinstance(x, str) and x != "host")
            staged = _host_edges(tree, p.ranks)
            out.append((f"tree {k}{' (' + tag + ')' if tag else ''}: "
                        + ", ".join(f"{a}>{b}{' via host' if (a, b) in staged else ''}"
                                    for a, b in edges), edges))
    return out


def _host_edges(tree, ranks) -> set[tuple[str, str]]:
    """Edges a packed-tree record marks as staged through host memory (after "host")."""
    if "host" not in tree:
        return set()
    pairs = tree[list(tree).index("host") + 1]
    return {(ranks[a], ranks[b]) for a, b in pairs}


def _tree_edges(tree, ranks) -> list[tuple[str, str]]:
    """Edges of a tree given as a parent array (ring/tree planners) or as a tuple of
    (from, to) rank pairs inside a record (the packed-tree planners)."""
    if all(isinstance(x, int) for x in tree):
        return [(ranks[par], ranks[r]) for r, par in enumerate(tree) if par >= 0]
    for item in tree:
        if isinstance(item, (tuple, list)) and item and all(
                isinstance(e, (tuple, list)) and len(e) == 2 for e in item):
            return [(ranks[a], ranks[b]) for a, b in item]
    return []


def _draw(G, p, path: str) -> None:
    """Link loads with the bottleneck, and the distinct trees/rings, in one figure."""
    from ..topology.draw import require_matplotlib
    from ..topology.plan_figure import draw_plan
    from .plan_view import figure_panels, plan_view
    require_matplotlib(path)  # fail before building the view, not after
    view = plan_view(G, p)
    panels, heading = figure_panels(view)
    draw_plan(view.topology, path, loads=view.loads, bottleneck=view.bottleneck, panels=panels,
              title=view.title, caption=view.caption, panels_title=heading)


def _fraction(x: float) -> str:
    """Three decimals, or two significant digits below 0.001 (small messages are latency
    bound: 0.000 would read as nothing moving).

    >>> _fraction(0.9754), _fraction(0.0000123)
    ('0.975', '1.2e-05')
    """
    return f"{x:.3f}" if x >= 0.001 else f"{x:.1e}"


def _rate(gbps: float) -> str:
    """Two decimals, or two significant digits below 0.01 GB/s (as :func:`_fraction`).

    >>> _rate(81.894), _rate(0.000526)
    ('81.89', '0.00053')
    """
    return f"{gbps:.2f}" if gbps >= 0.01 else f"{gbps:.2g}"


def _bytes(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"
