"""``python3 -m bench SUBCOMMAND [args]``: every benchmark behind one command line."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

from bench import SUBCOMMANDS, benchkit, module_name


def _load(name: str) -> ModuleType | str:
    """The subcommand's module, or why it cannot be imported here."""
    try:
        return importlib.import_module(module_name(name))
    except Exception as exc:  # one broken bench must not take the others' command line with it
        return f"{type(exc).__name__}: {exc}"


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line: one subparser per subcommand, filled by its module's
    ``add_arguments``. With ``only``, just that subcommand's module is imported (the
    others' parsers stay empty); modules import their heavy frameworks inside ``run``."""
    parser = argparse.ArgumentParser(
        prog="python3 -m bench", description=(sys.modules["bench"].__doc__ or "").split("\n\n")[0],
        epilog="`python3 -m bench SUBCOMMAND --help` describes each one.")
    sub = parser.add_subparsers(dest="subcommand", metavar="SUBCOMMAND", required=True)
    for name in SUBCOMMANDS:
        if only is not None and name != only:
            sub.add_parser(name)
            continue
        module = _load(name)
        if isinstance(module, str):
            sub.add_parser(name, help=f"(cannot be imported here: {module})").set_defaults(_broken=module)
            continue
        doc = (module.__doc__ or "").strip()
        p = sub.add_parser(name, help=doc.splitlines()[0] if doc else None, description=doc,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(only=argv[0] if argv and argv[0] in SUBCOMMANDS else None).parse_args(argv)
    if hasattr(args, "_broken"):
        raise SystemExit(f"python3 -m bench {args.subcommand}: {args._broken}")
    run = args._run
    del args._run, args.subcommand  # the bench's own arguments only (some benches store them)
    benchkit.start_command(argv)
    return int(run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
