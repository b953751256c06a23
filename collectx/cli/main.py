"""The ``collectx`` command: one argparse front door with subcommands.

A subcommand lives in its own module under ``collectx.cli`` and registers itself with two
functions: ``add_parser(subparsers)`` adds its parser, ``run(args) -> int`` does the work. Modules
listed in :data:`SUBCOMMAND_MODULES` that are not present are skipped, so the command works
while parts of collectx are still being built.

Every :class:`~collectx.errors.CollectXError` ends the command with one line on stderr,
``collectx: error: <message>``, and exit status 2 (argparse's status for bad usage): no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from ..errors import CollectXError, command_error

SUBCOMMAND_MODULES = ("topo", "plan")


def _add_build_info(subparsers) -> None:
    p = subparsers.add_parser("build-info", help="what the native library was built with",
                              description="Print what the native library was built with and "
                                          "what it sees (compiler, ISA, CUDA).")
    p.set_defaults(_run=_run_build_info)


def _run_build_info(args) -> int:
    try:
        from .._native import build_info
    except ImportError as exc:
        print(f"native library module unavailable: {exc}")
        return 1
    for key, value in build_info().items():
        print(f"{key}: {value}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``collectx`` parser with every available subcommand registered."""
    from .. import __version__
    parser = argparse.ArgumentParser(
        prog="collectx", description="Topology-aware collective communication: inspect a "
                                     "machine's wiring and the schedules planned on it.")
    parser.add_argument("--version", action="version", version=f"collectx {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(f"{__package__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"{__package__}.{name}":
                continue  # that subcommand is not part of this build
            raise
        before = set(subparsers.choices)
        module.add_parser(subparsers)
        for added in set(subparsers.choices) - before:
            subparsers.choices[added].set_defaults(_run=module.run)
    _add_build_info(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``collectx`` with ``argv`` (default: the command line); return the exit status."""
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if getattr(args, "_run", None) is None:
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except BrokenPipeError:  # `collectx topo | head`
        return 0
    except (CollectXError, OSError) as exc:
        if (message := command_error(exc)) is None:
            raise
        print(f"collectx: error: {' '.join(message.split())}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
