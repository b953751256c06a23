"""``collectx plan --html OUT``: one self-contained, interactive page about a plan.

The page draws the allocation's topology as inline SVG, in the positions of
:func:`collectx.topology.draw.layout` (the same as ``--draw``), every link coloured by its
predicted load and the bottleneck in red; beside it, the plan's distinct trees and rings with
their counts. Hovering over one shows its edges on the picture and dims the links; clicking
keeps it shown (click again, or another, to change), and the arrow keys step through the list,
so one tree can be followed at a time. Below, the summary ``collectx plan`` prints.

No matplotlib, no network: the SVG is written here, and the few lines of CSS and vanilla
JavaScript are inlined, so the file can be mailed or attached to a bug report as is.
"""

from __future__ import annotations

import html
import math

from ..perf.html import page
from ..topology.draw import NODE_STYLE, layout
from ..topology.linkload import BOTTLENECK_COLOUR, link_marks, load_colour, percent
from ..topology.plan_figure import HOST_COLOUR, LINK_STYLE, ROOT_FACE, TREE_COLOUR
from .plan_view import PlanView, Structure, structures_heading

_DASHES = {"--": "7 4", ":": "2 3", "-.": "7 3 2 3"}  # matplotlib line styles as SVG dashes
_GPU_HALF = (22, 13)  # px: half the width and height of a GPU's box

_CSS = """body{max-width:1400px}h1{font-size:20px}
.wrap{display:flex;gap:1.5em;align-items:flex-start;flex-wrap:wrap}
svg.plan{border:1px solid #ddd;background:#fff;flex:0 0 auto}
svg.plan text{font-family:sans-serif;pointer-events:none}
.side{flex:1 1 300px;max-width:560px;max-height:85vh;overflow-y:auto}
.side ul{padding:0;margin:0}
li.structure{list-style:none;cursor:pointer;padding:4px 8px;margin:2px 0;border-radius:4px;
border:1px solid transparent}
li.structure:hover{background:#eef4fb}
li.structure.on{background:#deebf7;border-color:#6baed6}
li.structure small{display:block;color:#555}
.caption{color:#d62728;font-weight:bold}
.key{color:#555;font-size:13px}
svg.plan g.structure{display:none}
svg.plan.focus g.structure.on{display:inline}
svg.plan.focus .link,svg.plan.focus .load{opacity:.18}
"""

_JS = """(function(){
var svg=document.querySelector('svg.plan');
var items=Array.prototype.slice.call(document.querySelectorAll('li.structure'));
var chosen=null;
function show(id){
  svg.classList.toggle('focus',id!==null);
  svg.querySelectorAll('g.structure').forEach(function(g){g.classList.toggle('on',g.dataset.id===id);});
  items.forEach(function(li){li.classList.toggle('on',li.dataset.id===id);});
}
function choose(li){chosen=(chosen===li.dataset.id)?null:li.dataset.id;show(chosen);}
items.forEach(function(li,k){
  li.addEventListener('mouseenter',function(){show(li.dataset.id);});
  li.addEventListener('mouseleave',function(){show(chosen);});
  li.addEventListener('click',function(){choose(li);});
  li.addEventListener('keydown',function(e){
    if(e.key==='Enter'||e.key===' '){e.preventDefault();choose(li);}
    var next=e.key==='ArrowDown'?items[k+1]:e.key==='ArrowUp'?items[k-1]:null;
    if(next){e.preventDefault();next.focus();chosen=next.dataset.id;show(chosen);}
  });
});
})();
"""


class _Frame:
    """Layout units to SVG pixels: y grows downwards, a margin around the nodes."""

    def __init__(self, pos: dict, width_px: float = 640.0, margin: float = 40.0):
        xs = [x for x, _ in pos.values()] or [0.0]
        ys = [y for _, y in pos.values()] or [0.0]
        self.x0, self.y1, self.margin = min(xs), max(ys), margin
        span = max(max(xs) - min(xs), max(ys) - min(ys), 1e-9)
        self.scale = width_px / span
        self.width = round((max(xs) - min(xs)) * self.scale + 2 * margin)
        self.height = round((max(ys) - min(ys)) * self.scale + 2 * margin)

    def __call__(self, point) -> tuple[float, float]:
        return (round(self.margin + (point[0] - self.x0) * self.scale, 1),
                round(self.margin + (self.y1 - point[1]) * self.scale, 1))


