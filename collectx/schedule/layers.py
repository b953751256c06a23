"""Two schedules of one collective run side by side, each on its own share of every unit.

A machine's GPU fabric (NVLink, xGMI) and its PCIe paths through host memory are separate
links: a schedule over the one and a schedule over the other can run at once, each moving the
part of the message its links carry fastest. :func:`side_by_side` makes them one schedule: the
first keeps the leading chunks of every unit, the second the rest, each on lanes of its own.
"""

from __future__ import annotations

import dataclasses

from ..errors import ScheduleError
from .ir import MAX_LANES, Dep, Lane, Ref, Schedule

MOST_SCALE = 64   # chunks of the second schedule's size a chunk of it may become


def side_by_side(first: Schedule, second: Schedule, share: float) -> Schedule:
    """``first`` and ``second`` (one collective, ranks and root) as one schedule in which
    ``first`` moves about ``share`` of every unit and ``second`` the rest.

    Each unit is cut into ``N = s * first.nchunks + t * second.nchunks`` chunks: chunk ``j`` of
    ``first`` becomes the ``s`` chunks from ``j * s``, chunk ``j`` of ``second`` the ``t``
    chunks from ``s * first.nchunks + j * t`` (whole numbers that bring the first's part
    nearest ``share``, :func:`_scales`). Lanes, and the dependencies that name them, follow
    the first's on every rank; scratch and host buffers are each as large as the larger of the
    two needs (they use different chunks of them). ``meta`` keeps both plans' rings and trees
    and names the layers.

    >>> from collectx.planner import plan
    >>> from collectx.schedule import verify
    >>> from collectx.topology import ring
    >>> a = plan(ring(3), "allreduce", 3 << 20, algo="ring").schedule
    >>> b = plan(ring(3), "allreduce", 3 << 20, algo="direct").schedule
    >>> s = side_by_side(a, b, 0.75)
    >>> a.nchunks, b.nchunks, s.nchunks, s.meta_dict()["first_chunks"]
    (6, 3, 24, 18)
    >>> len(s.lanes[0]) == len(a.lanes[0]) + len(b.lanes[0])
    True
    >>> verify(s).instructions == a.n_instructions + b.n_instructions
    True
    """
    a, b = first.unpacked(), second.unpacked()
    for field in ("collective", "nranks", "root", "inplace"):
        if getattr(a, field) != getattr(b, field):
            raise ScheduleError(f"side_by_side: {field} {getattr(a, field)!r} and "
                                f"{getattr(b, field)!r} differ; expected two schedules of "
                                f"one collective on the same ranks")
    if not 0.0 < share < 1.0:
        raise ScheduleError(f"side_by_side: share {share}; expected a fraction in (0, 1)")
    scale, scale_b = _scales(share, a.nchunks, b.nchunks)
    nchunks = scale * a.nchunks + scale_b * b.nchunks
    lanes = []
    for r in range(a.nranks):
        if len(a.lanes[r]) + len(b.lanes[r]) > MAX_LANES:
            raise ScheduleError(f"side_by_side: rank {r} would run {len(a.lanes[r])} + "
                                f"{len(b.lanes[r])} lanes; at most {MAX_LANES} fit")
        lanes.append(_moved(a.lanes[r], a.nchunks, nchunks, 0, scale) + _moved(
            b.lanes[r], b.nchunks, nchunks, scale * a.nchunks, scale_b,
            [len(x) for x in a.lanes]))
    most = lambda x, y: tuple(map(max, x, y))  # noqa: E731
    return dataclasses.replace(
        a, nchunks=nchunks, lanes=tuple(lanes), algorithm=f"{a.algorithm}|{b.algorithm}",
        scratch_units=most(a.scratch_units, b.scratch_units),
        host_units=most(a.host_units, b.host_units),
        meta=_meta(a, b, scale * a.nchunks))


def _meta(a: Schedule, b: Schedule, first_chunks: int) -> tuple:
    """Both schedules' planner facts, the first's where both name one, but the rings and trees
    of both (each record as its own schedule numbers chunks), and the layers."""
    ma, mb = a.meta_dict(), b.meta_dict()
    meta = {**mb, **ma, "layers": (a.algorithm, b.algorithm), "first_chunks": first_chunks}
    for key in ("rings", "trees"):
        if key in ma or key in mb:
            meta[key] = tuple(ma.get(key, ())) + tuple(mb.get(key, ()))
    return tuple(meta.items())


def _scales(share: float, first: int, second: int) -> tuple[int, int]:
    """Chunks per chunk of each schedule, ``(s, t)``, whose part ``s first / (s first +
    t second)`` comes nearest ``share``: the fewest chunks within a thousandth of the lesser
    part (a layer of a fiftieth of the rate that moves a tenth more than its share of the
    bytes slows the whole by a fifth), else the nearest with ``t`` up to :data:`MOST_SCALE`."""
    least = min(share, 1 - share) / 1000
    best = None
    for t in range(1, MOST_SCALE + 1):
        s = max(1, round(share / (1 - share) * t * second / first))
        miss = abs(s * first / (s * first + t * second) - share)
        if best is None or miss < best[0]:
            best = (miss, s, t)
        if miss <= least:
            break
    return best[1], best[2]


def _moved(lanes, was: int, nchunks: int, offset: int, scale: int, shift=None) -> tuple:
    """``lanes`` with every reference moved from ``was`` chunks a unit to the ``scale`` chunks
    from ``offset + j * scale`` of ``nchunks``, and dependencies' lanes past ``shift[rank]``
    (lanes of another schedule placed before them; None: none)."""
    def ref(r: Ref) -> Ref:
        unit, j = divmod(r.chunk, was)
        if j + r.count > was:
            raise ScheduleError(f"side_by_side: {r} runs past its unit's {was} chunks; "
                                f"expected references within one unit")
        return Ref(r.rank, r.buf, unit * nchunks + offset + j * scale, r.count * scale)

    def dep(d: Dep) -> Dep:
        return d if shift is None else Dep(d.rank, d.lane + shift[d.rank], d.index)
    return tuple(Lane(tuple(i._replace(dst=ref(i.dst), srcs=tuple(map(ref, i.srcs)),
                                       deps=tuple(map(dep, i.deps))) for i in lane.instrs))
                 for lane in lanes)
