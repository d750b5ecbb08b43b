"""GenerateReqInput: SGLang's native /generate request, single or batch, and its normalisation
into one entry per sequence to generate (prompts x n)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Iterator

from radixlm.sampling.params import ALIASES, SamplingParams

# sampling_params' own names (and aliases): at the top level of a request they are misplaced
SAMPLING_FIELDS = frozenset(SamplingParams.__dataclass_fields__) | frozenset(ALIASES)


@dataclass
class SingleGenerate:
    """One sequence to generate, after expanding batches and n."""
    rid: str
    text: str | None
    input_ids: list[int] | None
    sampling_params: SamplingParams
    return_logprob: bool
    logprob_start_len: int
    top_logprobs_num: int
    index: int                      # position in the flattened response list
    token_ids_logprob: list[int] | None = None   # ids whose logprobs each position reports
    # The request named its max_new_tokens (not the default, nor --preferred-sampling-params'):
    # past the context it is then refused, as SGLang does, unless --allow-auto-truncate.
    budget_given: bool = False


# SGLang /generate fields that radixlm does not implement. A request that sets one is refused
# (400) rather than answered as if the field were not there: a field that is accepted must work.
UNSUPPORTED_FIELDS = ("input_embeds", "image_data", "audio_data", "video_data", "lora_path",
                      "lora_id", "custom_logit_processor", "return_hidden_states",
                      "session_params", "extra_key", "bootstrap_host",
                      "bootstrap_port", "bootstrap_room", "bootstrap_pair_key",
                      "positional_embed_overrides", "return_entropy", "return_prompt_token_ids",
                      "return_routed_experts", "routed_experts_start_len",
                      "return_indexer_topk", "require_reasoning", "disagg_prefill_dp_rank",
                      "priority")
# The data-parallel rank to run on (SGLang's name, and its older one): 0 or None only.
DP_RANK_FIELDS = ("routed_dp_rank", "data_parallel_rank")
# What else SGLang's generate takes: the refused fields, the ranks, log_metrics (true only).
SGLANG_ONLY_FIELDS = (*UNSUPPORTED_FIELDS, *DP_RANK_FIELDS, "log_metrics")


@dataclass
class GenerateReqInput:
    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    return_logprob: bool | list[bool] = False
    logprob_start_len: int | list[int] = -1
    top_logprobs_num: int | list[int] = 0
    # token ids whose logprobs every position reports: one list for all prompts, or one each
    token_ids_logprob: list[int] | list[list[int]] | None = None
    return_text_in_logprobs: bool = False
    stream: bool = False
    rid: str | list[str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "GenerateReqInput":
        known = {f for f in cls.__dataclass_fields__ if f != "extra"}
        for name in UNSUPPORTED_FIELDS:
            if d.get(name) not in (None, False, "", [], {}):
                raise ValueError(f"`{name}` is not supported by this server")
        for name in DP_RANK_FIELDS:
            if d.get(name) not in (None, 0) or d.get(name) is False:
                raise ValueError(f"{name} must be 0 or null: this server runs one engine")
        if d.get("log_metrics", True) is not True and d.get("log_metrics") is not None:
            raise ValueError("log_metrics false is not supported: every request is counted "
                             "in /metrics")
        misplaced = sorted(k for k in d if k in SAMPLING_FIELDS and k not in known)
        if misplaced:   # (SGLang ignores them: the request would run with the defaults)
            raise ValueError(f"`{misplaced[0]}` is a sampling parameter: it goes inside "
                             f"`sampling_params`")
        if "prompt" in d and "text" not in d:  # a common alias
            d = {**d, "text": d["prompt"]}
        return cls(**{k: v for k, v in d.items() if k in known},
                   extra={k: v for k, v in d.items() if k not in known})

    @property
    def is_batch(self) -> bool:
        if self.text is not None:
            return isinstance(self.text, list)
        return bool(self.input_ids) and isinstance(self.input_ids[0], list)

    @property
    def num_prompts(self) -> int:
        """Prompts in the request, before validation (for limits checked ahead of it)."""
        prompts = self.text if self.text is not None else self.input_ids
        return len(prompts) if self.is_batch and isinstance(prompts, list) else 1

    def expand(self, defaults: dict[str, Any] | None = None) -> list[list[SingleGenerate]]:
        """One group per prompt; each group holds its n sequences. Raises ValueError."""
        return list(self.groups(defaults))

    def _prompt_batch(self) -> list:
        """The prompts, one entry per prompt (texts, or lists of ids). Raises ValueError."""
        if (self.text is None) == (self.input_ids is None):
            raise ValueError("exactly one of `text` and `input_ids` must be given")
        if self.text is not None:
            texts = self.text if isinstance(self.text, list) else [self.text]
            if not all(isinstance(t, str) for t in texts):
                raise ValueError("`text` must be a string or a list of strings")
            return texts
        ids = self.input_ids
        if not isinstance(ids, list):
            raise ValueError("`input_ids` must be a list of token ids or a list of lists")
        return ids if ids and isinstance(ids[0], list) else [ids]

    def declared_sequences(self, defaults: dict[str, Any] | None = None) -> int:
        """Prompts x n as the request declares them (0 when its shape is not valid: `groups`
        says why); a limit on sequences is checked before any prompt is sent."""
        try:
            n_prompts = len(self._prompt_batch())
            params = _per_prompt(self.sampling_params, n_prompts, "sampling_params", None)
        except ValueError:
            return 0
        total = 0
        for p in params:
            n = (p if isinstance(p, dict) else {}).get("n", (defaults or {}).get("n", 1))
            total += n if _is_int(n) and n > 0 else 1
        return total

    def groups(self, defaults: dict[str, Any] | None = None) -> Iterator[list[SingleGenerate]]:
        """`expand` one prompt at a time: what concerns the whole request is checked before the
        first group, each prompt's own fields (its ids' types, its sampling parameters) just
        before its group. The tokenizer manager sends each prompt on as soon as it passes, so
        the first prefill of a big batch starts while later prompts are still being checked.
        `defaults` (--preferred-sampling-params) fill the sampling_params each prompt leaves
        out."""
        batch = self._prompt_batch()
        n_prompts = len(batch)
        if n_prompts == 0:
            raise ValueError("the batch is empty")
        params = _per_prompt(self.sampling_params, n_prompts, "sampling_params", None)
        want_lp = _per_prompt(self.return_logprob, n_prompts, "return_logprob", False)
        starts = _per_prompt(self.logprob_start_len, n_prompts, "logprob_start_len", -1)
        tops = _per_prompt(self.top_logprobs_num, n_prompts, "top_logprobs_num", 0)
        asked = _token_ids_logprob(self.token_ids_logprob, n_prompts)
        if isinstance(self.rid, list):
            rids = _per_prompt(self.rid, n_prompts, "rid", None)
        elif isinstance(self.rid, str) and self.rid and n_prompts > 1:
            rids = [f"{self.rid}_{i}" for i in range(n_prompts)]   # as SGLang names them
        else:
            rids = [self.rid] * n_prompts
        for name in ("stream", "return_text_in_logprobs"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), bool):
                raise ValueError(f"`{name}` must be true or false")
        if not all(isinstance(w, bool) for w in want_lp):
            raise ValueError("`return_logprob` must be true or false (or a list of them)")
        if not all(r is None or (isinstance(r, str) and r) for r in rids):
            raise ValueError("`rid` must be a non-empty string (or a list of them for a batch)")
        index = 0
        for i, prompt in enumerate(batch):
            text, ids = (prompt, None) if self.text is not None else (None, _token_ids(prompt))
            if not isinstance(params[i], (dict, type(None))):
                raise ValueError("`sampling_params` must be an object")
            sp = SamplingParams.from_dict(_with_defaults(params[i], defaults))
            sp.validate()
            budget_given = isinstance(params[i], dict) and \
                params[i].get("max_new_tokens") is not None
            # (bool is an int in Python: JSON's true would pass as 1, and reach torch.topk)
            if not _is_int(starts[i]) or starts[i] < -1:
                raise ValueError(f"logprob_start_len must be an integer >= -1, got {starts[i]!r}")
            if not _is_int(tops[i]) or tops[i] < 0:
                raise ValueError(f"top_logprobs_num must be an integer >= 0, got {tops[i]!r}")
            base = rids[i] or uuid.uuid4().hex
            group = []
            for k in range(sp.n):
                child = sp
                if sp.n > 1:
                    child = SamplingParams.from_dict({**sp.__dict__, "n": 1})
                    if sp.sampling_seed is not None:  # distinct but reproducible samples
                        child.sampling_seed = sp.sampling_seed + k
                rid = base if sp.n == 1 else f"{base}-{k}"
                group.append(SingleGenerate(rid, text, ids, child, bool(want_lp[i]), starts[i],
                                            tops[i], index, asked[i], budget_given))
                index += 1
            yield group


def _with_defaults(params: dict[str, Any] | None,
                   defaults: dict[str, Any] | None) -> dict[str, Any] | None:
    """A prompt's sampling_params over the server's defaults (a field set to null counts as
    left out)."""
    if not defaults:
        return params
    return {**defaults, **{k: v for k, v in (params or {}).items() if v is not None}}


def _token_ids(one: Any) -> list[int]:
    """A prompt's `input_ids`, checked to be a list of ints (copied: the request's own list
    stays the caller's)."""
    # (type(), not isinstance: a bool is an int subclass but no token id; the set of types is
    # built in C, a per-element check costs ~0.1 s per 1M ids.)
    if not isinstance(one, list) or not set(map(type, one)) <= {int}:
        raise ValueError("`input_ids` must contain integer token ids")
    return list(one)


def _token_ids_logprob(value: Any, n: int) -> list[list[int] | None]:
    """`token_ids_logprob` per prompt: a list of ids applies to every prompt, a list of lists
    gives each its own (SGLang's two forms); an empty list asks for nothing."""
    if value is None:
        return [None] * n
    if not isinstance(value, list):
        raise ValueError("`token_ids_logprob` must be a list of token ids (or one per prompt)")
    per_prompt = [value] * n
    if value and isinstance(value[0], list):
        per_prompt = _per_prompt(value, n, "token_ids_logprob", None)
    out = []
    for ids in per_prompt:
        if not isinstance(ids, list) or not all(_is_int(t) and t >= 0 for t in ids):
            raise ValueError("`token_ids_logprob` must hold token ids (integers >= 0)")
        out.append(list(ids) or None)
    return out


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _per_prompt(value: Any, n: int, name: str, default: Any) -> list[Any]:
    if isinstance(value, list):
        if len(value) != n:
            raise ValueError(f"`{name}` has {len(value)} entries for {n} prompts")
        return value
    return [default if value is None else value] * n