def _links_svg(view: PlanView, pos, frame) -> str:
    """Every link by load (bottleneck red, wider) with a tooltip, then the load labels."""
    marks = link_marks(view.topology, pos, view.loads, view.bottleneck)
    widest = max((m.data["bw_gbps"] for m in marks), default=1.0)
    lines, labels = [], []
    for m in sorted(marks, key=lambda m: (m.hot, m.load)):  # busiest drawn last, on top
        (x0, y0), (x1, y1) = frame(pos[m.a]), frame(pos[m.b])
        dash = _DASHES.get(LINK_STYLE.get(m.data["type"], "-"))
        lines.append(
            f'<line class="link{" hot" if m.hot else ""}" x1="{x0}" y1="{y0}" x2="{x1}" '
            f'y2="{y1}" stroke="{BOTTLENECK_COLOUR if m.hot else load_colour(m.load)}" '
            f'stroke-width="{1.5 + 5 * m.data["bw_gbps"] / widest + (3 if m.hot else 0):.1f}"'
            + (f' stroke-dasharray="{dash}"' if dash else "")
            + f' data-a="{html.escape(m.a)}" data-b="{html.escape(m.b)}">'
            f"<title>{html.escape(_link_tip(m, view.loads))}</title></line>")
        if m.label_at:
            x, y = frame(m.label_at)
            style = (f'font-size="12" font-weight="bold" fill="{BOTTLENECK_COLOUR}"' if m.hot
                     else 'font-size="11" fill="#333"')
            labels.append(f'<text class="load" x="{x}" y="{y + 4}" text-anchor="middle" {style} '
                          f'stroke="#fff" stroke-width="3" paint-order="stroke">'
                          f"{percent(m.load)}</text>")
    return "".join(lines) + "".join(labels)


def _link_tip(m, loads) -> str:
    """Both directions' loads, for the link's tooltip."""
    ab, ba = loads.get((m.a, m.b), 0.0), loads.get((m.b, m.a), 0.0)
    return (f"{m.a}->{m.b} {percent(ab)}, {m.b}->{m.a} {percent(ba)} of "
            f"{m.data['bw_gbps']:g} GB/s per direction ({m.data['type']})"
            + ("; bottleneck" if m.hot else ""))


def _nodes_svg(G, pos, frame) -> str:
    """GPUs as boxes, everything else as circles, in the faces :func:`.draw` uses."""
    w, h = _GPU_HALF
    out = []
    for n, data in G.nodes(data=True):
        x, y = frame(pos[n])
        kind = data.get("kind", "host")
        paint = f'fill="{NODE_STYLE.get(kind, NODE_STYLE["host"])[1]}" stroke="#000"'
        tip = f"<title>{html.escape(n)} ({html.escape(kind)})</title>"
        shape = (f'<rect x="{x - w}" y="{y - h}" width="{2 * w}" height="{2 * h}" rx="3" '
                 f"{paint}>{tip}</rect>" if kind == "gpu"
                 else f'<circle cx="{x}" cy="{y}" r="14" {paint}>{tip}</circle>')
        out.append(f'<g class="node">{shape}<text x="{x}" y="{y + 4}" text-anchor="middle" '
                   f'font-size="11">{html.escape(n.rpartition("/")[2])}</text></g>')
    return "".join(out)


def _arrow(p0, p1, staged: bool) -> str:
    """One tree/ring edge, stopping short of both nodes, nudged right of its direction so
    the two directions between a pair stay apart."""
    (x0, y0), (x1, y1) = p0, p1
    length = math.hypot(x1 - x0, y1 - y0) or 1.0
    ux, uy = (x1 - x0) / length, (y1 - y0) / length
    nx, ny = -uy * 4, ux * 4
    # Stop where the line leaves a GPU's box (plus a gap), so the head is not under the node.
    exit_box = min(_GPU_HALF[0] / max(abs(ux), 1e-9), _GPU_HALF[1] / max(abs(uy), 1e-9))
    cut = min(exit_box + 4, length / 3)
    style = (f'stroke="{HOST_COLOUR}" stroke-dasharray="8 5" marker-end="url(#arrow-host)"'
             if staged else f'stroke="{TREE_COLOUR}" marker-end="url(#arrow-tree)"')
    return (f'<line x1="{x0 + ux * cut + nx:.1f}" y1="{y0 + uy * cut + ny:.1f}" '
            f'x2="{x1 - ux * cut + nx:.1f}" y2="{y1 - uy * cut + ny:.1f}" stroke-width="3" '
            f"{style}/>")


