"""`collectx topo` and the `collectx` front door: output, --gpus, --json, --draw, bad input."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import collectx.topology as topo
from collectx.cli.main import build_parser, main
from collectx.cli.topo import parse_gpu_list
from collectx.errors import ArgumentError

from _dumps import REAL

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "topology"


def run_main(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_matrix_shows_direct_nvlinks_and_path_classes(capsys):
    rc, out, err = run_main(capsys, "topo", "dgx1v")
    assert rc == 0 and err == ""
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("GPU")}
    cells = rows["GPU0"].split()
    assert cells[1] == "X"
    assert "NV2 50" in rows["GPU0"] and rows["GPU0"].count("NV1 25") == 2
    assert "NVB" in rows["GPU0"]
    assert "NIC0: PIX to GPU0 GPU1" in out
    assert "CPU1: GPU4 GPU5 GPU6 GPU7" in out
    assert "Legend:" in out


def test_nvswitch_pairs_show_all_shared_switch_links_like_nvidia_smi(capsys):
    rc, out, _ = run_main(capsys, "topo", "dgx_h100")
    row = next(line for line in out.splitlines() if line.startswith("GPU3"))
    assert rc == 0 and row.split("X")[1].split() == ["NV18", "450"] * 4
    rc, out, _ = run_main(capsys, "topo", "dgx2", "--gpus", "0,1,8")
    row = next(line for line in out.splitlines() if line.startswith("GPU0"))
    assert "NV6 150" in row and "NVB 25" in row  # GPU8 is on the other baseboard's switches


def test_gpus_option_shows_only_the_subset(capsys):
    rc, out, _ = run_main(capsys, "topo", "dgx1v", "--gpus", "0,1,2,5")
    header = next(line for line in out.splitlines() if line.lstrip().startswith("GPU0"))
    assert header.split() == ["GPU0", "GPU1", "GPU2", "GPU5"]
    assert rc == 0 and "GPU4 " not in out.split("Legend")[0]


def test_json_output_is_the_schema(capsys):
    rc, out, _ = run_main(capsys, "topo", "dgx2", "--gpus", "0-3", "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["schema"] == "collectx.topology/1"
    assert [n["id"] for n in doc["nodes"] if n["kind"] == "gpu"] == ["GPU0", "GPU1", "GPU2", "GPU3"]
    assert topo.gpus(topo.from_json(doc)) == ["GPU0", "GPU1", "GPU2", "GPU3"]


def test_real_files_load_through_the_cli(capsys):
    rc, out, _ = run_main(capsys, "topo", str(REAL / "hgx_h100_nccl_topo.xml"))
    # only the GPU below its own switch: the others it reaches through that GPU's NVLinks (PXN)
    assert rc == 0 and "NIC7 (mlx5_7), 25 GB/s network: PIX to GPU0\n" in out
    rc, out, _ = run_main(capsys, "topo", str(REAL / "dgx1v_nvidia-smi-topo.txt"))
    assert rc == 0 and "NV2 50" in out


def test_draw_writes_a_png(tmp_path, capsys):
    out_file = tmp_path / "t.png"
    rc, out, _ = run_main(capsys, "topo", "mi300x", "--draw", str(out_file))
    assert rc == 0 and out_file.read_bytes()[:4] == b"\x89PNG"
    assert f"Drawing written to {out_file}" in out


def test_no_source_uses_collectx_topo_file(tmp_path):
    env = {"COLLECTX_TOPO_FILE": str(topo.preset_path("dgx_a100")), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-m", "collectx.cli.main", "topo", "--json"],
                          capture_output=True, text=True, env=env, timeout=60,
                          cwd=Path(__file__).resolve().parent.parent)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["name"] == "dgx_a100"


@pytest.mark.parametrize("argv, message", [
    (["topo", str(FIXTURES / "truncated.xml")], "does not parse at line"),
    (["topo", "dgx9000"], "unknown topology 'dgx9000'"),
    (["topo", str(FIXTURES / "smi_missing_row.txt")], "row for GPU2 is missing"),
    (["topo", "dgx1v", "--gpus", "9"], "GPU index 9 is out of range"),
    (["topo", "dgx1v", "--gpus", "3-1"], "cannot read '3-1'"),
    (["topo", "dgx1v", "--gpus", "0,0"], "listed twice"),
])
def test_bad_input_is_one_line_on_stderr_with_status_2(argv, message, capsys):
    rc, out, err = run_main(capsys, *argv)
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("collectx: error: ")
    assert message in lines[0]


def test_bad_input_from_the_command_line_has_no_traceback():
    proc = subprocess.run([sys.executable, "-m", "collectx.cli.main", "topo",
                           str(FIXTURES / "truncated.xml")], capture_output=True, text=True,
                          timeout=60, cwd=Path(__file__).resolve().parent.parent)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("collectx: error: NCCL topology XML does not parse at line")
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_an_empty_gpu_list_is_an_error_not_the_whole_machine(capsys):
    rc, _, err = run_main(capsys, "topo", "dgx1v", "--gpus", "")
    assert rc == 2 and "no GPU listed" in err


def test_parse_gpu_list():
    assert parse_gpu_list("0,1,2,5") == [0, 1, 2, 5]
    assert parse_gpu_list("0-3,6") == [0, 1, 2, 3, 6]
    assert parse_gpu_list("GPU3") == ["GPU3"]
    for bad in ("", "1,,2", "a-b", "-2", "0-\u00b2"):   # a superscript two is a digit, not a number
        with pytest.raises(ArgumentError):
            parse_gpu_list(bad)


def test_a_gpu_named_by_a_digit_int_cannot_read_is_refused_as_unknown(capsys):
    rc, _, err = run_main(capsys, "topo", "dgx1v", "--gpus", "\u00b2")
    assert rc == 2 and "Traceback" not in err and "\u00b2" in err


def test_front_door_registers_topo_and_build_info():
    choices = build_parser()._subparsers._group_actions[0].choices
    assert {"topo", "build-info"} <= set(choices)


def test_no_subcommand_prints_help_and_returns_2(capsys):
    rc, out, _ = run_main(capsys)
    assert rc == 2 and "topo" in out


def test_build_info_runs_without_a_traceback():
    proc = subprocess.run([sys.executable, "-m", "collectx.cli.main", "build-info"],
                          capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parent.parent)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    info = dict(line.split(": ", 1) for line in proc.stdout.splitlines())
    assert {"version", "compiler", "cuda_objects", "library", "fast_path"} <= set(info)
    assert Path(info["library"]).is_file()


def test_probing_run_dumps_what_it_probed(tmp_path):
    dump = tmp_path / "probed.json"
    env = {"COLLECTX_TOPO_DUMP_FILE": str(dump), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-m", "collectx.cli.main", "topo", "--json"],
                          capture_output=True, text=True, env=env, timeout=60,
                          cwd=Path(__file__).resolve().parent.parent)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(dump.read_text()) == json.loads(proc.stdout)
    assert topo.gpus(topo.load(dump))  # one endpoint per GPU, or per CPU rank without GPUs
