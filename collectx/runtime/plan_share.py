"""Plans made once per communicator: rank 0 plans (or reads the disk cache) and publishes the
schedule in the rendezvous store; every other rank reads it from there.

Why: planning an 8-GPU allocation takes up to about a second. Every rank planning alike paid
that once per rank (eight times over on a machine with fewer cores than ranks), and ranks could
only agree on the schedule because the planner is deterministic. Now rank 0 pays once, from
:mod:`.plan_cache` once per machine, and the ranks cannot disagree.

Collectives are issued in the same order on every rank, so every rank reaches a new (collective,
size class, root) at the same call; its schedule lives under one store key of the communicator
(one per attempt: a call that failed to plan may be made again, and plan then).
Rank 0 never waits: it publishes (one ``set``) and goes on. The others ``get`` the key, in slices
of up to 50 ms: between slices ``watch`` (the engine's) raises when rank 0 will never publish
(it aborted this call, failed, closed, died, or makes another call in this one's place), so a
peer's bad argument still gives ``PeerAborted``, and calls that differ ``CollectiveMismatch``,
at once rather than a timeout. A first call so costs rank 0 one store round
trip, and another rank one ``get`` if rank 0 was done first, one more per slice it waited;
later calls of the size class never touch the store (:class:`SharedPlans` remembers every
schedule). Ranks that are threads of one process decode the published bytes once between them
(:data:`.plan_cache.DECODED`), each checking the key against its own. A failed plan is
published too, and raised on every rank.
"""

from __future__ import annotations

import dataclasses
import json
import time
import zlib
from typing import Callable

import collectx

from .. import errors
from ..errors import PlanError, Timeout
from ..schedule.ir import SCHEMA, Schedule
from .plan_cache import (DECODED, FORMAT, BadEntry, Entry, PlanCache, PlanKey, encode,
                         load_entry, parse, plan_key)

FIRST_SLICE_S = 0.001   # a waiting rank's first store get; doubled up to LAST_SLICE_S
LAST_SLICE_S = 0.05


@dataclasses.dataclass(frozen=True, slots=True)
class Planned:
    """A planner schedule and where this rank got it: "planned", "disk cache" (rank 0) or
    "rank 0" (read from the store); ``seconds`` it took to get."""

    schedule: Schedule
    source: str
    seconds: float

    def describe(self) -> str:
        """How the schedule came, for the INFO line.

        >>> s = Schedule("allreduce", 1, 1, ((),))
        >>> Planned(s, "planned", 0.25).describe(), Planned(s, "disk cache", 0.004).describe()
        ('planned in 0.250 s', 'read from the disk cache in 0.004 s')
        """
        if self.source == "planned":
            return f"planned in {self.seconds:.3f} s"
        if self.source == "rank 0":
            return f"received from rank 0 in {self.seconds:.3f} s"
        return f"read from the {self.source} in {self.seconds:.3f} s"


