"""``python -m collectx``: print what the native library was built with and what it sees."""

from __future__ import annotations

import sys


def main() -> int:
    from . import __version__
    from ._native import build_info
    from .errors import NativeUnavailable
    try:
        info = build_info()
    except NativeUnavailable as exc:
        print(f"collectx {__version__}: native library unavailable: {exc}")
        return 1
    yes_no = {True: "yes", False: "no"}
    print(f"collectx {__version__} (native {info['version']})")
    print(f"  library:      {info['library']}")
    print(f"  compiler:     {info['compiler']}")
    print(f"  kernel ISA:   {info['isa']}")
    print(f"  CUDA objects: {yes_no[info['cuda_objects']]} {info['cuda_archs']}".rstrip())
    print(f"  CUDA device:  {yes_no[info['cuda_devices'] > 0]} ({info['cuda_devices']} visible)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
