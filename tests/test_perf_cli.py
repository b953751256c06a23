"""collectx-perf: argument parsing, the nccl-tests table format, and the driver's exit status."""

import io
import subprocess
import json

import pytest

from collectx.errors import ArgumentError
from collectx.perf import driver, table
from collectx.perf.options import dtype_name, parse_args, parse_size, size_sweep
from collectx.perf.sweep import iterations_for, run_sweep
from collectx.perf.threadcomm import run_threads


@pytest.mark.parametrize("text,expected", [
    ("8", 8), ("1K", 1024), ("1k", 1024), ("64M", 64 << 20), ("1G", 1 << 30), ("2KB", 2048),
    ("1MiB", 1 << 20), ("0.5K", 512)])
def test_sizes_take_nccl_tests_suffixes(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "1X", "-4", "1.2.3"])
def test_bad_sizes_are_argument_errors(text):
    with pytest.raises(ArgumentError, match="expected a byte count"):
        parse_size(text)


def test_default_sweep_is_allreduce_float_8B_to_64MiB_by_two_on_two_ranks():
    opts = parse_args([])
    assert opts.collectives == ("allreduce",) and opts.dtype == "float32" and opts.op == "sum"
    assert opts.sizes[0] == 8 and opts.sizes[-1] == 64 << 20 and len(opts.sizes) == 24
    assert all(b == 2 * a for a, b in zip(opts.sizes, opts.sizes[1:]))
    assert opts.nprocs == 2 and opts.check == 1


def test_sweep_steps_by_factor_or_fixed_increment():
    assert size_sweep(1, 1 << 20, 4)[-1] == 1 << 20 and len(size_sweep(1, 1 << 20, 4)) == 11
    assert size_sweep(1024, 4096, step=1024) == (1024, 2048, 3072, 4096)
    assert size_sweep(0, 4, 2) == (0, 1, 2, 4)


@pytest.mark.parametrize("name,canonical", [
    ("float", "float32"), ("half", "float16"), ("bfloat16", "bfloat16"), ("bf16", "bfloat16"),
    ("double", "float64"), ("int32", "int32"), ("int", "int32"), ("char", "int8"),
    ("uint8", "uint8"), ("FLOAT", "float32")])
def test_dtype_names_of_nccl_tests_and_numpy(name, canonical):
    assert dtype_name(name) == canonical


def test_n_is_ranks_and_iters_is_capital_i():
    opts = parse_args(["--collective", "all", "-n", "3", "-b", "1", "-e", "1M", "-f", "4",
                       "-I", "7", "-w", "2", "-c", "0", "-o", "max", "-r", "2", "-d", "half"])
    assert opts.nprocs == 3 and opts.iters == 7 and opts.warmup == 2 and opts.check == 0
    assert opts.collectives[0] == "allreduce" and len(opts.collectives) == 7
    assert (opts.op, opts.root, opts.dtype) == ("max", 2, "float16")


def test_flag_lists_and_outputs():
    opts = parse_args(["--compare", "mpi,gloo", "--collective", "allgather,reduce-scatter",
                       "--simulate", "dgx1v", "--gpus", "0,1,2,5", "--json", "a.json",
                       "--csv", "a.csv", "--plot", "a.png", "--html", "a.html", "--algo", "ring"])
    assert opts.compare == ("mpi", "gloo")
    assert opts.collectives == ("allgather", "reduce_scatter")
    assert opts.simulate == "dgx1v" and opts.gpus == (0, 1, 2, 5) and opts.algo == "ring"
    assert (opts.json, opts.csv, opts.plot, opts.html) == ("a.json", "a.csv", "a.png", "a.html")


@pytest.mark.parametrize("argv,match", [
    (["-d", "float8"], "-d 'float8'"), (["-o", "xor"], "-o 'xor'"),
    (["--collective", "gather"], "unknown"), (["--compare", "hccl"], "unknown"),
    (["-n", "0"], "-n 0"), (["-b", "1M", "-e", "1K"], "min <= max"), (["-f", "1"], "-f"),
    (["--simulate", "dgx1v", "--gpus", "0,3-1"], "--gpus"),
    (["--simulate", "dgx1v", "--gpus", ""], "no GPU listed"),
    (["--gpus", "0,1"], "only with --simulate")])
def test_bad_arguments_say_what_was_expected(argv, match):
    with pytest.raises(ArgumentError, match=match):
        parse_args(argv)


def test_iterations_shrink_with_size_and_explicit_values_win():
    small, large = iterations_for(8), iterations_for(64 << 20)
    assert small[1] > large[1] and small[0] >= large[0]
    assert iterations_for(1 << 30, iters=9, warmup=0) == (0, 9)
    # however slow the previous size was, two untimed calls absorb per-size setup
    assert iterations_for(1 << 30, estimate_us=1e7) == (2, 2)


GOLDEN_HEADER = """\
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)"""