class SharedPlans:
    """The planner schedules of one communicator's rank, by (collective, size class, root).

    ``executor`` ("cpu" or "cuda") and ``algo`` (COLLECTX_ALGO) are fixed per communicator;
    ``store`` None plans on every rank, without the disk cache (as before sharing).
    """

    def __init__(self, executor: str, rank: int, nranks: int, store=None, prefix: str = "",
                 timeout: float = 300.0, cache_dir: str | None = None,
                 algo: str | None = None):
        self.executor, self.rank, self.nranks = executor, rank, nranks
        self.store, self.prefix, self.timeout, self.algo = store, prefix, timeout, algo
        self.cache = PlanCache(cache_dir if store is not None and rank == 0 else None)
        self._known: dict[tuple, Planned] = {}
        self._attempts: dict[tuple, int] = {}   # published planning errors, by key
        self._base_key: tuple | None = None   # (topology object, a PlanKey on it)

    def get(self, collective: str, nbytes: int, root: int, topology: Callable,
            planner: Callable, watch: Callable[[], None] | None = None) -> Planned:
        """The schedule of ``collective`` of ``nbytes`` per rank (its size class) at ``root``.

        ``topology()`` gives the topology to plan on (called on rank 0 only); ``planner(topo)``
        makes the schedule; ``watch()`` raises while another rank waits in vain (see the module
        notes).
        """
        key = (collective, int(nbytes).bit_length(), root)
        known = self._known.get(key)
        if known is None:
            t0 = time.perf_counter()
            if self.store is None:
                schedule, source = planner(topology()), "planned"
            elif self.rank == 0:
                schedule, source = self._lead(key, nbytes, topology, planner)
            else:
                schedule, source = self._follow(key, watch), "rank 0"
            known = self._known[key] = Planned(schedule, source, time.perf_counter() - t0)
        return known

    def known(self, collective: str, nbytes: int, root: int) -> Planned | None:
        """The schedule :meth:`get` gave for this size class, if any (for the INFO line)."""
        return self._known.get((collective, int(nbytes).bit_length(), root))

    # -- rank 0 ---------------------------------------------------------------------------------
    def _lead(self, key: tuple, nbytes: int, topology, planner) -> tuple[Schedule, str]:
        """Rank 0: the disk cache's entry, else a new plan; published either way."""
        store_key = self._store_key(key)
        collective, _, root = key
        try:
            topo = topology()
            entry = self._disk_key(topo, collective, nbytes, root)
            hit = self.cache.load(entry)
            if hit is not None:
                self.store.set(store_key, hit[1])
                return hit[0], "disk cache"
            schedule = planner(topo)
        except Exception as e:  # every rank raises it, not only this one
            self.store.set(store_key, _failure(e))
            self._failed(key)
            raise
        blob = encode(entry, schedule, nbytes)
        self.store.set(store_key, blob)      # peers first: the file can wait
        self.cache.write(entry, blob)
        return schedule, "planned"

    def _disk_key(self, topo, collective, nbytes, root) -> PlanKey:
        """The disk cache key; the topology's digest is computed once per topology object."""
        if self._base_key is None or self._base_key[0] is not topo:
            self._base_key = (topo, plan_key(topo, self.nranks, collective, nbytes, root=root,
                                             algo=self.algo, executor=self.executor))
        return dataclasses.replace(self._base_key[1], collective=collective,
                                   size_class=int(nbytes).bit_length(), root=root)

    # -- other ranks ----------------------------------------------------------------------------
    def _follow(self, key: tuple, watch) -> Schedule:
        """Another rank: rank 0's published schedule (or its planning error)."""
        store_key = self._store_key(key)
        blob = self._await(store_key, watch)
        collective, size_class, root = key
        expected = {"executor": self.executor, "collective": collective,
                    "nranks": self.nranks, "size_class": size_class, "root": root,
                    "algo": self.algo, "version": collectx.__version__, "schema": SCHEMA}
        try:
            # decoded once per process: thread ranks share the schedule (see DecodeMemo)
            got = DECODED.get(blob, lambda b: _received(b, expected))
            if not isinstance(got, Entry):
                self._failed(key)
                raise _published_failure(got)
            return got.schedule_for(expected)    # this rank's key, even if another decoded
        except BadEntry as e:
            raise PlanError(f"rank {self.rank}: the plan rank 0 published under {store_key!r} "
                            f"is unusable: {e}; expected every rank to run the same collectx "
                            f"with the same COLLECTX_ALGO") from None

    def _await(self, store_key: str, watch) -> bytes:
        deadline = time.monotonic() + self.timeout
        pause = FIRST_SLICE_S
        while True:
            try:
                return self.store.get(store_key, pause)
            except Timeout:
                pass
            if watch is not None:
                watch()
            if time.monotonic() >= deadline:
                raise Timeout(f"rank {self.rank}: rank 0 did not publish the plan "
                              f"{store_key!r} within {self.timeout:g} s; expected it to plan "
                              f"the same collective (every rank makes the same calls in the "
                              f"same order); check that rank 0 runs and is not stuck, or "
                              f"raise COLLECTX_TIMEOUT")
            pause = min(2 * pause, LAST_SLICE_S)

    def _store_key(self, key: tuple) -> str:
        """Where the plan of ``key`` (collective, size class, root) is published: one key per
        attempt, since a call that failed to plan may be made again and plan then."""
        collective, size_class, root = key
        return (f"{self.prefix}/plan/{self.executor}/{collective}/{size_class}/{root}/"
                f"{self.algo or 'auto'}/{self._attempts.get(key, 0)}")

    def _failed(self, key: tuple) -> None:
        """A planning error of ``key`` was published (rank 0) or read (the others): every rank
        counts it, so the next attempt meets under a new store key, not the old error."""
        self._attempts[key] = self._attempts.get(key, 0) + 1

    # -- aborted calls (CUDA: its windows cannot be read without a device copy) --------------
    def mark_aborted(self, seq: int) -> None:
        """Rank 0 rejected call ``seq``: ranks waiting for its plan stop (:meth:`aborted`)."""
        if self.store is not None and self.rank == 0:
            self.store.set(f"{self.prefix}/plan/aborted/{seq}", b"1")

    def aborted(self, seq: int) -> bool:
        return self.store is not None and self.store.check(f"{self.prefix}/plan/aborted/{seq}")


def _received(blob: bytes, expected: dict) -> Entry | dict:
    """What rank 0 published: its entry, checked against ``expected``, or its planning error's
    record. Parsed once: the largest schedules hold 10^5 instructions."""
    data = parse(blob)
    return data if "error" in data else load_entry(data, expected)


def _failure(e: Exception) -> bytes:
    """What rank 0 publishes when it cannot plan: its error's class and message, in an entry
    of the plan cache's format (so a rank parses what it reads once)."""
    record = {"format": FORMAT, "error": type(e).__name__, "message": str(e)}
    return zlib.compress(json.dumps(record).encode(), 1)


def _published_failure(record: dict) -> Exception:
    """Rank 0's planning error, rebuilt as its collectx class (PlanError otherwise).

    >>> print(_published_failure(parse(_failure(errors.NoFeasiblePlan("GPU3 is cut off")))))
    rank 0 could not plan: GPU3 is cut off
    >>> type(_published_failure(parse(_failure(KeyError("x"))))).__name__
    'PlanError'
    """
    cls = getattr(errors, str(record["error"]), None)
    if not (isinstance(cls, type) and issubclass(cls, errors.CollectXError)):
        cls = PlanError
    message = record.get("message", "")
    if cls is PlanError and record["error"] != "PlanError":
        message = f"{record['error']}: {message}"
    return cls(f"rank 0 could not plan: {message}")
