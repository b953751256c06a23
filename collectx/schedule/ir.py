"""The schedule IR: the one contract between the planner and every interpreter.

A schedule describes one collective among ``nranks`` ranks as plain frozen data:

* Each rank's payload unit (``count`` elements, known only at run time) is cut into ``nchunks``
  chunks. Chunk ``i`` of a unit covers elements ``[i*count//nchunks, (i+1)*count//nchunks)``, so
  any count works, odd ones and zero included (:func:`chunk_span`).
* Buffers are ``input``, ``output``, ``scratch`` and ``host`` of each rank; their sizes in *units* depend
  on the collective (:func:`buffer_units`): allgather's output is ``nranks`` units, rank-major,
  and so on. Chunk ``j`` of a buffer of several units is chunk ``j % nchunks`` of unit
  ``j // nchunks``; a :class:`Ref` names a contiguous run of chunks. ``host`` is scratch that
  lives in the rank's host memory (the NUMA node its PCIe path reaches) rather than on the
  device: a chunk staged there crosses PCIe up and down instead of a direct GPU link, which is
  how plans use PCIe bandwidth between GPUs that also share an NVLink (see
  :mod:`collectx.schedule.host`).
* Each rank has one or more *lanes* (CPU executor: interleaved work queues; CUDA executor: thread
  blocks). A lane is an ordered list of :class:`Instr`. An instruction is ``copy`` (dst = src) or
  ``reduce`` (dst = src0 op src1 op ...); its refs may name any rank's buffers (executors read and
  write peers' memory directly). ``deps`` lists the instructions, on any rank, that must complete
  first; the previous instruction of the same lane is always an implicit dependency.
* Executors publish, per lane, an epoch-stamped counter after each instruction, so the same
  schedule replays call after call without resetting flags.
* Steps of kind ``engine`` hand a chunk range to an inter-node engine (MPI, torch.distributed,
  NCCL): ``engine_op`` says which collective the engine runs over ``group`` (global ranks).

The IR is small enough to read by eye for 4 ranks:

>>> s = Schedule(collective="allgather", nranks=2, nchunks=1, lanes=(
...     (Lane((Instr("copy", Ref(0, "output", 0), (Ref(0, "input", 0),)),
...            Instr("copy", Ref(1, "output", 0), (Ref(0, "input", 0),)))),),
...     (Lane((Instr("copy", Ref(1, "output", 1), (Ref(1, "input", 0),)),
...            Instr("copy", Ref(0, "output", 1), (Ref(1, "input", 0),)))),),
... ), algorithm="direct")
>>> Schedule.from_dict(s.to_dict()) == s
True
>>> chunk_span(3, nchunks=4, count=10)
(7, 3)
"""

from __future__ import annotations

import array
import dataclasses
import json
import sys
from typing import Any, Iterator, NamedTuple

from ..errors import ScheduleError

SCHEMA = "collectx.schedule/2"      # /2 adds host buffers (``host_units``)
SCHEMA_V1 = "collectx.schedule/1"   # still written for schedules without host buffers
READABLE_SCHEMAS = (SCHEMA_V1, SCHEMA)

COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "alltoall",
               "sendrecv")
BUFFERS = ("input", "output", "scratch", "host")
STAGING = ("scratch", "host")        # per-rank buffers sized by the schedule, never aliased
OPS = ("copy", "reduce", "engine")
ROOTED = ("broadcast", "reduce")
# Lanes per rank the executors run. The CPU executor (CX_EXEC_MAX_LANES in native/) interleaves
# its lanes in one thread, so a lane costs it a flag; the CUDA executor (CX_CUDA_MAX_LANES) gives
# each a thread block. Planning with host staging is planning for the CPU executor (the CUDA one
# has no host buffers), and only that may take all of MAX_LANES; any other plan keeps to GPU_LANES.
MAX_LANES = 128
GPU_LANES = 64


def chunk_span(j: int, nchunks: int, count: int) -> tuple[int, int]:
    """Element (offset, length) of chunk ``j`` of a buffer whose units hold ``count`` elements.

    The same arithmetic lives in ``native/include/cx_chunk.h`` for the executors.
    """
    unit, i = divmod(j, nchunks)
    lo = i * count // nchunks
    hi = (i + 1) * count // nchunks
    return unit * count + lo, hi - lo