def _structures_svg(view: PlanView, pos, frame) -> str:
    out = []
    for k, s in enumerate(view.structures):
        staged = set(s.host_edges)
        root = ""
        if s.root:
            x, y = frame(pos[s.root])
            root = (f'<rect x="{x - 26}" y="{y - 17}" width="52" height="34" rx="5" '
                    f'fill="none" stroke="{ROOT_FACE}" stroke-width="5"/>')
        edges = "".join(_arrow(frame(pos[a]), frame(pos[b]), (a, b) in staged) for a, b in s.edges)
        out.append(f'<g class="structure" data-id="{k}">{root}{edges}</g>')
    return "".join(out)


def _markers() -> str:
    return "".join(
        f'<marker id="{name}" viewBox="0 0 10 10" refX="8" refY="5" markerWidth="5" '
        f'markerHeight="5" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="{colour}"/></marker>'
        for name, colour in (("arrow-tree", TREE_COLOUR), ("arrow-host", HOST_COLOUR)))


def plan_svg(view: PlanView) -> str:
    """The topology with link loads, and one hidden ``<g class="structure">`` per distinct
    tree/ring that the page's script shows on demand (nodes stay on top of both)."""
    G = view.topology
    pos = layout(G)
    frame = _Frame(pos)
    return (f'<svg class="plan" xmlns="http://www.w3.org/2000/svg" width="{frame.width}" '
            f'height="{frame.height}" viewBox="0 0 {frame.width} {frame.height}">'
            f"<defs>{_markers()}</defs>{_links_svg(view, pos, frame)}"
            f"{_structures_svg(view, pos, frame)}{_nodes_svg(G, pos, frame)}</svg>")


def _item(k: int, s: Structure, total: int | None) -> str:
    edges = " ".join(f"{a}>{b}" for a, b in s.edges)
    return (f'<li class="structure" tabindex="0" data-id="{k}" data-kind="{s.kind}" '
            f'data-count="{s.count}" data-edges="{html.escape(edges)}">'
            f"<b>{html.escape(s.title(total))}</b>"
            f"<small>{html.escape(s.edge_text())}</small>"
            f"<small>{s.kind} {', '.join(map(str, s.members))}</small></li>")


def structure_list(view: PlanView) -> str:
    """The selectable list: one ``<li class="structure">`` per distinct tree/ring."""
    if not view.structures:
        return "<p>The schedule records no rings or trees (a one-hop exchange, for one).</p>"
    items = "".join(_item(k, s, view.total_chunks) for k, s in enumerate(view.structures))
    return (f"<p><b>{html.escape(structures_heading(view.structures))}</b>, most used "
            f"first. Point at one to see it, click to keep it (arrow keys step).</p>"
            f"<ul>{items}</ul>")


def render_plan_html(view: PlanView) -> str:
    """The whole page for ``view`` (see the module docstring)."""
    key = ("Links: colour = load of the busier direction (pale to dark blue), red = "
           "bottleneck, width = bandwidth, dashed = PCIe, dotted = socket link; hover a link "
           "for both directions. Trees: blue arrows copy over a link, dashed orange ones are "
           "staged through host memory, the orange frame marks the root.")
    body = (f"<h1>{html.escape(view.title)}</h1>"
            f"<p class='caption'>{html.escape(view.caption)}</p>"
            f"<div class='wrap'>{plan_svg(view)}<div class='side'>{structure_list(view)}</div></div>"
            f"<p class='key'>{key}</p><h2>Plan</h2><pre>{html.escape(view.summary)}</pre>"
            f"<script>{_JS}</script>")
    return page(html.escape(view.title), body, _CSS)


def write_plan_html(path: str, view: PlanView) -> str:
    """Write :func:`render_plan_html` of ``view`` to ``path``; return ``path``."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(render_plan_html(view))
    return path