def test_header_lines_match_nccl_tests():
    assert "\n".join(table.header_lines()) == GOLDEN_HEADER


def test_row_columns_line_up_with_the_header():
    row = {"size": 8, "count": 2, "type": "float32", "redop": "sum", "root": -1,
           "oop": {"time_us": 42.56, "algbw": 0.0, "busbw": 0.0, "wrong": 0},
           "ip": {"time_us": 40.06, "algbw": 0.0, "busbw": 0.0, "wrong": 0}}
    line = table.format_row(row)
    assert line == ("           8             2     float     sum      -1    42.56    0.00    0.00"
                    "      0    40.06    0.00    0.00      0")
    assert len(line) == len(GOLDEN_HEADER.splitlines()[1])


def test_footer_reports_wrong_elements_and_mean_busbw():
    cell = lambda bw, wrong: {"time_us": 1.0, "algbw": bw, "busbw": bw, "wrong": wrong}  # noqa
    rows = [{"oop": cell(1.0, 0), "ip": cell(3.0, 0)}, {"oop": cell(2.0, 5), "ip": None}]
    lines = table.footer_lines(rows)
    assert lines[0] == "# Out of bounds values : 5 FAILED"
    assert lines[1].startswith("# Avg bus bandwidth    : 2 ")
    assert table.footer_lines(rows[:1])[0] == "# Out of bounds values : 0 OK"


def test_peer_columns_show_their_busbw_and_our_ratio():
    ours = {"size": 8, "count": 2, "type": "float32", "redop": "sum", "root": -1,
            "oop": {"time_us": 1.0, "algbw": 4.0, "busbw": 4.0, "wrong": 0}, "ip": None}
    theirs = dict(ours, oop={"time_us": 2.0, "algbw": 2.0, "busbw": 2.0, "wrong": 0})
    assert table.format_row(ours, (theirs, None)).endswith(
        "          2.00   2.00           N/A    N/A")
    assert "mpi busbw  ratio" in table.header_lines(("mpi", "gloo"))[1]


def _thread_launch(fn, nprocs, args=(), bind="none"):
    return run_threads(run_sweep, nprocs, args)


def test_driver_prints_the_table_and_exits_zero_when_all_is_right():
    out = io.StringIO()
    opts = parse_args(["-b", "8", "-e", "64", "-I", "1", "-w", "0", "--no-progress"])
    assert driver.run_measured(opts, out=out, launch=_thread_launch) == 0
    text = out.getvalue()
    assert GOLDEN_HEADER in text and "# Out of bounds values : 0 OK" in text
    assert len([ln for ln in text.splitlines() if not ln.startswith("#")]) == 4


def test_ranks_are_bound_like_mpiruns_unless_told_otherwise(monkeypatch):
    from collectx.perf import peers
    seen = {}

    def launch(fn, nprocs, args=(), bind="none"):
        seen["collectx"] = bind
        return _thread_launch(fn, nprocs, args)

    real_run = subprocess.run

    def fake_run(cmd, **kw):  # the mpirun command line, then a worker that reports nothing
        if "--bind-to" not in cmd:
            return real_run(cmd, **kw)
        seen["mpirun"] = cmd[cmd.index("--bind-to") + 1]
        return subprocess.CompletedProcess(cmd, 0, '{"done": true}', "")
    monkeypatch.setattr(peers.shutil, "which", lambda name: "/usr/bin/" + name)
    monkeypatch.setattr(peers, "_has_module", lambda name: True)
    monkeypatch.setattr(peers.subprocess, "run", fake_run)
    monkeypatch.setattr(driver.peer_runners, "run_peer", lambda name, spec, n: peers.run_mpi(
        spec, n))
    monkeypatch.setattr("collectx.runtime.affinity.allowed_cpus", lambda: [0, 1])
    for flags, want in (([], "core"), (["--bind", "none"], "none")):
        out = io.StringIO()
        opts = parse_args(["-b", "8", "-e", "8", "-I", "1", "-w", "0", "--no-progress",
                           "--compare", "mpi", *flags])
        driver.run_measured(opts, out=out, launch=launch)
        assert seen == {"collectx": want, "mpirun": want}
        assert f"bind: {want}" in out.getvalue()


