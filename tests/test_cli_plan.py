"""``collectx plan``: JSON fields, text summary, drawing/export, one-line errors."""

import json

import pytest

from collectx.cli.main import main
from collectx.cli.plan import overlays, parse_size
from collectx.errors import ArgumentError
from collectx.schedule.ir import Schedule
from test_planner_api import JSON_FIELDS as FIELDS


def test_json_fields(capsys):
    rc = main(["plan", "dgx1v", "--collective", "allgather", "--gpus", "0,1,2,3",
               "--size", "1M", "--algo", "ring", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and set(d) == FIELDS
    assert d["ranks"] == ["GPU0", "GPU1", "GPU2", "GPU3"] and d["nbytes"] == 1 << 20
    assert d["algorithm"] == "ring" and d["verified"] is True
    assert Schedule.from_dict(d["schedule"]).collective == "allgather"
    if d["predicted_busbw_GBps"] is not None and d["bound_busbw_GBps"]:
        assert d["efficiency"] == pytest.approx(d["predicted_busbw_GBps"] /
                                                d["bound_busbw_GBps"])


def test_text_summary_names_rings(capsys):
    assert main(["plan", "dgx1v", "-c", "allreduce", "--gpus", "0-3",
                 "--size", "64M", "--algo", "ring"]) == 0
    out = capsys.readouterr().out
    assert "algorithm    ring" in out and "ring 0:" in out and "verified     yes" in out


def test_env_algo_is_used_when_no_flag(capsys, monkeypatch):
    import collectx.cli.plan as cli_plan
    from collectx.config import Config
    monkeypatch.setattr(cli_plan, "get_config",
                        lambda: Config.from_env({"COLLECTX_ALGO": "tree"}))
    assert main(["plan", "dgx1v", "-c", "broadcast", "--gpus", "0-3", "--size", "8K",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["algorithm"] == "tree"


def test_draw_and_msccl_export(tmp_path, capsys):
    svg, xml = tmp_path / "plan.svg", tmp_path / "plan.xml"
    assert main(["plan", "dgx1v", "-c", "allreduce", "--gpus", "0,3,2,1", "--size", "8K",
                 "--algo", "tree", "--draw", str(svg), "--export-msccl", str(xml)]) == 0
    assert svg.read_text().startswith("<?xml") and "<algo" in xml.read_text()


@pytest.mark.parametrize("argv,match", [
    (["-c", "allscatter"], "unknown collective"),
    (["-c", "allreduce", "--gpus", "0,0"], "twice"),
    (["-c", "allreduce", "--gpus", "0,42"], "out of range"),
    (["-c", "allreduce", "--gpus", "GPU0,GPU9"], "GPU9"),
    (["-c", "allreduce", "--gpus", ""], "no GPU listed"),   # an unset variable: not every GPU
    (["-c", "allreduce", "--export-msccl", "/nonexistent/dir/plan.xml"], "No such file"),
    (["-c", "allreduce", "--size", "12Q"], "--size"),
    (["-c", "allreduce", "--algo", "magic"], "unknown algorithm"),
])
def test_bad_input_is_one_line_exit_2(argv, match, capsys):
    assert main(["plan", "dgx1v", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and match in err and "Traceback" not in err


def test_disconnected_allocation(tmp_path, capsys):
    from collectx.topology import line, write_json
    path = tmp_path / "line.json"
    write_json(line(3), path)
    assert main(["plan", str(path), "-c", "allreduce", "--gpus", "0,2"]) == 2
    assert "cannot reach" in capsys.readouterr().err


def test_parse_size():
    assert parse_size("8K") == 8192 and parse_size("64MiB") == 64 << 20
    assert parse_size("1g") == 1 << 30
    with pytest.raises(ArgumentError):
        parse_size("-5")


def test_overlays_from_tree_meta():
    import collectx.topology as T
    from collectx.planner import plan
    p = plan(T.switch(4), "broadcast", 64, algo="tree", verify=False)
    labels = [label for label, _ in overlays(p)]
    assert labels[0].startswith("tree 0") and all(len(e) == 3 for _, e in overlays(p))


@pytest.mark.parametrize("gpus, nranks", [("0,1,2,5", 4), (None, 8)])
def test_device_cuda_reports_the_schedule_the_cuda_runtime_runs(gpus, nranks, capsys):
    # No GPU needed: cuda_schedule is what CudaEngine runs, and --device cuda must say exactly that
    from collectx.runtime.cuda.planning import cuda_schedule
    from collectx.topology import load, subset
    argv = ["plan", "dgx1v", "-c", "allreduce", "--size", "256M", "--device", "cuda", "--json"]
    assert main(argv + (["--gpus", gpus] if gpus else [])) == 0
    d = json.loads(capsys.readouterr().out)
    G = load("dgx1v")
    view = subset(G, [int(g) for g in gpus.split(",")]) if gpus else G
    want = cuda_schedule(view, "allreduce", nranks, 256 << 20)
    assert Schedule.from_dict(d["schedule"]) == want and d["algorithm"] == want.algorithm
    assert d["verified"] is True and not want.uses_host


def test_device_cpu_is_the_default_and_cuda_takes_gpus_in_device_order(capsys):
    argv = ["plan", "dgx1v", "-c", "allreduce", "--gpus", "0,1,2,5", "--size", "256M", "--json"]
    assert main(argv) == 0
    default = json.loads(capsys.readouterr().out)
    assert main(argv + ["--device", "cpu"]) == 0
    assert json.loads(capsys.readouterr().out)["schedule"] == default["schedule"]
    assert main(["plan", "dgx1v", "-c", "allreduce", "--gpus", "5,0", "--device", "cuda"]) == 2
    assert "device order" in capsys.readouterr().err


@pytest.mark.parametrize("gpus, coll", [("0,5,6", "allreduce"), ("0,1,2,5", "allreduce"),
                                        ("1,2,4,7", "allgather")])
def test_cuda_runtime_gets_packed_trees_where_no_nvlink_ring_exists(gpus, coll, capsys):
    # No NVLink ring: a ring falls back to PCIe, tree packings use every NVLink. The CUDA
    # plan is judged against the bound without host staging, and beats the ring.
    from collectx.planner import plan
    from collectx.topology import load
    argv = ["plan", "dgx1v", "-c", coll, "--gpus", gpus, "--size", "256M", "--device", "cuda",
            "--json"]
    assert main(argv) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["algorithm"] in ("blink", "forest") and "host" not in d["algorithm"]
    ring = plan(load("dgx1v"), coll, 256 << 20, gpus=[int(g) for g in gpus.split(",")],
                algo="ring", host_relays=False, verify=False)
    assert d["bound_busbw_GBps"] == pytest.approx(ring.bound.bound_busbw)
    assert d["predicted_busbw_GBps"] > ring.predicted.busbw_GBps
    assert 0.9 <= d["efficiency"] <= 1.001


def test_cuda_bound_leaves_out_host_staging(capsys):
    # GPUs 0 and 1 of a DGX-1V share one NVLink (25 GB/s); staged through host memory,
    # PCIe adds 7.9 GB/s that the CUDA executor, without host buffers, cannot use.
    argv = ["plan", "dgx1v", "-c", "allgather", "--gpus", "0,1", "--size", "256M", "--json"]
    assert main(argv) == 0
    cpu = json.loads(capsys.readouterr().out)
    assert main(argv + ["--device", "cuda"]) == 0
    cuda = json.loads(capsys.readouterr().out)
    assert cpu["bound_busbw_GBps"] == pytest.approx(32.875, abs=0.01)
    assert cuda["bound_busbw_GBps"] == pytest.approx(25.0)
