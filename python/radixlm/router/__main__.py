"""`python -m radixlm.router ...`: the same router as `radixlm router ...`."""

import argparse
import sys

from radixlm.router.config import RouterArgs
from radixlm.router.server import run_router

parser = argparse.ArgumentParser(prog="python -m radixlm.router")
RouterArgs.add_cli_args(parser)
try:
    args = RouterArgs.from_cli_args(parser.parse_args())
except ValueError as e:   # names the bad flag
    parser.exit(2, f"{parser.prog}: error: {e}\n")
sys.exit(run_router(args))
