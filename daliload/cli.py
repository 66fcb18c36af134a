"""The ``daliload`` console script.

Each subcommand lives in the module of its concept; that module exposes
``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``. This
file only wires them together, so adding a command is one line here.
"""

from __future__ import annotations

import argparse
import importlib
import sys

#: subcommand -> module implementing it
COMMANDS: dict[str, str] = {
    "synth": "daliload.synth.cli",
    "bench": "daliload.commands.bench",
    "scan": "daliload.prescreen.cli",
    "preview": "daliload.commands.preview",
    "demo": "daliload.commands.demo",
    "transcode": "daliload.transcode.cli",
    "doctor": "daliload.commands.doctor",
    "pack": "daliload.commands.pack",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="daliload",
        description="Kinetics-style video loading for PyTorch with NVIDIA DALI and a PyAV fallback.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(module_name)
        command = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(command)
        command.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
