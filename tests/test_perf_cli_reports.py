"""collectx-perf's files: JSON, CSV (one line per size and peer), plot, self-contained HTML."""

import csv
import io
import json

import pytest

from collectx.perf import driver
from collectx.perf.options import parse_args
from collectx.perf.sweep import run_sweep
from collectx.perf.threadcomm import run_threads


def _launch(fn, nprocs, args=(), bind="none"):
    return run_threads(run_sweep, nprocs, args)


@pytest.fixture
def measured(tmp_path, monkeypatch):
    from collectx.perf import peers
    mpi_rows = []

    def fake_peer(name, spec, nprocs):  # a peer that ran (mpi) and one that is missing (gloo)
        if name == "gloo":
            return peers.PeerResult("gloo", skipped="torch is not installed",
                                    hint=peers.TORCH_HINT)
        mpi_rows.extend(run_threads(run_sweep, nprocs, (spec,))[0])
        return peers.PeerResult("mpi", rows=mpi_rows)

    monkeypatch.setattr(peers, "run_peer", fake_peer)
    paths = {k: tmp_path / f"out.{k}" for k in ("json", "csv", "png", "html")}
    opts = parse_args(["--compare", "mpi,gloo", "-b", "8", "-e", "1K", "-f", "4", "-I", "1",
                       "--no-progress", "--json", str(paths["json"]), "--csv",
                       str(paths["csv"]), "--plot", str(paths["png"]), "--html",
                       str(paths["html"])])
    out = io.StringIO()
    assert driver.run_measured(opts, out=out, launch=_launch) == 0
    return paths, out.getvalue()


def test_json_holds_machine_versions_and_every_peer(measured):
    paths, _ = measured
    result = json.loads(paths["json"].read_text())
    assert set(result["machine"]) >= {"hostname", "cpu_model", "cores"}
    assert set(result["versions"]) >= {"collectx", "numpy", "mpi4py", "torch", "openmpi"}
    assert set(result["peers"]) == {"collectx", "mpi"} and len(result["peers"]["mpi"]) == 4
    assert result["skipped"]["gloo"]["hint"] == "pip install collectx[torch]"
    assert result["peers"]["collectx"][0]["oop"]["wrong"] == 0


def test_csv_has_one_line_per_size_and_peer_with_machine_columns(measured):
    paths, _ = measured
    lines = list(csv.DictReader(paths["csv"].open()))
    assert len(lines) == 8 and {ln["peer"] for ln in lines} == {"collectx", "mpi"}
    first = lines[0]
    assert {"hostname", "cpu_model", "cores", "version_collectx", "version_openmpi",
            "oop_busbw", "ip_time_us", "size"} <= set(first)


def test_plot_is_a_png(measured):
    paths, _ = measured
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_html_is_self_contained(measured):
    paths, text = measured
    page = paths["html"].read_text()
    assert page.startswith("<!DOCTYPE html>") and "data:image/png;base64," in page
    assert "<svg" in page  # the topology drawing, inline
    assert "src=\"http" not in page and "href=\"http" not in page  # opens without a network
    assert "torch is not installed" in page and "# Out of bounds values : 0 OK" in page


def test_table_shows_peer_columns_and_the_skipped_peer(measured):
    _, text = measured
    assert "mpi busbw  ratio" in text and "gloo busbw" not in text
    assert "# peer gloo skipped: torch is not installed" in text


def test_simulated_plot_and_html(tmp_path):
    png, html = tmp_path / "s.svg", tmp_path / "s.html"
    status = driver.main(["--simulate", "dgx1v", "--gpus", "0,1,2,5", "-b", "1K", "-e", "1M",
                          "-f", "32", "--plot", str(png), "--html", str(html)])
    assert status == 0
    assert "<svg" in png.read_text()
    page = html.read_text()
    assert "simulated" in page and "data:image/png;base64," in page
