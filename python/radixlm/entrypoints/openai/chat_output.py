"""Response side of the chat parsers: one choice's generated text -> reasoning_content,
content and tool_calls, whole (a message) or streamed (deltas).

Both go through `OutputParsing.split`, a pure function of the text so far: a stream sends the
differences between successive splits of the cumulative text, so the client accumulates exactly
the non-streamed message. A call goes out whole, in one delta of OpenAI's shape (index, id,
type, name and its arguments), once its text is complete: a call the model leaves unfinished
(it stops in the middle) is then content with finish_reason "stop" in both forms, where a call
streamed piece by piece could not be taken back. A call cut by max_tokens goes out as far as it
got at the end, as the whole message reports it (finish_reason "length").
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Optional

from radixlm.entrypoints.openai.response_models import (ChatResponseMessage, DeltaFunctionCall,
                                                        DeltaMessage, DeltaToolCall, FunctionCall,
                                                        ToolCall)
from radixlm.parsers.function_call import PartialCall, ToolCallParser
from radixlm.parsers.reasoning import ReasoningParser


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class Split:
    reasoning: str
    content: str
    calls: list[PartialCall]


@dataclass(frozen=True)
class OutputParsing:
    """The parsers that apply to one request (either may be None)."""
    reasoning: Optional[ReasoningParser] = None
    inside_reasoning: bool = False      # the output starts inside a thinking block
    tools: Optional[ToolCallParser] = None
    max_calls: Optional[int] = None     # parallel_tool_calls false: the first call only
    names: Optional[frozenset[str]] = None   # functions a call may name (others left out)

    @property
    def active(self) -> bool:
        return self.reasoning is not None or self.tools is not None

    def split(self, text: str, final: bool, truncated: bool = False) -> Split:
        """`truncated`: the output was cut at max_tokens. A call it was in the middle of stays
        a call (its arguments as far as they got, finish_reason "length"), as it was streamed,
        rather than turning the whole call region into content at the end."""
        if truncated and final:
            partial = self.split(text, final=False)
            if any(c.name is not None for c in partial.calls):
                return partial
            # (cut before a call's name was whole: no call to report, the text stays content)
        reasoning, rest = "", text
        if self.reasoning is not None:
            r = self.reasoning.split(text, self.inside_reasoning, final)
            reasoning, rest = r.reasoning, r.content
        if self.tools is None:
            return Split(reasoning, rest, [])
        scan = self.tools.scan(rest, final)
        calls = scan.calls
        if self.names is not None:   # (a call's name is known whole or not at all)
            calls = [c for c in calls if c.name is None or c.name in self.names]
        return Split(reasoning, scan.content, calls[:self.max_calls])

    def message(self, text: str, truncated: bool = False) -> ChatResponseMessage:
        """The finished choice's message. A finished scan holds only complete calls, but for
        a call cut by max_tokens (`truncated`)."""
        if not self.active:
            return ChatResponseMessage(content=text)
        s = self.split(text, final=True, truncated=truncated)
        calls = [ToolCall(id=call_id(), function=FunctionCall(name=c.name, arguments=c.arguments))
                 for c in s.calls if (c.complete or truncated) and c.name is not None]
        return ChatResponseMessage(content=(s.content or None) if calls else s.content,
                                   reasoning_content=s.reasoning or None,
                                   tool_calls=calls or None)


@dataclass
class ChoiceDeltas:
    """What one streamed choice has sent; `delta` gives the next piece."""
    parsing: OutputParsing
    reasoning: str = ""
    content: str = ""
    call_ids: list[str] = field(default_factory=list)     # of the calls sent, in order

    @property
    def called(self) -> bool:
        return bool(self.call_ids)

    def delta(self, text: str, final: bool, truncated: bool = False) -> DeltaMessage:
        s = self.parsing.split(text, final, truncated)
        reasoning = _grow(self.reasoning, s.reasoning)
        content = _grow(self.content, s.content)
        self.reasoning += reasoning
        self.content += content
        pieces = []
        for i, call in enumerate(s.calls[len(self.call_ids):], start=len(self.call_ids)):
            if call.name is None or not (call.complete or (final and truncated)):
                break       # calls go out in order, each whole (module docstring)
            self.call_ids.append(call_id())
            pieces.append(DeltaToolCall(index=i, id=self.call_ids[-1], type="function",
                                        function=DeltaFunctionCall(name=call.name,
                                                                   arguments=call.arguments)))
        return DeltaMessage(reasoning_content=reasoning or None, content=content or None,
                            tool_calls=pieces or None)


def _grow(sent: str, now: str) -> str:
    """The new end of `now` past what was sent. A text that no longer extends what was sent
    (output that turned out malformed only at its end) adds nothing: sent text stays sent."""
    return now[len(sent):] if now.startswith(sent) else ""
