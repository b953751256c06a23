"""Start ranks on this host: ``launch(fn, nprocs)`` (functions) and the process group behind
``python -m collectx.run`` (scripts).

Each rank is a fresh process with ``COLLECTX_RANK``, ``COLLECTX_WORLD_SIZE`` and
``COLLECTX_RDZV_DIR`` set, so ``collectx.init()`` inside it just works. The launcher watches every
rank; when one fails it gives the others ``grace`` seconds to notice (they raise PeerFailure /
PeerAborted on their own) and then terminates them. SIGINT/SIGTERM are forwarded to the ranks.
Whatever happens, the rendezvous directory is removed and shared-memory segments created by the
ranks are swept. ``bind="core"`` pins rank r to the r-th allowed CPU when the ranks fit, as mpirun
does by default (:mod:`collectx.runtime.affinity`).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import shutil
import signal
import time
import traceback
from multiprocessing.connection import wait as mp_wait

from ..errors import ArgumentError, RankFailed, integral
from .affinity import bind_process, check_policy
from .bootstrap import is_seconds, rendezvous_dir
from .window import sweep_stale

DEFAULT_GRACE_S = 3.0
_EOF = object()


def rank_env(rank: int, size: int, rdzv: str) -> dict[str, str]:
    """Environment variables that make ``collectx.init()`` join rank ``rank`` of ``size``.

    >>> rank_env(1, 4, "/tmp/r")["COLLECTX_RANK"]
    '1'
    """
    return {"COLLECTX_RANK": str(rank), "COLLECTX_WORLD_SIZE": str(size),
            "COLLECTX_LOCAL_RANK": str(rank), "COLLECTX_RDZV_DIR": rdzv}


def launch(fn, nprocs: int, args: tuple = (), *, grace: float = DEFAULT_GRACE_S,
           timeout: float | None = None, bind: str = "none") -> list:
    """Run ``fn(*args)`` in ``nprocs`` fresh processes and return their results, by rank.

    Parameters
    ----------
    fn : callable
        A picklable (module-level) function; it calls ``collectx.init()`` to join the others.
    nprocs : int
        Number of ranks.
    args : tuple
        Positional arguments passed to every rank.
    grace : float
        Seconds the other ranks get to finish after one fails, before they are terminated.
    timeout : float, optional
        Wall-clock limit for the whole group (None: no limit).
    bind : {"none", "core"}
        "core" pins rank r to the r-th CPU this process may use, when there are at least
        ``nprocs`` of them (like ``mpirun --bind-to core``); "none" leaves it to the scheduler.

    Returns
    -------
    list
        ``fn``'s return value of each rank.

    Raises
    ------
    RankFailed
        The first rank that raised or died: its rank, exception type and remote traceback.
    """
    if (integral(nprocs) or 0) < 1:
        raise ArgumentError(f"nprocs={nprocs!r}: expected a positive int")
    nprocs = int(nprocs)   # a numpy count too
    args = _checked_call(fn, args, grace, timeout)
    check_policy(bind)
    ctx = mp.get_context("spawn")
    rdzv = rendezvous_dir()
    procs, conns = [], []
    try:
        for r in range(nprocs):
            parent, child = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_child, args=(fn, args, rank_env(r, nprocs, rdzv), child, bind),
                            name=f"collectx-rank{r}", daemon=True)
            try:
                p.start()   # pickles fn and args for the spawned rank, once per rank
            except (pickle.PicklingError, AttributeError, TypeError) as e:
                parent.close()
                child.close()
                raise ArgumentError(f"fn={getattr(fn, '__qualname__', fn)!r} and its args must "
                                    f"pickle to reach the ranks ({e}); define fn at module "
                                    f"level") from None
            child.close()
            procs.append(p)
            conns.append(parent)
        with _forward_signals([p.pid for p in procs]):
            return _collect(procs, conns, grace, timeout)
    finally:
        _stop(procs, 0.0)
        shutil.rmtree(rdzv, ignore_errors=True)
        sweep_stale(pids={p.pid for p in procs if p.pid})


def _checked_call(fn, args, grace, timeout) -> tuple:
    """``args`` as a tuple, once ``fn`` is callable and the limits are seconds: refused here, a
    bad call would fail in every rank instead (or, for a negative timeout, stop them all at
    once). Whether both pickle, the first rank's start tells."""
    if not callable(fn):
        raise ArgumentError(f"fn={fn!r}: expected a callable, a module-level function that "
                            f"calls collectx.init()")
    if not isinstance(args, (tuple, list)):
        raise ArgumentError(f"args={args!r}: expected a tuple of fn's positional arguments, "
                            f"such as (x,)")
    if not is_seconds(grace) or grace < 0:
        raise ArgumentError(f"grace={grace!r}: expected seconds >= 0")
    if timeout is not None and (not is_seconds(timeout) or timeout <= 0):
        raise ArgumentError(f"timeout={timeout!r}: expected seconds > 0 (or None: no limit)")
    return tuple(args)


