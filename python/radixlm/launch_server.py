"""`python -m radixlm.launch_server --model-path ...`: SGLang's launch command, spelled for
radixlm (the same as `radixlm serve ...`)."""

from __future__ import annotations

import sys

from radixlm.cli import main

if __name__ == "__main__":
    sys.exit(main(["serve", *sys.argv[1:]], fast_exit=True))
