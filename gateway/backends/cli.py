"""`gateway config check [FILE]`: validate a backends file and print the resolved routes.

FILE defaults to GATEWAY_CONFIG.  Exit status 0 when the file is usable, 2
(with the file, line and key named) when it is not.
"""

from __future__ import annotations

import argparse
import os
import sys

from ..config import ConfigError
from .config import load_config

__all__ = ["add_arguments", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    check = commands.add_parser("check", help="validate a backends file and print its routes")
    check.add_argument("file", nargs="?", help="the TOML file (default: GATEWAY_CONFIG)")


def main(args: argparse.Namespace) -> int:
    path = args.file or os.environ.get("GATEWAY_CONFIG", "")
    if not path:
        print("gateway: name a file, or set GATEWAY_CONFIG", file=sys.stderr)
        return 2
    try:
        config = load_config(path)
    except ConfigError as error:
        print(f"gateway: {error}", file=sys.stderr)
        return 2
    print(config.describe())
    return 0