def range_span(chunk: int, nchunk: int, nchunks: int, count: int) -> tuple[int, int]:
    """Element (offset, length) of the contiguous chunk run ``[chunk, chunk + nchunk)``."""
    start, _ = chunk_span(chunk, nchunks, count)
    end_off, end_len = chunk_span(chunk + nchunk - 1, nchunks, count)
    return start, end_off + end_len - start


def buffer_units(collective: str, nranks: int) -> dict[str, int]:
    """Size of each rank's input and output buffer, in payload units, for a collective.

    >>> buffer_units("allgather", 4)
    {'input': 1, 'output': 4}
    """
    per_rank = {"allreduce": (1, 1), "reduce_scatter": (nranks, 1), "allgather": (1, nranks),
                "broadcast": (1, 1), "reduce": (1, 1), "alltoall": (nranks, nranks),
                "sendrecv": (1, 1)}
    if collective not in per_rank:
        raise ScheduleError(f"unknown collective {collective!r}; expected one of {COLLECTIVES}")
    i, o = per_rank[collective]
    return {"input": i, "output": o}


# Ref, Dep and Instr are named tuples, not frozen dataclasses: planners build and hash
# hundreds of thousands of them per plan, and a tuple is built and hashed twice as fast.
class Ref(NamedTuple):
    """``count`` consecutive chunks starting at ``chunk`` of one rank's buffer."""

    rank: int
    buf: str
    chunk: int
    count: int = 1

    def to_list(self) -> list:
        return [self.rank, self.buf, self.chunk, self.count]

    @classmethod
    def from_list(cls, v: list) -> "Ref":
        return cls(int(v[0]), str(v[1]), int(v[2]), int(v[3]) if len(v) > 3 else 1)

    def chunks(self) -> range:
        return range(self.chunk, self.chunk + self.count)


class Dep(NamedTuple):
    """Instruction ``index`` of lane ``lane`` of rank ``rank``."""

    rank: int
    lane: int
    index: int


class Instr(NamedTuple):
    """One copy/reduce (or engine call) on chunk ranges; ``deps`` are cross-lane waits."""

    op: str
    dst: Ref
    srcs: tuple[Ref, ...]
    deps: tuple[Dep, ...] = ()
    engine_op: str | None = None     # for op == "engine": the engine's collective
    group: tuple[int, ...] = ()      # for op == "engine": global ranks taking part

    def to_dict(self) -> dict:
        d: dict[str, Any] = {"op": self.op, "dst": self.dst.to_list(),
                             "srcs": [s.to_list() for s in self.srcs]}
        if self.deps:
            d["deps"] = [[x.rank, x.lane, x.index] for x in self.deps]
        if self.engine_op is not None:
            d["engine_op"] = self.engine_op
            d["group"] = list(self.group)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Instr":
        return cls(op=d["op"], dst=Ref.from_list(d["dst"]),
                   srcs=tuple(Ref.from_list(s) for s in d["srcs"]),
                   deps=tuple(Dep(*map(int, x)) for x in d.get("deps", ())),
                   engine_op=d.get("engine_op"), group=tuple(d.get("group", ())))


@dataclasses.dataclass(frozen=True, slots=True)
class Lane:
    instrs: tuple[Instr, ...] = ()

    def __len__(self) -> int:
        return len(self.instrs)


