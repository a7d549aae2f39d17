"""The `batchscope` console script: one entry point, one subcommand per component."""

from __future__ import annotations

import argparse
import sys

from exporter import cli as exporter_cli
from loadgen import cli as load_cli
from simulator import cli as sim_cli
from tuner import cli as tune_cli


class OneLineParser(argparse.ArgumentParser):
    """Bad input gets one line naming the problem (no usage dump) and exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="batchscope", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    sim_cli.add_parser(commands)
    load_cli.add_parser(commands)
    exporter_cli.add_parser(commands)
    tune_cli.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
