"""The ``subd`` command line.

Subcommands live in ``subd.commands.<name>`` and benchmarks in ``subd.bench.<name>``; each such
module defines ``register(subparsers)`` (adds its parser and sets ``func``) so that new commands
need no edit here. Exit codes: 0 ok, 2 bad input or usage, 1 internal error.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys

from subd.errors import UserError

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_BAD_INPUT = 2


def _register_package(package_name: str, subparsers: argparse._SubParsersAction) -> None:
    package = importlib.import_module(package_name)
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{package_name}.{info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(subparsers)


def _wants_bench(argv: list[str]) -> bool:
    """Whether the command line names ``bench`` (benchmark modules, and through them torch and
    Triton, are imported only then: ``subd run`` must not load them into the publisher)."""
    return next((a for a in argv if not a.startswith("-")), None) == "bench"


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="subd", description="Real-time subtitle daemon")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _register_package("subd.commands", sub)
    bench = sub.add_parser("bench", help="benchmarks that print figures and ratios")
    bench_sub = bench.add_subparsers(dest="bench", metavar="BENCH")
    if _wants_bench(sys.argv[1:] if argv is None else argv):
        _register_package("subd.bench", bench_sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on usage errors, 0 on --help
        return int(exc.code or 0)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return EXIT_BAD_INPUT
    try:
        return int(func(args) or 0)
    except UserError as exc:
        print(f"subd: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("subd: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return EXIT_OK
    except Exception as exc:  # noqa: BLE001 - last line of defence: one line, exit 1
        logging.getLogger("subd").debug("internal error", exc_info=True)
        print(f"subd: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
