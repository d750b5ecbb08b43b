"""What the radixlm server and the in-process Engine backends share: both speak the native
/generate request shape, so generation, select and prefix caching are written once here;
subclasses only move a request dict to the engine and back.

How select scores choices. For prompt P and choices c_1..c_n:
1. tokenize P and each P + c_i (the engine's own tokenizer, so ids match what it caches);
2. k_i = the number of leading tokens P + c_i shares with P. Usually len(P's ids), one less when
   BPE merges P's last token with the start of c_i (" " + "Paris" -> " Paris"), so the scored
   tokens are exactly those that appending c_i produced;
3. prefill P's first min(k_i) tokens once (max_new_tokens 0), so that the batch below finds the
   prefix in the radix cache instead of computing it n times;
4. one batched request: input_ids = [ids(P + c_i)], logprob_start_len = [k_i], no new tokens;
   the prompt logprobs from position k_i are c_i's token logprobs;
5. unconditional_likelihood_normalized only: one more batched request, input_ids = each
   choice's scored tokens alone, for their logprobs without the prompt;
6. the choices method (mean logprob by default) picks.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, Iterator

from radixlm.lang.backends.base import (Backend, GenResult, PromptContext, SelectResult,
                                        StreamChunk)
from radixlm.lang.choices import ChoicesMethod
from radixlm.lang.errors import BackendError, BackendUnavailableError, RequestRejectedError
from radixlm.lang.ir import SamplingArgs
from radixlm.utils.sequences import common_prefix_len

# The sampling of a request for prompt logprobs or a prefix only: no new token, one sequence
# (n set: a server's --preferred-sampling-params fill only what a request leaves unset).
PROMPT_ONLY = {"max_new_tokens": 0, "n": 1}


def check_result(out: Any) -> dict[str, Any]:
    """Raise for an error body or an aborted request; return the result dict."""
    if not isinstance(out, dict):
        raise BackendError(f"unexpected response from the backend: {out!r:.200}")
    if "error" in out and "text" not in out:
        err = out["error"] if isinstance(out["error"], dict) else {"message": out["error"]}
        code = err.get("code")
        cls = (BackendUnavailableError if code == 503 else
               RequestRejectedError if code in (400, 422) else BackendError)
        raise cls(str(err.get("message", out)))
    reason = (out.get("meta_info") or {}).get("finish_reason") or {}
    if reason.get("type") == "abort":
        message = reason.get("message") or "the request was aborted"
        cls = BackendUnavailableError if "died" in message or "not running" in message \
            else BackendError
        raise cls(f"the backend aborted the request: {message}")
    return out


class NativeBackend(Backend):
    # ------------------------------------------------------------------ transport (subclasses)

    @abstractmethod
    def _generate(self, payload: dict[str, Any]) -> Any:
        """Send one /generate request (not streaming); return the decoded result."""

    @abstractmethod
    def _generate_stream(self, payload: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """Send one streaming /generate request; yield its chunks (cumulative `text`)."""

    @abstractmethod
    def _tokenize(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, exactly as the engine tokenizes a `text` prompt."""

    # ------------------------------------------------------------------ Backend

    @staticmethod
    def _payload(ctx: PromptContext, args: SamplingArgs) -> dict[str, Any]:
        return {"text": ctx.text, "sampling_params": args.to_native(), **args.logprob_fields()}

    def generate(self, ctx: PromptContext, args: SamplingArgs) -> GenResult:
        got = self._generate(self._payload(ctx, args))
        outs = [check_result(o) for o in got] if isinstance(got, list) else [check_result(got)]
        if len(outs) != (args.n or 1):
            raise BackendError(f"expected {args.n or 1} samples, the backend returned "
                               f"{len(outs)}")
        for out in outs:
            self.usage.add(out["meta_info"])
        return GenResult.of_samples([o["text"] for o in outs], [o["meta_info"] for o in outs])

    def generate_stream(self, ctx: PromptContext, args: SamplingArgs) -> Iterator[StreamChunk]:
        seen = 0
        last: dict[str, Any] | None = None
        for chunk in self._generate_stream({**self._payload(ctx, args), "stream": True}):
            check_result(chunk)
            text = chunk.get("text", "")
            last = chunk
            if len(text) > seen:
                yield StreamChunk(text[seen:], chunk.get("meta_info"))
                seen = len(text)
        if last is None:
            raise BackendError("the stream ended without any output")
        self.usage.add(last.get("meta_info") or {})
        yield StreamChunk("", last.get("meta_info"))  # the final meta_info

    def cache_prefix(self, text: str) -> None:
        if text:
            self._prefill({"text": text})

    def _prefill(self, prompt: dict[str, Any]) -> None:
        out = check_result(self._generate({**prompt, "sampling_params": dict(PROMPT_ONLY)}))
        self.usage.add(out["meta_info"])

    def select(self, ctx: PromptContext, choices: list[str], method: ChoicesMethod,
               temperature: float) -> SelectResult:
        ids = self._tokenize([ctx.text] + [ctx.text + c for c in choices])
        prefix_ids, full = ids[0], ids[1:]
        starts = [common_prefix_len(prefix_ids, f) for f in full]
        for choice, f, k in zip(choices, full, starts):
            if k >= len(f):
                raise ValueError(f"select choice {choice!r} adds no token to the prompt")
            if k == 0:  # (its first token would go unscored: -inf for one-token choices)
                raise ValueError(f"select needs prompt text before it: the first token of "
                                 f"choice {choice!r} has nothing before it to be scored on "
                                 f"(an empty prompt, or one whose only token merges into it)")
        shared = min(starts)
        if shared > 0:
            self._prefill({"input_ids": prefix_ids[:shared]})
        outs = self._generate({"input_ids": full, "sampling_params": dict(PROMPT_ONLY),
                               "return_logprob": True, "logprob_start_len": starts})
        if not isinstance(outs, list) or len(outs) != len(choices):
            raise BackendError(f"expected {len(choices)} results for the select batch")
        entries, outputs, logprobs = [], [], []
        for out, f, k in zip(outs, full, starts):
            meta = check_result(out)["meta_info"]
            self.usage.add(meta)
            lps = meta.get("input_token_logprobs") or []
            entries.append(lps)
            outputs.append(meta.get("output_token_logprobs") or [])   # (no new tokens: empty)
            scored = [e[0] for e in lps if e[0] is not None]
            expected = len(f) - max(k, 1)  # position 0 never has a logprob
            if len(scored) != expected:
                raise BackendError(f"the backend returned {len(scored)} prompt logprobs for a "
                                   f"choice of {expected} scored tokens")
            logprobs.append(scored)
        token_ids = [f[k:] for f, k in zip(full, starts)]
        extra: dict[str, Any] = {}
        unconditional = None
        if method.requires_unconditional_logprobs:
            uncond_entries = self._unconditional_logprobs(token_ids)
            unconditional = [[e[0] for e in lps] for lps in uncond_entries]
            extra["unconditional_token_logprobs"] = uncond_entries
        decision = method(logprobs, temperature, unconditional)
        # SGLang's select meta_info keys, then what the method decided by, then ours.
        meta_info = {"normalized_prompt_logprobs": decision.scores,
                     "input_token_logprobs": entries, "output_token_logprobs": outputs,
                     **decision.meta, **extra,
                     "choice_token_ids": token_ids, "choices_method": method.name}
        return SelectResult(decision.index, choices[decision.index], decision.scores, meta_info)

    def _unconditional_logprobs(self, token_ids: list[list[int]]) -> list[list[Any]]:
        """Each choice's tokens scored on their own (no prompt): SGLang's unconditional token
        logprobs. The first has nothing before it, so its logprob is None."""
        outs = self._generate({"input_ids": token_ids, "sampling_params": dict(PROMPT_ONLY),
                               "return_logprob": True, "logprob_start_len": 0})
        if not isinstance(outs, list) or len(outs) != len(token_ids):
            raise BackendError(f"expected {len(token_ids)} results for the unconditional "
                               f"logprobs of the select")
        result = []
        for out, ids in zip(outs, token_ids):
            meta = check_result(out)["meta_info"]
            self.usage.add(meta)
            lps = meta.get("input_token_logprobs") or []
            if len(lps) != len(ids):
                raise BackendError(f"the backend returned {len(lps)} unconditional logprobs "
                                   f"for a choice of {len(ids)} tokens")
            result.append(lps)
        return result
