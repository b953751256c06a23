"""``collectx-perf`` from arguments to exit status.

Stages, one function each: parse options -> simulate, or measure (on ranks started here, or on the
ranks of mpirun / torchrun / ``python -m collectx.run``) -> run peers -> print the table -> write
JSON / CSV / plot / HTML. The exit status is 1 when any element was wrong, 2 on a usage error.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

from ..errors import ArgumentError, CollectXError, ConfigError, command_error
from . import peers as peer_runners
from .options import Options, parse_args
from .rounds import median_rows
from .report import library_versions, machine_info, write_csv, write_json
from .sweep import run_sweep, stderr_progress
from .table import format_table, total_wrong
from .window import window_for

# Variables by which a launcher tells a process its rank: then the sweep uses those ranks.
LAUNCHER_VARS = (("OMPI_COMM_WORLD_SIZE",), ("WORLD_SIZE", "RANK"), ("COLLECTX_RANK",))


def launched_externally(env=None) -> bool:
    """True when mpirun, torchrun or ``python -m collectx.run`` started this process.

    >>> launched_externally({"WORLD_SIZE": "2", "RANK": "0"}), launched_externally({})
    (True, False)
    """
    env = os.environ if env is None else env
    return any(all(name in env for name in names) for names in LAUNCHER_VARS)


def _collectx_rank(spec: dict) -> list[dict]:
    # Runs in every rank process that collectx.launch starts; must stay a module-level function.
    import collectx
    _apply_setting("COLLECTX_ALGO", spec.get("algo"))
    _apply_setting("COLLECTX_WINDOW_BYTES", spec.get("window_bytes"))
    if spec.get("device") == "cuda":
        _bind_gpu()
    comm = collectx.init(device=spec.get("device", "cpu"))
    try:
        progress = stderr_progress if spec.get("progress") else None
        return run_sweep(comm, spec, progress=progress, on_row=_row_writer(spec.get("rows_file")))
    finally:
        comm.close()


def _row_writer(path: str | None):
    """``on_row`` that appends each finished row to ``path`` as a JSON line (None: no file)."""
    if path is None:
        return None

    def write(row: dict) -> None:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")
    return write


def _rows_so_far(path: str) -> list[dict]:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except OSError:
        return []


def _check_algo(algo: str | None) -> None:
    if algo is None:
        return
    from ..planner import ALGORITHMS
    if algo not in ALGORITHMS:
        raise ArgumentError(f"--algo {algo!r}: expected one of {', '.join(sorted(ALGORITHMS))}")


def _apply_setting(name: str, value) -> None:
    # --algo, and a window that holds the sweep's buffers (collectx.perf.window), reach the
    # runtime the way every knob does: through its COLLECTX_* variable, set in this rank
    # process before collectx.init() reads the configuration. None or 0: leave it.
    if value:
        os.environ[name] = str(value)
        from ..config import get_config
        get_config.cache_clear()


def _bind_gpu() -> None:
    # One GPU per local rank, chosen before any CUDA memory is touched.
    import torch
    local = int(os.environ.get("COLLECTX_LOCAL_RANK") or os.environ.get("LOCAL_RANK")
                or os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK") or 0)
    torch.cuda.set_device(local % torch.cuda.device_count())


def require_device(opts: Options) -> None:
    """Fail early and clearly when ``--device cuda`` has no GPU or CUDA runtime behind it."""
    if opts.device != "cuda":
        return
    import collectx
    try:
        ok = bool(collectx.cuda_available())
    except (CollectXError, ImportError, AttributeError) as exc:
        raise ConfigError(f"--device cuda: the CUDA runtime could not be checked ({exc}); "
                          "use --device cpu, or --simulate to predict a GPU machine") from None
    if not ok:
        raise ConfigError("--device cuda: no NVIDIA GPU or CUDA runtime found on this machine; "
                          "use --device cpu, or --simulate SOURCE to predict a GPU machine")
    try:
        import torch
    except ImportError:
        raise ConfigError("--device cuda: GPU buffers are torch tensors and torch is not "
                          "installed; pip install collectx[torch]") from None
    if not torch.cuda.is_available():
        raise ConfigError("--device cuda: this torch build sees no GPU (a CPU-only wheel?); "
                          "install a CUDA build of torch")


def _preamble(opts: Options, nranks: int) -> list[str]:
    auto = "by size"
    return [f"# collectx-perf  nranks {nranks}  minBytes {min(opts.sizes)}  maxBytes "
            f"{max(opts.sizes)}  sizes {len(opts.sizes)}  warmup iters: {opts.warmup or auto}  "
            f"iters: {opts.iters or auto}  validation: {opts.check}  device: {opts.device}  "
            f"algo: {opts.algo or 'auto'}  bind: {_binding(opts, nranks)}",
            f"# host {machine_info()['hostname']}  cpu {machine_info()['cpu_model']}"] + \
        _one_rank_note(nranks)


def _one_rank_note(nranks: int) -> list[str]:
    """The line that explains a table of one rank, whose busbw measures no bus."""
    from ..planner.api import no_communication
    idle = no_communication(nranks, 1)
    return [f"# {idle}: the times are local work, and busbw has no bus to measure"] \
        if idle else []


# What the preamble says of the memory collectx's rows ran on (collectx.perf.buffers).
_BUFFER_NOTES = {
    "comm.empty": "arrays from comm.empty in the shared window (used in place: zero copy)",
    "host": "ordinary memory, staged or read across processes by the runtime (comm.empty "
            "had no room for the sweep's largest buffers, COLLECTX_WINDOW_BYTES sizes the "
            "window, or no such dtype)",
    "device": "GPU memory"}


def _buffer_notes(rows: list[dict]) -> list[str]:
    """One preamble line per kind of buffer collectx's rows ran on, naming those rows."""
    kinds: dict[str, list[str]] = {}
    for row in rows:
        if row.get("buffers"):
            kinds.setdefault(row["buffers"], []).append(row["collective"])
    if len(kinds) == 1:
        (kind, _), = kinds.items()
        return [f"# collectx buffers: {_BUFFER_NOTES.get(kind, kind)}"]
    return [f"# collectx buffers ({', '.join(dict.fromkeys(colls))}): "
            f"{_BUFFER_NOTES.get(kind, kind)}" for kind, colls in kinds.items()]


