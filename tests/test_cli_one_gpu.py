"""Every CLI command on a one-GPU machine: nothing moves between ranks, and the output says so
in one line instead of printing ``inf``, ``nan`` or a zero efficiency."""

from __future__ import annotations

import json
import re

import pytest

import _needs as needs

from collectx.cli import perf as perf_cli
from collectx.cli.main import main
from collectx.topology import load, subset, write_json

NUMBERS_THAT_MISLEAD = re.compile(r"\binf\b|\bnan\b|efficiency\s+0\.000\b", re.IGNORECASE)
COLLECTIVES = ("allreduce", "allgather", "reduce_scatter", "broadcast", "reduce", "alltoall",
               "sendrecv")


@pytest.fixture(scope="module")
def one_gpu(tmp_path_factory) -> str:
    """A machine with one GPU, its PCIe switch and its CPU (GPU0 of a DGX-1V)."""
    path = tmp_path_factory.mktemp("one_gpu") / "one_gpu.json"
    write_json(subset(load("dgx1v"), ["GPU0"]), path)
    return str(path)


def _run(capsys, argv, entry=main) -> str:
    rc = entry(argv)
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert not NUMBERS_THAT_MISLEAD.search(out), out
    return out


def test_topo_shows_the_one_gpu(one_gpu, capsys):
    out = _run(capsys, ["topo", one_gpu])
    assert "GPU0" in out and "GPU1" not in out


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_plan_says_nothing_moves_between_gpus(one_gpu, collective, capsys):
    out = _run(capsys, ["plan", one_gpu, "--collective", collective, "--size", "1G"])
    assert "on 1 GPU: GPU0" in out
    assert "no traffic   one rank: nothing moves between ranks" in out
    assert not re.search(r"^(bound|efficiency) ", out, re.MULTILINE)


def test_plan_json_has_no_bound_and_says_why(one_gpu, capsys):
    d = json.loads(_run(capsys, ["plan", one_gpu, "--collective", "allreduce", "--json"]))
    assert d["no_communication"] == "one rank: nothing moves between ranks"
    assert d["bound_busbw_GBps"] is None and d["efficiency"] is None


def test_plan_of_zero_bytes_on_two_gpus_says_nothing_moves(capsys):
    out = _run(capsys, ["plan", "dgx1v", "--gpus", "0,1", "--collective", "allreduce",
                        "--size", "0"])
    assert "no traffic   0 bytes: nothing to move" in out
    assert not re.search(r"^(bound|efficiency) ", out, re.MULTILINE)


def test_plan_of_a_few_bytes_prints_a_small_efficiency_not_zero(capsys):
    out = _run(capsys, ["plan", "dgx1v", "--gpus", "0,1", "--collective", "allreduce",
                        "--size", "8"])
    efficiency = float(re.search(r"efficiency\s+(\S+)", out).group(1))
    assert 0 < efficiency < 1e-3


def test_plan_exports_msccl_xml_for_one_gpu(one_gpu, tmp_path, capsys):
    xml = tmp_path / "one.xml"
    _run(capsys, ["plan", one_gpu, "--collective", "allgather", "--export-msccl", str(xml)])
    assert "<algo" in xml.read_text()


def test_simulated_sweep_has_no_bound_and_no_busbw(one_gpu, capsys):
    out = _run(capsys, ["--simulate", one_gpu, "-b", "8", "-e", "1M", "-f", "16",
                        "--collective", "allreduce,broadcast", "--no-progress"],
               entry=perf_cli.main)
    assert "1 GPU (GPU0)" in out and "# note: one rank: nothing moves between ranks" in out
    rows = [line.split() for line in out.splitlines() if line and not line.startswith("#")]
    assert rows and all(r[7] == "N/A" and r[9] == "N/A" for r in rows)   # busbw, bound
    assert "# Avg bus bandwidth    : N/A" in out


def test_measured_sweep_of_one_rank_says_nothing_moves(capsys):
    out = _run(capsys, ["-n", "1", "-b", "8", "-e", "4K", "-f", "8", "--collective",
                        "allreduce", "--no-progress"], entry=perf_cli.main)
    assert "# one rank: nothing moves between ranks: the times are local work" in out
    assert "# Out of bounds values : 0 OK" in out


def test_plan_drawing_and_report_of_one_gpu(one_gpu, tmp_path, capsys):
    needs.module("matplotlib")
    png, html = tmp_path / "one.png", tmp_path / "one.html"
    _run(capsys, ["plan", one_gpu, "--collective", "allreduce", "--draw", str(png),
                  "--html", str(html)])
    assert png.stat().st_size > 0
    page = html.read_text()
    assert "GPU0" in page and not NUMBERS_THAT_MISLEAD.search(page)
