"""collectx-perf --simulate: the table predicted by collectx.planner.plan, bound and ring beside."""

import types

import pytest

from collectx.perf import driver, simulate

SPEC = {"collectives": ("allreduce", "allgather"), "sizes": (1 << 10, 1 << 20),
        "dtype": "float32", "op": "sum", "root": 0, "algo": None}


def _fake_plan(topo, collective, nbytes, *, gpus, algo=None, root=0):
    if algo == "ring" and collective == "allgather":
        from collectx.errors import NoFeasiblePlan
        raise NoFeasiblePlan("no NVLink ring on these GPUs")
    busbw = 10.0 if algo == "ring" else 40.0
    pred = types.SimpleNamespace(time_us=nbytes / busbw / 1e3, algbw_GBps=busbw / 2,
                                 busbw_GBps=busbw)
    bound = types.SimpleNamespace(bound_busbw=50.0, ceiling_busbw=60.0)
    return types.SimpleNamespace(algorithm=algo or "treepack", predicted=pred, bound=bound,
                                 efficiency=0.8)


def test_simulated_rows_carry_prediction_bound_and_ring():
    rows = simulate.simulate_rows(None, ("GPU0", "GPU1", "GPU2", "GPU5"), SPEC, _fake_plan)
    assert [(r["collective"], r["size"]) for r in rows] == [
        ("allreduce", 1024), ("allreduce", 1 << 20), ("allgather", 1024), ("allgather", 1 << 20)]
    first = rows[0]
    assert first["predicted"]["busbw"] == 40.0 and first["bound_busbw"] == 50.0
    assert first["ring_busbw"] == 10.0 and first["algorithm"] == "treepack"
    assert rows[2]["ring_busbw"] is None and "no NVLink ring" in rows[2]["note"]


def test_simulated_table_format():
    gpus = ("GPU0", "GPU1", "GPU2", "GPU5")
    text = simulate.format_simulated(simulate.simulate_rows(None, gpus, SPEC, _fake_plan),
                                     "dgx1v", gpus)
    lines = text.splitlines()
    assert lines[0].startswith("# collectx-perf --simulate dgx1v: 4 GPUs (GPU0, GPU1, GPU2, GPU5)")
    row = next(ln for ln in lines if ln.strip().startswith("1024"))
    assert row.split()[-4:] == ["treepack", "50.00", "10.00", "4.00"]
    assert "# Avg bus bandwidth    : 40 (predicted)" in text


def test_bad_gpu_indices_name_the_valid_range():
    from collectx.errors import CollectXError
    with pytest.raises(CollectXError, match=r"8 GPUs \(0-7\)"):
        simulate.load_allocation("dgx1v", (0, 9))
    with pytest.raises(CollectXError, match="listed twice"):
        simulate.load_allocation("dgx1v", (0, 0))


def test_predictions_are_exactly_collectx_plan():
    from collectx.planner import plan
    from collectx.topology import load
    topo, gpus = simulate.load_allocation("dgx1v", (0, 1, 2, 5))
    rows = simulate.simulate_rows(topo, gpus, dict(SPEC, collectives=("allreduce",),
                                                   sizes=(1 << 20,)))
    direct = plan(load("dgx1v"), "allreduce", 1 << 20, gpus=list(gpus))
    assert rows[0]["algorithm"] == direct.algorithm
    assert rows[0]["bound_busbw"] == direct.bound.bound_busbw
    if direct.predicted is not None:
        assert rows[0]["predicted"]["busbw"] == direct.predicted.busbw_GBps
        assert rows[0]["predicted"]["time_us"] == direct.predicted.time_us


def test_simulate_from_the_command_line(tmp_path, capsys):
    csv_path, json_path = tmp_path / "s.csv", tmp_path / "s.json"
    status = driver.main(["--simulate", "dgx1v", "--gpus", "0,1,2,5", "-b", "1M", "-e", "4M",
                          "--csv", str(csv_path), "--json", str(json_path)])
    out = capsys.readouterr().out
    assert status == 0 and "--simulate dgx1v: 4 GPUs (GPU0, GPU1, GPU2, GPU5)" in out
    assert csv_path.read_text().startswith("peer,collective,size")
    assert '"mode": "simulated"' in json_path.read_text()
