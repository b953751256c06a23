"""The on-disk plan cache: the planner's schedules kept across runs, one file per entry.

Why: planning a large allocation (simulating the candidate packings of 8 GPUs) takes up to about
a second; NCCL searches its graphs once at init, and a machine should pay for a plan once, not in
every run. Rank 0 looks here before it plans and writes here after (see :mod:`.plan_share`).

An entry is keyed by everything its schedule depends on: the topology's content
(:func:`topology_fingerprint`), the ranks' node ids, the collective, the size class
(``nbytes.bit_length()``), root, algorithm, in-place, the executor ("cpu" or "cuda": the CUDA
executor plans without host staging), the collectx version, the schedule schema and a digest of
the planner's own code (:func:`code_fingerprint`, so an edited planner never serves its old
plans). The file name is the key's digest; the file is zlib-compressed (zlib's checksum catches
a damaged or truncated file): one line of JSON holding the key again, the versions and
``Schedule.to_packed()`` but its instructions, then those as int64 words (JSON made a million
Python lists and ints of them before the schedule's own tuples were built). A file that does
not check out is reported with a :class:`PlanCacheWarning` naming it and what was wrong, and
is planned again and replaced: a cache entry can cost a plan, never a wrong collective. Entry bytes decoded lately in this
process are not decoded again (:class:`DecodeMemo`: thread ranks share rank 0's read), but
their key is checked for every reader.

>>> import tempfile
>>> from collectx.planner import make_schedule
>>> from collectx.topology import ring
>>> key = plan_key(ring(4), 4, "allgather", 1 << 20, executor="cpu")
>>> with tempfile.TemporaryDirectory() as d:
...     cache = PlanCache(d)
...     blob = cache.save(key, make_schedule(ring(4), "allgather", 4, 1 << 20), 1 << 20)
...     cache.load(key)[0] == decode(blob, key)
True
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import json
import os
import pathlib
import tempfile
import threading
import types
import warnings
import zlib
from typing import Callable, TypeVar

from .._gc import paused
from ..schedule.ir import SCHEMA, Schedule

FORMAT = "collectx.plan_cache/3"   # /3: the instructions as words after the JSON
_SUFFIX = ".plan"
# Graph attributes that only describe a topology: renaming a preset must not cost its plans.
_DESCRIPTIVE = frozenset(("name", "description"))
# What the planner's output depends on besides its arguments: the algorithms, the IR and the
# topology helpers (paths, subsets) they use.
_CODE_DIRS = ("planner", "schedule", "topology")


class PlanCacheWarning(RuntimeWarning):
    """A plan cache file was unreadable or stale (it is planned again), or could not be written."""


class BadEntry(ValueError):
    """Why a plan cache entry (a file, or rank 0's published plan) cannot be used."""


@dataclasses.dataclass(frozen=True, slots=True)
class PlanKey:
    """Everything a cached schedule depends on; :attr:`digest` names its file."""

    executor: str
    collective: str
    nranks: int
    size_class: int
    root: int
    algo: str | None
    inplace: bool
    topology: str
    ranks: tuple[str, ...]
    version: str
    schema: str
    code: str

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["ranks"] = list(self.ranks)
        return d

    @property
    def digest(self) -> str:
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    @property
    def file_name(self) -> str:
        """Readable first (``ls`` shows what is cached), unique by the digest."""
        return f"{self.executor}-{self.collective}-{self.size_class}-{self.digest[:32]}{_SUFFIX}"


def plan_key(topology, nranks: int, collective: str, nbytes: int, *, root: int = 0,
             algo: str | None = None, inplace: bool = False, executor: str = "cpu") -> PlanKey:
    """The key of the schedule ``make_schedule(topology, collective, nranks, nbytes, ...)``
    gives ``executor``; ``topology`` None is make_schedule's one-host default.

    >>> from collectx.topology import ring
    >>> k = plan_key(ring(4), 4, "allreduce", 1000, executor="cuda")
    >>> k.size_class, k.ranks, k == plan_key(ring(4), 4, "allreduce", 1023, executor="cuda")
    (10, ('GPU0', 'GPU1', 'GPU2', 'GPU3'), True)
    """
    import collectx
    ranks = ()
    if topology is not None:
        from ..topology import gpus
        ranks = tuple(gpus(topology)[:nranks])
    return PlanKey(executor=executor, collective=collective, nranks=nranks,
                   size_class=int(nbytes).bit_length(), root=root, algo=algo,
                   inplace=bool(inplace), topology=topology_fingerprint(topology), ranks=ranks,
                   version=collectx.__version__, schema=SCHEMA, code=code_fingerprint())


def topology_fingerprint(topology) -> str:
    """A digest of a topology's content: every node and link with all their attributes (kind,
    bw_gbps, type, latency_us, ...) and the graph's attributes but its name and description,
    in sorted order, so two graphs built in another order agree.

    >>> from collectx.topology import ring
    >>> a, b = ring(4), ring(4)
    >>> b.graph["name"] = "renamed"
    >>> topology_fingerprint(a) == topology_fingerprint(b), topology_fingerprint(None)
    (True, 'none')
    >>> b.edges["GPU0", "GPU1"]["bw_gbps"] *= 2
    >>> topology_fingerprint(a) == topology_fingerprint(b)
    False
    """
    if topology is None:
        return "none"
    nodes = sorted([str(n), attrs] for n, attrs in _sortable(topology.nodes(data=True)))
    edges = sorted([str(u), str(v), attrs] for u, v, attrs in _sortable(topology.edges(data=True)))
    graph = {k: v for k, v in topology.graph.items() if k not in _DESCRIPTIVE}
    text = json.dumps({"nodes": nodes, "edges": edges, "graph": graph}, sort_keys=True,
                      separators=(",", ":"), default=_plain)
    return hashlib.sha256(text.encode()).hexdigest()


def _sortable(items):
    """(ids..., attributes as canonical JSON text): lists that sort without comparing dicts."""
    for *ids, attrs in items:
        yield (*ids, json.dumps(attrs, sort_keys=True, default=_plain))


def _plain(value):
    """JSON for what json cannot write itself: sets in a stable order, anything else by repr."""
    if isinstance(value, (set, frozenset)):
        return sorted(map(repr, value))
    return repr(value)


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """A digest of the planner's, the schedule IR's and the topology helpers' source (a few
    ms, once per process): plans of an edited planner are never read back."""
    root = pathlib.Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    try:
        for sub in _CODE_DIRS:
            for path in sorted((root / sub).rglob("*.py")):
                h.update(path.relative_to(root).as_posix().encode() + b"\0")
                h.update(path.read_bytes())
    except OSError:  # sources not on disk (a zip import): the version alone tells the code
        return "unreadable"
    return h.hexdigest()


def encode(key: PlanKey | dict, schedule: Schedule, nbytes: int) -> bytes:
    """The bytes of an entry: what a cache file holds and what rank 0 publishes in the store.
    ``nbytes``: the message size the schedule was planned for (a fact for readers)."""
    key = key.to_dict() if isinstance(key, PlanKey) else key
    packed = schedule.to_packed()
    code = packed.pop("code")
    data = {"format": FORMAT, "version": key["version"], "schema": key["schema"], "key": key,
            "planned_nbytes": int(nbytes), "schedule": packed}
    return zlib.compress(json.dumps(data, separators=(",", ":")).encode() + b"\n" + code, 1)


def decode(blob: bytes, expected: PlanKey | dict) -> Schedule:
    """The schedule of an entry whose key has every field of ``expected`` (a whole
    :class:`PlanKey`, or the fields a rank without the topology knows).

    Raises :class:`BadEntry` saying what is wrong: damaged, another format, version or schema,
    another key, or a schedule that does not match its key. Bytes this process decoded lately
    are not decoded again (:data:`DECODED`); their key is still checked against ``expected``.
    """
    entry = DECODED.get(blob, lambda b: load_entry(parse(b), expected))
    if not isinstance(entry, Entry):   # a published planning error (see .plan_share)
        raise BadEntry("it holds no schedule but a planning error")
    return entry.schedule_for(expected)


@paused
def parse(blob: bytes) -> dict:
    """An entry's JSON (:func:`encode`'s, or a published planning error's: see
    :mod:`.plan_share`), parsed once; :class:`BadEntry` if it is damaged or not an entry."""
    try:
        head, _, code = zlib.decompress(blob).partition(b"\n")
        data = json.loads(head)
    except (zlib.error, ValueError) as e:  # zlib's checksum, truncation, bad JSON or UTF-8
        raise BadEntry(f"it is damaged or truncated ({type(e).__name__}: {e})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise BadEntry(f"its format is {found!r}, expected {FORMAT!r}")
    if isinstance(data.get("schedule"), dict):
        data["schedule"]["code"] = code
    return data


@paused  # from_packed builds one tuple per instruction and ref: 10^4-10^5 of them
def load_entry(data: dict, expected: PlanKey | dict) -> "Entry":
    """The key and schedule of a :func:`parse`-d entry, checked against ``expected`` (see
    :func:`decode`); the key is checked before the schedule is built, so a foreign entry
    costs no unpacking."""
    want = _wanted(expected)
    key = data.get("key")
    if not isinstance(key, dict):
        raise BadEntry("it has no key")
    _check_key(key, want)
    try:
        schedule = Schedule.from_packed(data["schedule"])
    except Exception as e:  # whatever a damaged schedule makes from_packed raise
        raise BadEntry(f"its schedule does not load ({type(e).__name__}: {e})") from None
    _check_matches(schedule, want)
    return Entry(types.MappingProxyType(key), schedule)


def entry_schedule(data: dict, expected: PlanKey | dict) -> Schedule:
    """The schedule of a :func:`parse`-d entry, checked against ``expected`` (see
    :func:`decode`)."""
    return load_entry(data, expected).schedule


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class Entry:
    """A decoded entry: its key as written (read-only) and its schedule. Both are immutable,
    so the ranks of one process that receive the same bytes can share one."""

    key: types.MappingProxyType
    schedule: Schedule

    def schedule_for(self, expected: PlanKey | dict) -> Schedule:
        """The schedule, if the entry serves ``expected``; :class:`BadEntry` otherwise. Run
        by every reader, also on an entry another reader decoded: each checks its own key."""
        want = _wanted(expected)
        _check_key(self.key, want)
        _check_matches(self.schedule, want)
        return self.schedule


def _wanted(expected: PlanKey | dict) -> dict:
    return expected.to_dict() if isinstance(expected, PlanKey) else expected


def _check_key(key, want: dict) -> None:
    """The entry's key has every field of ``want`` (version and schema said first: the
    likeliest reason for a mismatch, and the one whose fix differs)."""
    for field in ("version", "schema"):
        if field in want and key.get(field) != want[field]:
            raise BadEntry(f"it was written for {field} {key.get(field)!r}, this is "
                           f"{want[field]!r}")
    for field, value in want.items():
        if key.get(field, _MISSING) != (list(value) if isinstance(value, tuple) else value):
            raise BadEntry(f"it holds another plan: {field} {key.get(field)!r}, expected "
                           f"{value!r}")


_MISSING = object()


def _check_matches(schedule: Schedule, want: dict) -> None:
    """The schedule serves the key it was filed under (a last guard against a wrong
    collective)."""
    seen = {"collective": schedule.collective, "nranks": schedule.nranks,
            "root": schedule.root, "inplace": schedule.inplace}
    for field, value in seen.items():
        if field in want and want[field] != value:
            raise BadEntry(f"its schedule has {field} {value!r}, expected {want[field]!r}")


T = TypeVar("T")
_EMPTY = object()


class _Slot:
    """One memo entry: its value once decoded; ``lock`` is held by the reader decoding it."""

    __slots__ = ("lock", "value")

    def __init__(self):
        self.lock = threading.Lock()
        self.value = _EMPTY


class DecodeMemo:
    """What the last ``capacity`` entries' bytes decoded to in this process, by the bytes.

    Why: ranks that are threads of one process receive rank 0's entry as the same bytes, and
    decoding it (zlib, JSON, the schedule's tuples: a few ms for 6,000 instructions) under
    one GIL ran once per rank, one after another: the slowest rank waited for seven decodes.
    Now the first reader decodes and the others wait for it (on a lock, without the GIL) and
    share the result, which is immutable. Keyed by the bytes themselves, not a digest: equal
    keys are equal entries, never a collision. Only successes are kept: a reader whose decode
    raises leaves the slot empty, so every reader of damaged or foreign bytes decodes and
    raises itself. The memo holds no key check: callers check each reader's own key on the
    value (:meth:`Entry.schedule_for`).

    >>> memo, calls = DecodeMemo(2), []
    >>> [memo.get(b, lambda b: calls.append(b) or len(b)) for b in (b"ab", b"ab", b"abc")]
    [2, 2, 3]
    >>> calls
    [b'ab', b'abc']
    """

    def __init__(self, capacity: int = 8):
        self.capacity = capacity
        self._lock = threading.Lock()
        self._slots: collections.OrderedDict[bytes, _Slot] = collections.OrderedDict()

    def get(self, blob: bytes, decode: Callable[[bytes], T]) -> T:
        """``decode(blob)``, or what it gave for equal bytes lately."""
        blob = bytes(blob)
        slot = self._slot(blob)
        with slot.lock:   # one reader decodes; readers of the same bytes wait here for it
            if slot.value is _EMPTY:
                try:
                    slot.value = decode(blob)
                except BaseException:
                    self._drop(blob, slot)
                    raise
            return slot.value

    def clear(self) -> None:
        with self._lock:
            self._slots.clear()

    def __len__(self) -> int:
        return len(self._slots)

    def _slot(self, blob: bytes) -> _Slot:
        with self._lock:
            slot = self._slots.get(blob)
            if slot is None:
                slot = self._slots[blob] = _Slot()
                while len(self._slots) > self.capacity:   # the least recently used goes
                    self._slots.popitem(last=False)
            else:
                self._slots.move_to_end(blob)
            return slot

    def _drop(self, blob: bytes, slot: _Slot) -> None:
        with self._lock:
            if self._slots.get(blob) is slot:
                del self._slots[blob]


# One per process, for the disk cache's reads and the store's (rank 0's file read is then its
# thread peers' too). Small: ranks meet a new size class at the same call, so only the last
# few entries are still to be received, and a large schedule is tens of MB of tuples.
DECODED = DecodeMemo(capacity=4)


class PlanCache:
    """Plan cache entries in ``directory`` (created on first write); no I/O error escapes:
    a directory that cannot be read or written costs plans, with one warning.

    >>> PlanCache(None).load(plan_key(None, 2, "allreduce", 64)) is None
    True
    """

    def __init__(self, directory: str | os.PathLike | None):
        self.directory = None if directory is None else os.fspath(directory)
        self._warned = False

    def path(self, key: PlanKey) -> str:
        return os.path.join(self.directory, key.file_name)

    def load(self, key: PlanKey) -> tuple[Schedule, bytes] | None:
        """(schedule, entry bytes) of ``key``, or None: no entry, or one that does not check
        out (warned about, and left for :meth:`save` to replace)."""
        if self.directory is None:
            return None
        path = self.path(key)
        try:
            with open(path, "rb") as f:
                blob = f.read()
        except (FileNotFoundError, NotADirectoryError):  # no entry; a bad directory is
            return None                                   # for save() to report
        except OSError as e:
            self._warn_io(f"cannot read plan cache file {path} ({e})")
            return None
        try:
            return decode(blob, key), blob
        except BadEntry as e:
            warnings.warn(f"plan cache file {path} is ignored: {e}; planning again and "
                          f"replacing it", PlanCacheWarning, stacklevel=2)
            return None

    def save(self, key: PlanKey, schedule: Schedule, nbytes: int) -> bytes:
        """Write the entry of ``key`` atomically (a temporary file in the same directory, then
        a rename: readers see a whole entry or none) and return its bytes."""
        blob = encode(key, schedule, nbytes)
        self.write(key, blob)
        return blob

    def write(self, key: PlanKey, blob: bytes) -> None:
        """Write an entry already encoded (:func:`encode`); warns once if it cannot."""
        if self.directory is not None:
            try:
                self._write(self.path(key), blob)
            except OSError as e:
                self._warn_io(f"cannot write plan cache directory {self.directory} ({e})")

    def _write(self, path: str, blob: bytes) -> None:
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=_SUFFIX, dir=self.directory)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def _warn_io(self, what: str) -> None:
        if not self._warned:  # once per cache: every size class would say the same
            self._warned = True
            warnings.warn(f"{what}; plans are made again in every run; set COLLECTX_CACHE_DIR "
                          f"to a writable directory, or to 'off' to keep no plan cache",
                          PlanCacheWarning, stacklevel=3)
