"""Command line: ``python -m longctx <command>``.

Each command lives in its own module under ``longctx/cli/`` and exposes ``register(subparsers)``.
Registration must stay cheap (no torch import): napkin math from the terminal starts instantly.
Bad arguments exit with status 2 and one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Command modules, in the order `--help` lists them.
COMMAND_MODULES = (
    "longctx.cli.doctor",
    "longctx.cli.calc",
    "longctx.cli.plan",
    "longctx.cli.model",
    "longctx.cli.simulate",
    "longctx.cli.niah",
    "longctx.cli.serve",
    "longctx.cli.bench",
    "longctx.cli.gpu",
)


class OneLineErrorParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are a single line on stderr and exit status 2, and which never reads
    an abbreviation as a longer flag (``--model`` is not ``--model-name``)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(prog="python -m longctx", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineErrorParser)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except ValueError as exc:
        sys.stderr.write(f"python -m longctx {args.command}: error: {exc}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