def _binding(opts: Options, nranks: int) -> str:
    if launched_externally():
        return "by launcher"
    from ..runtime.affinity import effective_policy
    return effective_policy(opts.bind, nranks)


def _result(opts: Options, nranks: int, mode: str, peers: dict, skipped: dict) -> dict:
    return {"mode": mode, "nranks": nranks, "machine": machine_info(),
            "versions": library_versions(), "options": opts.spec() | {"device": opts.device, "repeat": opts.repeat},
            "peers": peers, "skipped": skipped}


def write_outputs(opts: Options, result: dict, table_text: str, topo=None) -> None:
    """Write whichever of --json, --csv, --plot and --html were asked for."""
    if opts.json:
        write_json(opts.json, result)
    if opts.csv:
        write_csv(opts.csv, result)
    if opts.plot:
        from .plot import plot_result
        plot_result(result, opts.plot)
    if opts.html:
        from .html import write_html
        write_html(opts.html, result, table_text, topo)


def run_simulated(opts: Options, out=None) -> int:
    """``--simulate``: predict the table with the planner; nothing runs on this machine."""
    from .simulate import format_simulated, load_allocation, simulate_rows
    out = out or sys.stdout
    topo, gpu_ids = load_allocation(opts.simulate, opts.gpus)
    rows = simulate_rows(topo, gpu_ids, opts.spec(),
                         progress=stderr_progress if opts.progress else None)
    text = format_simulated(rows, opts.simulate, gpu_ids)
    out.write(text)
    result = _result(opts, len(gpu_ids), "simulated", {"collectx": rows}, {})
    from ..topology import subset
    write_outputs(opts, result, text, subset(topo, list(gpu_ids)))
    return 0


