"""`python -m radixlm ...`: the `radixlm` command."""

from radixlm.cli import run

run()
