"""`python -m gateway.lab.loadtest`: the same command as `gateway loadtest`."""

import sys

from .cli import build_parser, main

sys.exit(main(build_parser().parse_args()))