@dataclasses.dataclass(frozen=True, slots=True)
class Schedule:
    """A whole collective: ``lanes[rank][lane].instrs[index]``.

    ``scratch_units[rank]`` sizes each rank's scratch buffer in payload units (0 = none), and
    ``host_units[rank]`` its host-memory scratch (``host`` buffer) the same way.
    ``root`` is the root rank of broadcast/reduce (and the sender of sendrecv). ``inplace``
    says the schedule was built for aliased input/output (see :func:`alias`).
    ``meta`` carries planner facts (trees, rings, shares) for drawings; executors ignore it.
    """

    collective: str
    nranks: int
    nchunks: int
    lanes: tuple[tuple[Lane, ...], ...]
    root: int = 0
    inplace: bool = False
    scratch_units: tuple[int, ...] = ()
    algorithm: str = ""
    meta: tuple[tuple[str, Any], ...] = ()
    host_units: tuple[int, ...] = ()
    schema: str = SCHEMA

    def __post_init__(self):
        if self.collective not in COLLECTIVES:
            raise ScheduleError(f"unknown collective {self.collective!r}; "
                                f"expected one of {', '.join(COLLECTIVES)}")
        if self.nranks < 1 or self.nchunks < 1:
            raise ScheduleError(f"nranks={self.nranks}, nchunks={self.nchunks}: both must be >= 1")
        if len(self.lanes) != self.nranks:
            raise ScheduleError(f"{len(self.lanes)} lane lists for {self.nranks} ranks")
        if not self.scratch_units:
            object.__setattr__(self, "scratch_units", (0,) * self.nranks)
        if not self.host_units:
            object.__setattr__(self, "host_units", (0,) * self.nranks)

    # -- queries ------------------------------------------------------------------------------
    def units(self, rank: int, buf: str) -> int:
        if buf == "scratch":
            return self.scratch_units[rank]
        if buf == "host":
            return self.host_units[rank]
        return buffer_units(self.collective, self.nranks)[buf]

    def instructions(self) -> Iterator[tuple[Dep, Instr]]:
        """Every instruction with its id, rank by rank, lane by lane."""
        for r, lanes in enumerate(self.lanes):
            for li, lane in enumerate(lanes):
                for i, ins in enumerate(lane.instrs):
                    yield Dep(r, li, i), ins

    def instr(self, d: Dep) -> Instr:
        return self.lanes[d.rank][d.lane].instrs[d.index]

    def meta_dict(self) -> dict:
        return dict(self.meta)

    def unpacked(self) -> "Schedule":
        """Itself: its instructions are objects already (:meth:`PackedSchedule.unpacked`)."""
        return self

    @property
    def n_instructions(self) -> int:
        return sum(len(lane) for lanes in self.lanes for lane in lanes)

    # -- serialization ------------------------------------------------------------------------
    @property
    def uses_host(self) -> bool:
        """Whether any rank has a host-memory buffer (a plan with host relays)."""
        return any(self.host_units)

    def to_dict(self) -> dict:
        """Plain JSON data; schema /1 (readable by older versions) unless host buffers exist."""
        return dict(self._head(), lanes=[[[ins.to_dict() for ins in lane.instrs]
                                          for lane in lanes] for lanes in self.lanes])

    def _head(self) -> dict:
        """Every field but the lanes, as :meth:`to_dict` and :meth:`to_packed` write them."""
        d = {"schema": SCHEMA if self.uses_host else SCHEMA_V1, "collective": self.collective,
             "nranks": self.nranks, "nchunks": self.nchunks, "root": self.root,
             "inplace": self.inplace, "scratch_units": list(self.scratch_units),
             "algorithm": self.algorithm, "meta": _jsonable(dict(self.meta))}
        if self.uses_host:
            d["host_units"] = list(self.host_units)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Schedule":
        return cls._from_head(d, tuple(tuple(Lane(tuple(Instr.from_dict(i) for i in lane))
                                             for lane in rl) for rl in d["lanes"]))

    @classmethod
    def _from_head(cls, d: dict, lanes: tuple) -> "Schedule":
        """The schedule of :meth:`_head`'s fields in ``d`` with ``lanes``."""
        if d.get("schema") not in READABLE_SCHEMAS:
            raise ScheduleError(f"schedule schema {d.get('schema')!r}: expected one of "
                                f"{', '.join(READABLE_SCHEMAS)} (a newer collectx wrote it?)")
        return cls(collective=d["collective"], nranks=int(d["nranks"]),
                   nchunks=int(d["nchunks"]), lanes=lanes, root=int(d.get("root", 0)),
                   inplace=bool(d.get("inplace", False)),
                   scratch_units=tuple(d.get("scratch_units", ())),
                   algorithm=d.get("algorithm", ""), meta=_freeze(d.get("meta", {})),
                   host_units=tuple(int(u) for u in d.get("host_units", ())))

    def to_packed(self) -> dict:
        """:meth:`to_dict` for machines rather than people: ``code`` holds every instruction as
        little-endian int64 words (``bytes``; the grammar is in native/python/cx_unpack.c),
        ops and buffers by their index in :data:`OPS` and :data:`BUFFERS`, engine calls'
        ``engine_op`` by its index in ``engine_ops``. Plan caches and plan sharing read whole
        schedules of 10^4-10^5 instructions; from words, with
        ``collectx._fastpath.unpack_words``, only the objects kept are made.

        >>> s = Schedule("broadcast", 2, 1, ((Lane(()),), (Lane((Instr("copy",
        ...     Ref(1, "output", 0), (Ref(0, "input", 0),)),)),)))
        >>> p = s.to_packed()
        >>> len(p["code"]) // 8, p["engine_ops"]   # 5 counts, an instruction of 12 words
        (17, [])
        >>> Schedule.from_packed(p) == s
        True
        """
        from .._native import compiled_helper
        native, engines = compiled_helper("pack_words"), {}
        if native is not None:
            code = native(self.lanes, OP_INDEX, BUFFER_INDEX, engines)
        else:
            code = _words_bytes(_pack_words(self.lanes, engines))
        return dict(self._head(), engine_ops=list(engines), code=code)

    @classmethod
    def from_packed(cls, d: dict) -> "Schedule":
        """The schedule of :meth:`to_packed`'s data. ValueError, TypeError or IndexError when
        its words do not parse."""
        engines = tuple(str(e) for e in d.get("engine_ops", ()))
        return cls._from_head(d, _lanes_of_words(d["code"], engines))

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), **kw)

    @classmethod
    def from_json(cls, text: str) -> "Schedule":
        return cls.from_dict(json.loads(text))