def _child(fn, args, env, conn, bind="none") -> None:
    os.environ.update(env)
    rank = int(env["COLLECTX_RANK"])
    try:
        bind_process(rank, int(env["COLLECTX_WORLD_SIZE"]), bind)
        value = fn(*args)
        msg = ("ok", value)
        try:
            payload = pickle.dumps(msg)
        except Exception as e:  # an unpicklable result is the rank's failure
            payload = pickle.dumps(("err", type(e).__name__, f"result not picklable: {e}",
                                    traceback.format_exc(), None))
    except BaseException as e:  # reported to the parent, which re-raises it
        payload = pickle.dumps(("err", type(e).__name__, str(e), traceback.format_exc(),
                                _try_pickle(e)))
    conn.send_bytes(payload)
    conn.close()
    del rank


def _try_pickle(e: BaseException) -> bytes | None:
    try:
        data = pickle.dumps(e)
        pickle.loads(data)
        return data
    except Exception:
        return None


def _collect(procs, conns, grace: float, timeout: float | None) -> list:
    results: dict[int, object] = {}
    failure: RankFailed | None = None
    fail_time = None
    deadline = None if timeout is None else time.monotonic() + timeout
    live = {p.sentinel: r for r, p in enumerate(procs)}
    readers = {c: r for r, c in enumerate(conns)}
    # A rank that exited may leave its report (or its end of file) to be read after its
    # sentinel: the loop goes on until every report is read, not only every rank reaped.
    while live or readers:
        now = time.monotonic()
        if failure is not None and now - fail_time > grace:
            break
        if deadline is not None and now > deadline and failure is None:
            failure, fail_time = RankFailed(f"launch: ranks {sorted(live.values())} still "
                                            f"running after {timeout} s; expected them to "
                                            f"finish; raise the timeout", rank=None), now
            break
        ready = mp_wait(list(live) + list(readers), timeout=0.05)
        for obj in ready:
            if obj in readers:
                r = readers.pop(obj)
                got = _receive(obj, r)
                if got is _EOF:  # died without a report: its exit code says how
                    procs[r].join(2.0)
                    got = _died(r, procs[r].exitcode)
                if isinstance(got, RankFailed):
                    failure, fail_time = failure or got, fail_time or now
                else:
                    results[r] = got
        for obj in ready:
            if obj in live and obj not in readers:
                r = live.pop(obj)
                procs[r].join()
                if r not in results and failure is None and _no_report(readers, conns[r]):
                    failure, fail_time = _died(r, procs[r].exitcode), now
    if failure is not None:
        raise failure
    return [results[r] for r in range(len(procs))]


def _no_report(readers, conn) -> bool:
    if conn not in readers:
        return False  # already read
    if conn.poll():
        return False  # the report is waiting; the reader loop takes it next round
    readers.pop(conn)
    return True


def _receive(conn, rank: int):
    try:
        msg = pickle.loads(conn.recv_bytes())
    except (EOFError, OSError):
        return _EOF
    if msg[0] == "ok":
        return msg[1]
    _, tname, text, tb, blob = msg
    err = RankFailed(f"rank {rank} raised {tname}: {text}\n--- remote traceback (rank {rank}) "
                     f"---\n{tb}", rank=rank, exc_type=tname, remote_traceback=tb)
    if blob is not None:
        err.__cause__ = pickle.loads(blob)
    return err


def _died(rank: int, exitcode: int | None) -> RankFailed:
    how = (f"was killed by signal {signal.Signals(-exitcode).name}" if exitcode and exitcode < 0
           else f"exited with code {exitcode} without reporting a result")
    return RankFailed(f"rank {rank} {how}; expected it to return; see its output above",
                      rank=rank, exc_type="ProcessDied")


def _stop(procs, grace: float) -> None:
    """Terminate ranks still running (SIGTERM, then SIGKILL after a second) and reap them."""
    for p in procs:
        if p.pid and p.is_alive():
            p.terminate()
    end = time.monotonic() + 1.0
    for p in procs:
        if p.pid:
            p.join(max(0.0, end - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join()


class _forward_signals:
    """Forward SIGINT/SIGTERM to the ranks while the launcher waits (main thread only)."""

    def __init__(self, pids: list[int]):
        self.pids, self.old = pids, {}

    def __enter__(self):
        import threading
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.old[sig] = signal.signal(sig, self._handler)
        return self

    def _handler(self, signum, frame):
        for pid in self.pids:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass
        handler = self.old.get(signum)
        if callable(handler):
            handler(signum, frame)
        else:
            raise KeyboardInterrupt(f"launcher got signal {signal.Signals(signum).name}")

    def __exit__(self, *exc):
        for sig, h in self.old.items():
            signal.signal(sig, h)
