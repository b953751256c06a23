"""``collectx-perf``: bus-bandwidth sweeps in nccl-tests' format (see ``docs/perf.md``)."""

from __future__ import annotations

import sys

from ..perf.driver import main as _main


def main(argv: list[str] | None = None) -> int:
    """Run ``collectx-perf`` with ``argv`` (default: the command line); return the exit status."""
    return _main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
