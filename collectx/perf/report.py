"""Machine facts, library versions, and the JSON / CSV files of a sweep.

A *result* is one dict: ``machine``, ``versions``, ``options``, ``mode`` ("measured" or
"simulated"), ``peers`` (name -> rows) and ``skipped`` (name -> reason and hint). JSON writes it
as is; CSV writes one line per size and peer, with the machine and versions on every line so a
line is meaningful on its own.

>>> flatten({"size": 8, "oop": {"busbw": 1.5}, "ip": None})
{'size': 8, 'oop_busbw': 1.5, 'ip': None}
"""

from __future__ import annotations

import csv
import importlib.metadata
import json
import os
import platform
import re
import shutil
import socket
import subprocess

import collectx


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (platform's guess elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict:
    """Hostname, CPU model, core count, OS and Python of this machine."""
    return {"hostname": socket.gethostname(), "cpu_model": cpu_model(),
            "cores": os.cpu_count(), "os": platform.platform(),
            "python": platform.python_version()}


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def openmpi_version() -> str | None:
    """Open MPI's version from ``mpirun --version`` (None without mpirun)."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        return None
    try:
        out = subprocess.run([mpirun, "--version"], capture_output=True, text=True,
                             timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"(\d+\.\d+(?:\.\d+)?)", out)
    return match.group(1) if match else None


def library_versions() -> dict:
    """Versions of collectx and the libraries a sweep may compare against (None: absent)."""
    return {"collectx": collectx.__version__, "numpy": _dist_version("numpy"),
            "mpi4py": _dist_version("mpi4py"), "torch": _dist_version("torch"),
            "openmpi": openmpi_version()}


def flatten(row: dict, prefix: str = "") -> dict:
    """One level of keys: nested dicts become ``outer_inner`` columns."""
    flat = {}
    for key, value in row.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}_"))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def write_json(path: str, result: dict) -> None:
    """The whole result as indented JSON."""
    with open(path, "w") as f:
        json.dump(result, f, indent=1, sort_keys=False)
        f.write("\n")


def csv_records(result: dict) -> list[dict]:
    """One flat record per size and peer, machine and versions included."""
    context = {**result["machine"], **{f"version_{k}": v for k, v in result["versions"].items()}}
    return [{"peer": peer, **flatten(row), **context}
            for peer, rows in result["peers"].items() for row in rows]


def write_csv(path: str, result: dict) -> None:
    """:func:`csv_records` as CSV, columns in first-seen order."""
    records = csv_records(result)
    columns = list(dict.fromkeys(key for rec in records for key in rec))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(records)
