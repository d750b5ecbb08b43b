"""How long a regex's token automaton takes to build (XGrammarBackend._automaton: the byte DFA,
the token tables and their bitmasks), once the vocabulary's byte matrix exists.

    python build_time.py TOKENIZER_DIR
"""
import sys
import time

from radixlm.constrained.base import ConstraintKey
from radixlm.constrained.xgrammar_backend import XGrammarBackend
from radixlm.model_executor.weight_source import load_tokenizer

tok = load_tokenizer(sys.argv[1])
backend = XGrammarBackend(tok, len(tok), [tok.eos_token_id])
for spec in [r"[a-zA-Z ,.]+", r"(\d{3}-){2}\d{4}", r"[a-z]{0,150}",
             r"\{\"name\": \"[A-Za-z ]{1,20}\", \"age\": \d{1,3}\}"]:
    key = ConstraintKey("regex", spec)
    backend._automaton(key)          # (the first call also builds the vocabulary's bytes)
    start = time.perf_counter()
    automaton = backend._automaton(key)
    print(f"{spec!r}: {automaton.num_states} states, "
          f"{(time.perf_counter() - start) * 1e3:.0f} ms", flush=True)
backend.shutdown()
