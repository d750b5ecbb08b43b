"""Parsers of model output for the chat API: tool calls in each model family's format
(function_call/) and reasoning blocks (reasoning.py). They work on text only, so they are unit
testable on recorded outputs without a model."""

from radixlm.parsers.function_call import TOOL_CALL_PARSERS  # noqa: E402
from radixlm.parsers.reasoning import REASONING_PARSERS  # noqa: E402

__all__ = ["REASONING_PARSERS", "TOOL_CALL_PARSERS"]
