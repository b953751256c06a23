"""PCIe and NVLink line rates, shared by the NCCL XML importer and the probe.

>>> pcie_bw("8.0 GT/s PCIe", 16), pcie_bw("16 GT/s", "0"), pcie_bw(None, None)
(15.75, 31.51, 15.75)
"""

from __future__ import annotations

import re

# A VM often reports link_width 0 or nothing; NCCL then assumes x16 (topo.cc), and so do we.
DEFAULT_WIDTH = 16
# Unknown speed: NCCL falls back to Gen3 (8 GT/s); so do we.
DEFAULT_GTS = 8.0

# NVLink line rate per link per direction, GB/s, by compute capability major*10+minor:
# NVLink1 (P100, sm60) 20; NVLink2/3/4 (V100 sm70, A100 sm80, H100 sm90) 25; NVLink5
# (B200, sm100) 50; the GA10x NVLink bridge (sm86) runs 4 links at 112.5 GB/s both ways together.
NVLINK_GBPS_BY_SM = {60: 20.0, 70: 25.0, 80: 25.0, 86: 14.0625, 89: 25.0, 90: 25.0, 100: 50.0}
# NVML's nvmlDeviceGetNvLinkVersion answers an nvmlNvlinkVersion_t: 1 = 1.0, 2 = 2.0, 3 = 2.2,
# 4 = 3.0, 5 = 3.1, 6 = 4.0, 7 = 5.0 (pynvml NVML_NVLINK_VERSION_*). Line rate per link per
# direction, GB/s. The probe prefers the compute capability, which is unambiguous.
NVLINK_GBPS_BY_VERSION = {1: 20.0, 2: 25.0, 3: 25.0, 4: 25.0, 5: 25.0, 6: 25.0, 7: 50.0}
DEFAULT_NVLINK_GBPS = 25.0
# A GPU's copy within its own memory reads and writes HBM: about half the memory's peak. Up
# to Hopper the routes' default (1000 GB/s, ``routes.LOCAL_BW_GBPS``) stands in for it, well
# above any of its links; from NVLink5 on (sm100 and later) one GPU's links carry 900 GB/s, more
# with NVLink-C2C, so Blackwell's copy rate is written down: half of HBM3e's 8 TB/s.
BLACKWELL_SM, BLACKWELL_COPY_GBPS = 100, 4000.0

# xGMI (Infinity Fabric) per link per direction, by gfx prefix: MI50/MI60 (gfx906) and MI100
# (gfx908) 46 GB/s (92 GB/s per link both ways), MI250 (gfx90a) 50, MI300A/MI300X (gfx940-942) 64
# (AMD's 128 GB/s per link), MI350X/MI355X (gfx950) 76.8 (AMD's 153.6 GB/s per link).
XGMI_GBPS_BY_ARCH = {"gfx906": 46.0, "gfx908": 46.0, "gfx90a": 50.0, "gfx94": 64.0, "gfx95": 76.8}
DEFAULT_XGMI_GBPS = 50.0
# RCCL dumps and model files written before gcnArchName spell the arch as a bare number
# (RCCL's convertGcnArchToGcnArchName): 906, 908, 910 (= gfx90a), 940, 941, 942.
_LEGACY_GCN = {"906": "gfx906", "908": "gfx908", "910": "gfx90a", "940": "gfx940", "941": "gfx941",
               "942": "gfx942"}

_GTS = re.compile(r"([0-9]+(?:\.[0-9]+)?)")


def pcie_bw(link_speed, link_width) -> float:
    """Line rate in GB/s per direction of a PCIe link from sysfs/NCCL-style speed and width.

    ``link_speed`` is like ``"16.0 GT/s PCIe"`` (a number of GT/s); Gen1/Gen2 (2.5, 5 GT/s)
    use 8b/10b encoding, Gen3 and later 128b/130b.
    """
    gts = DEFAULT_GTS
    if link_speed is not None:
        found = _GTS.search(str(link_speed))
        if found and float(found.group(1)) > 0:
            gts = float(found.group(1))
    try:
        width = int(str(link_width).strip())
    except (TypeError, ValueError):
        width = 0
    width = width if width > 0 else DEFAULT_WIDTH
    efficiency = 0.8 if gts <= 5.0 else 128 / 130
    return round(gts * width * efficiency / 8, 2)


def nvlink_bw_for_sm(sm) -> float:
    """Per-link NVLink line rate for a compute capability such as ``"90"`` (default 25)."""
    try:
        sm = int(sm)
    except (TypeError, ValueError):
        return DEFAULT_NVLINK_GBPS
    known = [k for k in NVLINK_GBPS_BY_SM if k <= sm]
    if sm in NVLINK_GBPS_BY_SM:
        return NVLINK_GBPS_BY_SM[sm]
    # Unlisted minor versions take the rate of their major generation.
    return NVLINK_GBPS_BY_SM[max(k for k in known if k % 10 == 0)] if known else DEFAULT_NVLINK_GBPS


def copy_bw_for_sm(sm) -> float | None:
    """A GPU's own copy rate (GB/s) where the routes' default would understate it, else None.

    >>> copy_bw_for_sm("103"), copy_bw_for_sm("90"), copy_bw_for_sm(None)
    (4000.0, None, None)
    """
    try:
        return BLACKWELL_COPY_GBPS if int(sm) >= BLACKWELL_SM else None
    except (TypeError, ValueError):
        return None


def xgmi_bw_for_arch(arch) -> float:
    """Per-link xGMI line rate for a gfx architecture name or RCCL's legacy number (default 50).

    >>> xgmi_bw_for_arch("gfx942:sramecc+:xnack-"), xgmi_bw_for_arch("910"), xgmi_bw_for_arch("908")
    (64.0, 50.0, 46.0)
    >>> xgmi_bw_for_arch("gfx950")
    76.8
    """
    arch = str(arch or "").strip()
    arch = _LEGACY_GCN.get(arch, arch)
    for prefix, bw in XGMI_GBPS_BY_ARCH.items():
        if arch.startswith(prefix):
            return bw
    return DEFAULT_XGMI_GBPS


def normalize_busid(busid) -> str:
    """Canonical PCI bus id ``dddd:bb:dd.f`` in lower case (NVML pads the domain to 8 digits).

    >>> normalize_busid("00000000:A4:00.0"), normalize_busid("0000:a4:00.0")
    ('0000:a4:00.0', '0000:a4:00.0')
    """
    text = str(busid or "").strip().lower()
    if isinstance(busid, bytes):
        text = busid.decode(errors="replace").strip().lower()
    parts = text.split(":")
    if len(parts) == 3:
        try:
            parts[0] = f"{int(parts[0], 16):04x}"
        except ValueError:
            pass
    elif len(parts) == 2:
        parts.insert(0, "0000")
    return ":".join(parts)