BUFFER_INDEX = {b: i for i, b in enumerate(BUFFERS)}   # how words name buffers and ops
OP_INDEX = {o: i for i, o in enumerate(OPS)}
_BUFFER_AT = dict(enumerate(BUFFERS))   # KeyError, not a wrap-around, for a bad index
_OP_AT = dict(enumerate(OPS))


@dataclasses.dataclass(frozen=True, eq=False)
class PackedSchedule:
    """A schedule whose instructions are still :meth:`Schedule.to_packed`'s words (``code``);
    ``head``: the schedule's other fields (its lanes a placeholder, one empty lane per rank).

    Why: a planner simulates many candidate schedules and keeps one. A candidate made straight
    as words (``collectx._fastpath.lower_words``, the tree emitter) and simulated from them
    (:func:`._flat.flat_tasks`) costs no Python object per instruction, where 10^4-10^5 of
    them, built, read back and freed, took a third of an 8-GPU plan. :meth:`unpacked` makes
    the one kept a :class:`Schedule`. Its fields but ``lanes`` (and what reads them, such
    as ``n_instructions``) read through to ``head``; the rest raise AttributeError.

    >>> s = Schedule("broadcast", 2, 1, ((Lane(()),), (Lane((Instr("copy",
    ...     Ref(1, "output", 0), (Ref(0, "input", 0),)),)),)))
    >>> p = PackedSchedule(s, s.to_packed()["code"])
    >>> p.nranks, p.unpacked() == s
    (2, True)
    """

    head: Schedule
    code: bytes

    def __getattr__(self, name: str):
        if name not in _HEAD:   # a placeholder's lanes would read as no instructions at all
            raise AttributeError(f"a PackedSchedule has no {name}: call unpacked() for the "
                                 f"Schedule")
        return getattr(self.head, name)

    def unpacked(self) -> Schedule:
        return dataclasses.replace(self.head, lanes=_lanes_of_words(self.code, ()))


_HEAD = frozenset(f.name for f in dataclasses.fields(Schedule)) - {"lanes"} | {
    "uses_host", "meta_dict", "units"}


