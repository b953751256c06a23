"""The C ABI as Python sees it: enums, version, build facts, chunk arithmetic, `python -m`."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import _needs as needs

import collectx
from collectx import _native as nat
from collectx.schedule.ir import chunk_span, range_span

REPO = Path(__file__).resolve().parents[1]


def test_enums_match_the_python_tables():
    lib = nat.lib
    for name, code in nat.DTYPES.items():
        assert getattr(lib, f"CX_{name.upper()}") == code
    for name, code in nat.OPS.items():
        assert getattr(lib, f"CX_{name.upper()}") == code
    for code, (name, _) in nat._STATUS.items():
        assert getattr(lib, name) == code


def test_dtype_sizes():
    sizes = {"int8": 1, "uint8": 1, "int32": 4, "int64": 8, "float16": 2, "bfloat16": 2,
             "float32": 4, "float64": 8}
    for name, size in sizes.items():
        assert nat.lib.cx_dtype_bytes(nat.DTYPES[name]) == size
    assert nat.lib.cx_dtype_bytes(99) == 0


def test_version_matches_the_package():
    out = nat.ffi.new("int *")
    assert nat.lib.cx_version(out) == 0
    major, minor, patch = map(int, collectx.__version__.split("."))
    assert out[0] == major * 10000 + minor * 100 + patch


def test_build_info_fields():
    info = nat.build_info()
    assert info["version"] == collectx.__version__
    assert info["isa"] in ("avx512f", "avx2", "default")
    assert isinstance(info["cuda_objects"], bool) and info["cuda_devices"] >= 0
    assert Path(info["library"]).is_file()
    small = nat.ffi.new("char[]", 8)
    assert nat.lib.cx_build_info(small, 8) == nat.lib.CX_ERR_ARG


def _cuda_disabled_for_loaded_library() -> bool:
    if os.environ.get("COLLECTX_CUDA", "ON").upper() in ("OFF", "0", "FALSE", "NO"):
        return True
    lib_dir = Path(nat.build_info()["library"]).parent
    caches = [REPO / "build" / "CMakeCache.txt"] if lib_dir == REPO / "collectx" else []
    return any("COLLECTX_CUDA:BOOL=OFF" in c.read_text() for c in caches if c.is_file())


@pytest.mark.skipif(shutil.which("nvcc") is None, reason=needs.reason("nvcc"))
def test_cuda_objects_are_built_when_nvcc_is_present():
    if _cuda_disabled_for_loaded_library():
        pytest.skip("the library was built with COLLECTX_CUDA=OFF")
    info = nat.build_info()
    assert info["cuda_objects"], f"nvcc is on PATH but {info['library']} has no CUDA objects"
    assert "80" in info["cuda_archs"] and "90" in info["cuda_archs"]


def test_dtype_code_accepts_names_numpy_and_torch_style():
    assert nat.dtype_code("bfloat16") == nat.lib.CX_BFLOAT16
    assert nat.dtype_code(float) == nat.lib.CX_FLOAT64
    torch = needs.module("torch")
    assert nat.dtype_code(torch.bfloat16) == nat.lib.CX_BFLOAT16
    assert nat.dtype_code(torch.float16) == nat.lib.CX_FLOAT16


def test_library_search_order_puts_the_override_first(tmp_path):
    fake = tmp_path / "libcollectx.so"
    paths = nat.candidate_paths(str(fake))
    assert paths[0] == fake
    assert paths[1].parent == Path(nat.__file__).resolve().parent


@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler")
def test_chunk_header_matches_the_ir(tmp_path):
    program = tmp_path / "chunks.cpp"
    program.write_text(
        '#include <stdio.h>\n#include "cx_chunk.h"\n'
        "int main() {\n"
        "  for (int nch = 1; nch <= 5; nch++) for (int count = 0; count <= 11; count++)\n"
        "    for (int j = 0; j < 3 * nch; j++) for (int run = 1; j + run <= 3 * nch; run++) {\n"
        "      cx_span c = cx_chunk_span(j, nch, count);\n"
        "      cx_span r = cx_range_span(j, run, nch, count);\n"
        '      printf("%d %d %d %d %lld %lld %lld %lld\\n", nch, count, j, run,\n'
        "             (long long)c.offset, (long long)c.length,\n"
        "             (long long)r.offset, (long long)r.length);\n"
        "    }\n}\n")
    exe = tmp_path / "chunks"
    subprocess.run(["g++", "-std=c++17", f"-I{REPO / 'native' / 'include'}", str(program),
                    "-o", str(exe)], check=True, timeout=120)
    lines = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    rows = [tuple(map(int, line.split())) for line in lines.splitlines()]
    assert len(rows) > 1000
    for nch, count, j, run, co, cl, ro, rl in rows:
        assert (co, cl) == chunk_span(j, nch, count)
        assert (ro, rl) == range_span(j, run, nch, count)


def test_python_m_collectx_prints_build_info():
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-m", "collectx"], capture_output=True, text=True,
                         env=env, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    for label in ("compiler:", "kernel ISA:", "CUDA objects:", "CUDA device:"):
        assert label in out.stdout