def run_measured(opts: Options, out=None, launch=None) -> int:
    """Measure collectx on ``opts.nprocs`` local ranks, then the peers, and report.

    With ``--repeat N`` collectx and the peers take turns N times and each cell is the median of
    its backend's rounds (:mod:`collectx.perf.rounds`).
    """
    out = out or sys.stdout
    if launch is None:
        import collectx
        launch = collectx.launch
    _check_algo(opts.algo)
    if opts.root >= opts.nprocs:  # caught here, before any rank starts
        raise ArgumentError(f"-r {opts.root}: expected a root rank in [0, {opts.nprocs}) "
                            f"for -n {opts.nprocs}")
    rounds: dict[str, list] = {"collectx": []}
    skipped: dict[str, dict] = {}
    window_bytes = window_for(opts.spec(), opts.nprocs)
    with tempfile.TemporaryDirectory(prefix="collectx-perf-") as tmp:
        for i in range(opts.repeat):
            if opts.repeat > 1 and opts.progress:
                sys.stderr.write(f"collectx-perf: round {i + 1} of {opts.repeat}\n")
            spec = dict(opts.spec(), rows_file=os.path.join(tmp, f"rows{i}.jsonl"),
                        window_bytes=window_bytes)
            try:
                rows = launch(_collectx_rank, opts.nprocs, args=(spec,), bind=opts.bind)[0]
            except CollectXError as exc:  # show what was measured before the failure, then fail
                rows = _rows_so_far(spec["rows_file"])
                if not rows:
                    raise
                failure = str(exc).splitlines()[0]
                report_measured(opts, opts.nprocs, {"collectx": rows}, {}, out,
                                [f"# run failed after {len(rows)} rows: {failure}"], failed=True)
                return 2
            rounds["collectx"].append(rows)
            for name in opts.compare:
                if name in skipped:
                    continue  # not installed, or failed in an earlier round
                got = peer_runners.run_peer(name, spec, opts.nprocs)
                if got.rows is None:
                    skipped[name] = {"reason": got.skipped, "hint": got.hint}
                    rounds.pop(name, None)
                else:
                    rounds.setdefault(name, []).append(got.rows)
    peers = {name: median_rows(r) for name, r in rounds.items()}
    notes = [f"# each cell: median of {opts.repeat} rounds, backends taking turns"] \
        if opts.repeat > 1 else []
    return report_measured(opts, opts.nprocs, peers, skipped, out, notes)


def report_measured(opts: Options, nranks: int, peers: dict, skipped: dict, out,
                    notes: list[str] = (), failed: bool = False) -> int:
    """Print the table (and skipped peers), write the files; 1 if any result was wrong."""
    lines = _preamble(opts, nranks) + list(notes)
    for name, info in skipped.items():
        hint = f"; install: {info['hint']}" if info.get("hint") else ""
        lines.append(f"# peer {name} skipped: {info['reason']}{hint}")
    lines += _buffer_notes(peers["collectx"])
    measured = {row["collective"] for row in peers["collectx"]}
    if not failed:  # after a failure, missing collectives are simply the ones not reached
        lines += [f"# {c}: not run, this communicator does not provide it"
                  for c in opts.collectives if c not in measured]
    others = {k: v for k, v in peers.items() if k != "collectx"}
    text = format_table(peers["collectx"], others, lines)
    out.write(text)
    out.flush()
    from ..topology import host
    write_outputs(opts, _result(opts, nranks, "measured", peers, skipped), text, host(nranks))
    return 1 if total_wrong(peers["collectx"]) else 0


def run_as_rank(opts: Options, out=None) -> int:
    """Under an external launcher: this process is one rank; rank 0 reports."""
    import collectx
    out = out or sys.stdout
    _apply_setting("COLLECTX_ALGO", opts.algo)
    if opts.device == "cuda":
        _bind_gpu()
    comm = collectx.init(device=opts.device)
    try:
        progress = stderr_progress if opts.progress and comm.rank == 0 else None
        rows = run_sweep(comm, opts.spec(), progress=progress)
        status = 1 if total_wrong(rows) else 0
        if comm.rank == 0:
            skipped = {name: {"reason": "--compare needs collectx-perf to start its own ranks "
                                        "(run it without a launcher)", "hint": None}
                       for name in opts.compare}
            report_measured(opts, comm.size, {"collectx": rows}, skipped, out)
        return status
    finally:
        comm.close()


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``collectx-perf``; returns the process exit status."""
    try:
        opts = parse_args(argv)
        if opts.simulate:
            return run_simulated(opts)
        require_device(opts)
        if launched_externally():
            return run_as_rank(opts)
        return run_measured(opts)
    except (CollectXError, OSError) as exc:
        if (message := command_error(exc)) is None:
            raise
        sys.stderr.write(f"collectx-perf: error: {message}\n")
        return 2