def _lanes_of_words(code: bytes, engines: tuple) -> tuple:
    """The lanes of :meth:`Schedule.to_packed`'s words (``engines``: its ``engine_ops``)."""
    from .._native import compiled_helper
    native = compiled_helper("unpack_words")
    if native is not None:
        return native(code, OPS, BUFFERS, engines, Instr, Ref, Dep, Lane)
    return _unpack_words(code, engines)


def _pack_words(lanes, engines: dict) -> list:
    """``collectx._fastpath.pack_words`` in Python: the words as ints."""
    out = [len(lanes)]
    for rank in lanes:
        out.append(len(rank))
        for lane in rank:
            out.append(len(lane.instrs))
            for ins in lane.instrs:
                d = ins.dst
                out += (OP_INDEX[ins.op], d[0], BUFFER_INDEX[d[1]], d[2], d[3], len(ins.srcs))
                for r in ins.srcs:
                    out += (r[0], BUFFER_INDEX[r[1]], r[2], r[3])
                out.append(len(ins.deps))
                for x in ins.deps:
                    out += x
                if ins.engine_op is None:
                    out.append(-1)
                else:
                    out += (engines.setdefault(ins.engine_op, len(engines)), len(ins.group),
                            *ins.group)
    return out


def _words_bytes(words: list) -> bytes:
    a = array.array("q", words)
    if sys.byteorder == "big":
        a.byteswap()
    return a.tobytes()


def _unpack_words(code: bytes, engines: tuple) -> tuple:
    """``collectx._fastpath.unpack_words`` in Python (tuples made directly: the named
    tuples' constructors cost twice as much)."""
    if len(code) % 8:
        raise ValueError(f"{len(code)} bytes are not whole 8-byte words")
    a = array.array("q")
    a.frombytes(code)
    if sys.byteorder == "big":
        a.byteswap()
    words = iter(a.tolist())
    new, engine_at = tuple.__new__, dict(enumerate(engines))

    def word() -> int:
        for w in words:
            return w
        raise ValueError("the words end early (truncated)")

    def count() -> int:
        n = word()
        if not 0 <= n <= len(a):
            raise ValueError(f"a count of {n} in {len(a)} words")
        return n

    def ref() -> Ref:
        return new(Ref, (word(), _BUFFER_AT[word()], word(), word()))

    def instr() -> Instr:
        op, dst = _OP_AT[word()], ref()
        srcs = tuple(ref() for _ in range(count()))
        deps = tuple(new(Dep, (word(), word(), word())) for _ in range(count()))
        e = word()
        engine = (None, ()) if e == -1 else (engine_at[e], tuple(word() for _ in range(count())))
        return new(Instr, (op, dst, srcs, deps, *engine))
    lanes = tuple(tuple(Lane(tuple(instr() for _ in range(count()))) for _ in range(count()))
                  for _ in range(count()))
    if next(words, None) is not None:
        raise ValueError("words left after the last rank")
    return lanes


def alias(s: Schedule, ref: Ref) -> Ref:
    """Where ``ref`` really lives when the schedule runs in place.

    In place, output is the storage: allreduce/broadcast/reduce input *is* the output;
    allgather's input is the rank's own slot of the output; reduce_scatter's output is the rank's
    own slot of the input (as NCCL defines in-place for these collectives).
    """
    if not s.inplace or ref.buf in STAGING:
        return ref
    coll, c = s.collective, s.nchunks
    if coll in ("allreduce", "broadcast", "reduce", "sendrecv") and ref.buf == "input":
        return Ref(ref.rank, "output", ref.chunk, ref.count)
    if coll == "allgather" and ref.buf == "input":
        return Ref(ref.rank, "output", ref.rank * c + ref.chunk, ref.count)
    if coll == "reduce_scatter" and ref.buf == "output":
        return Ref(ref.rank, "input", ref.rank * c + ref.chunk, ref.count)
    return ref


def _freeze(d: dict) -> tuple:
    return tuple(sorted((k, _deep_tuple(v)) for k, v in d.items()))


def _deep_tuple(v):
    if isinstance(v, list):
        return tuple(_deep_tuple(x) for x in v)
    if isinstance(v, dict):
        return _freeze(v)
    return v


def _jsonable(v):
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v