def test_repeat_takes_turns_and_reports_each_cells_median(monkeypatch):
    from collectx.perf import peers
    turns, times = [], iter([30.0, 10.0, 20.0])

    def launch(fn, nprocs, args=(), bind="none"):
        turns.append("collectx")
        rows = _thread_launch(fn, nprocs, args)[0]
        t = next(times)  # plant one time per round in every cell
        return [[dict(r, ip=dict(r["ip"], time_us=t, algbw=1e3 / t, busbw=1e3 / t))
                 for r in rows]]

    def run_peer(name, spec, n):
        turns.append(name)
        return peers.PeerResult(name, skipped="absent") if name == "gloo" else \
            peers.PeerResult(name, _thread_launch(None, n, (spec,))[0])
    monkeypatch.setattr(driver.peer_runners, "run_peer", run_peer)
    out = io.StringIO()
    opts = parse_args(["-b", "8", "-e", "8", "-I", "1", "-w", "0", "--no-progress",
                       "--compare", "mpi,gloo", "--repeat", "3"])
    assert driver.run_measured(opts, out=out, launch=launch) == 0
    # round-robin; a peer skipped once is not retried
    assert turns == ["collectx", "mpi", "gloo", "collectx", "mpi", "collectx", "mpi"]
    text = out.getvalue()
    assert "median of 3 rounds" in text and "peer gloo skipped: absent" in text
    row = next(ln for ln in text.splitlines() if not ln.startswith("#"))
    assert "20.00   50.00" in row  # median time 20 us, bandwidth from it: 1000 / 20


def test_repeat_must_be_positive():
    with pytest.raises(ArgumentError, match="--repeat 0"):
        parse_args(["--repeat", "0"])


def test_driver_exits_nonzero_when_a_result_is_wrong(monkeypatch):
    def corrupting_launch(fn, nprocs, args=(), bind="none"):
        def body(comm, spec):
            return run_sweep(comm, spec, corrupt=lambda c, v, out: out.__setitem__(0, -7))
        return run_threads(body, nprocs, args)
    out = io.StringIO()
    opts = parse_args(["-b", "8", "-e", "16", "-I", "1", "-w", "0", "--no-progress"])
    assert driver.run_measured(opts, out=out, launch=corrupting_launch) == 1
    assert "FAILED" in out.getvalue()


def test_usage_errors_exit_two_with_the_reason(capsys):
    assert driver.main(["-d", "float8"]) == 2
    assert "collectx-perf: error: -d 'float8'" in capsys.readouterr().err


def test_cuda_device_without_a_gpu_is_a_clear_error(monkeypatch, capsys):
    import collectx
    monkeypatch.setattr(collectx, "cuda_available", lambda: False, raising=False)
    assert driver.main(["--device", "cuda"]) == 2
    assert "no NVIDIA GPU or CUDA runtime" in capsys.readouterr().err


def test_launcher_environment_is_detected():
    assert driver.launched_externally({"OMPI_COMM_WORLD_SIZE": "2"})
    assert driver.launched_externally({"COLLECTX_RANK": "1"})
    assert not driver.launched_externally({"WORLD_SIZE": "2"})  # RANK missing: not torchrun


def test_a_collective_the_communicator_lacks_is_reported_not_fatal():
    class NoPointToPoint:
        def __init__(self, comm):
            self._comm = comm

        def __getattr__(self, name):
            if name in ("send", "recv"):
                raise AttributeError(name)
            return getattr(self._comm, name)

    def launch(fn, nprocs, args=(), bind="none"):
        return run_threads(lambda comm, spec: run_sweep(NoPointToPoint(comm), spec), nprocs, args)

    out = io.StringIO()
    opts = parse_args(["--collective", "allreduce,sendrecv", "-b", "8", "-e", "8", "-I", "1",
                       "--no-progress"])
    assert driver.run_measured(opts, out=out, launch=launch) == 0
    assert "# sendrecv: not run, this communicator does not provide it" in out.getvalue()


def test_a_root_outside_the_ranks_is_refused_before_starting_them(capsys):
    assert driver.main(["-n", "2", "-r", "2"]) == 2
    assert "-r 2: expected a root rank in [0, 2)" in capsys.readouterr().err


def test_an_unknown_algorithm_is_refused_before_starting_ranks(capsys):
    assert driver.main(["--algo", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert "--algo 'nosuch': expected one of" in err and "ring" in err


def test_rows_measured_before_a_crash_are_still_printed():
    from collectx.errors import PeerFailure

    def crashing_launch(fn, nprocs, args=(), bind="none"):
        spec = args[0]
        rows = run_threads(run_sweep, nprocs, (dict(spec, collectives=("allreduce",)),))[0]
        with open(spec["rows_file"], "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        raise PeerFailure("rank 1 died during sendrecv\nremote traceback ...")

    out = io.StringIO()
    opts = parse_args(["--collective", "allreduce,sendrecv", "-b", "8", "-e", "16", "-I", "1",
                       "--no-progress"])
    assert driver.run_measured(opts, out=out, launch=crashing_launch) == 2
    text = out.getvalue()
    assert "# run failed after 2 rows: rank 1 died during sendrecv" in text
    assert "# Collective: allreduce" in text and "remote traceback" not in text
    assert "sendrecv: not run" not in text


def test_an_output_file_that_cannot_be_written_is_one_line_exit_2(capsys):
    status = driver.main(["--simulate", "dgx1v", "-b", "1K", "-e", "1K", "--no-progress",
                          "--json", "/nonexistent/dir/a.json"])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and "/nonexistent/dir/a.json" in err
