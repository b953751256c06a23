"""Small helpers shared by the planner algorithms: argument checks, shard arithmetic, and
the simulator's judgement of candidates (their instructions are collected by
:class:`~collectx.schedule.builder.LaneBuilder`)."""

from __future__ import annotations

from ..errors import PlanError, integral
from ..schedule.ir import COLLECTIVES, Schedule


def shard(r: int, nparts: int, nchunks: int) -> tuple[int, int]:
    """Chunk range ``(start, count)`` of part ``r`` when ``nchunks`` chunks are cut in ``nparts``.

    Parts differ by at most one chunk; a part is empty (count 0) when ``nchunks < nparts``.

    >>> [shard(r, 3, 4) for r in range(3)]
    [(0, 1), (1, 1), (2, 2)]
    """
    lo, hi = r * nchunks // nparts, (r + 1) * nchunks // nparts
    return lo, hi - lo


def weighted_shares(total: int, weights: list[float]) -> list[int]:
    """Split ``total`` chunks in proportion to ``weights`` (largest remainder, integral).

    >>> weighted_shares(10, [2.0, 1.0, 1.0])
    [5, 3, 2]
    """
    s = float(sum(weights))
    if s <= 0:
        weights, s = [1.0] * len(weights), float(len(weights))
    exact = [total * w / s for w in weights]
    shares = [int(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (shares[i] - exact[i], i))
    for i in order[:total - sum(shares)]:
        shares[i] += 1
    return shares


_REMEMBERED: dict = {}


def remembered(key: tuple, compute):
    """``compute()``, remembered under ``key``, which names all it depends on: the plans of
    one allocation (collectives, size classes) ask for the same pieces. At most 64: a 16-GPU
    packing LP with its problem pickles to 0.2 MB, an allocation asks for a few pieces."""
    value = _REMEMBERED.get(key)   # read once: another thread may clear the table meanwhile
    if value is None:
        value = compute()
        if len(_REMEMBERED) >= 64:
            _REMEMBERED.clear()
        _REMEMBERED[key] = value
    return value


def forget_remembered() -> None:   # benchmarks timing a first plan
    _REMEMBERED.clear()


def check_args(collective: str, nranks: int, root: int, nchunks: int | None) -> tuple:
    """Validate the arguments every planner shares; raises :class:`PlanError`. Returns
    ``(root, nchunks)`` as Python ints (numpy's are taken too: schedules are written as JSON)."""
    if collective not in COLLECTIVES:
        raise PlanError(f"unknown collective {collective!r}; expected one of "
                        f"{', '.join(COLLECTIVES)}")
    if nranks < 1:
        raise PlanError(f"{nranks} ranks: a collective needs at least one rank")
    if integral(root) is None or not 0 <= root < nranks:
        raise PlanError(f"root={root!r} with {nranks} ranks: the root must be in "
                        f"0..{nranks - 1}")
    if nchunks is not None and (integral(nchunks) or 0) < 1:
        raise PlanError(f"nchunks={nchunks!r}: expected a positive chunk count (or None)")
    return int(root), nchunks and int(nchunks)


def simulated(s: Schedule, topo, nbytes: int, ranks):
    """The simulator's result for ``s`` on ``topo`` (``ranks``: its nodes): how planners weigh
    candidates that no closed form ranks."""
    from ..schedule.simulate import simulate
    return simulate(s, topo, nbytes, ranks=list(ranks))
