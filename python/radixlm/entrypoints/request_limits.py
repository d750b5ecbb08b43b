"""Upper bounds on the work one HTTP request may ask for (`n`, prompts per batch, stop strings),
checked before anything is tokenized. They are server settings (ServerArgs.max_*); the offline
Engine applies none, since there the caller is the operator."""

from __future__ import annotations

from typing import Any, Sequence

from radixlm.config import ServerArgs
from radixlm.managers.generate_request import GenerateReqInput


class LimitExceeded(ValueError):
    """A request over a server limit; `field` is what is over it: "prompts", "n", "stop" or
    "stop_regex"."""

    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.field = field


def check_request_limits(args: ServerArgs, num_prompts: int, ns: Sequence[Any],
                         stops: Sequence[Any], n_field: str = "n",
                         stop_field: str = "stop") -> None:
    """Raise LimitExceeded naming the setting that a request exceeds. `ns` and `stops` are the
    requested `n` and `stop` of each prompt (as given: ints / strings / lists / None)."""
    if num_prompts > args.max_prompts_per_request:
        raise LimitExceeded(f"the request has {num_prompts} prompts; this server accepts at "
                            f"most {args.max_prompts_per_request} per request "
                            f"(--max-prompts-per-request)", "prompts")
    for n in ns:
        if isinstance(n, int) and not isinstance(n, bool) and n > args.max_n_per_request:
            raise LimitExceeded(f"{n_field} must be <= {args.max_n_per_request} "
                                f"(--max-n-per-request), got {n}", "n")
    for stop in stops:
        count = len(stop) if isinstance(stop, list) else 0
        if count > args.max_stop_strings:
            raise LimitExceeded(f"{stop_field} has {count} entries; at most "
                                f"{args.max_stop_strings} are allowed (--max-stop-strings)",
                                stop_field.rsplit(".", 1)[-1])


def check_generate_limits(args: ServerArgs, obj: GenerateReqInput) -> None:
    """The limits for a native /generate request (single or batch)."""
    params = obj.sampling_params if isinstance(obj.sampling_params, list) \
        else [obj.sampling_params]
    params = [p for p in params if isinstance(p, dict)]
    check_request_limits(args, obj.num_prompts, [p.get("n") for p in params],
                         [p.get("stop") for p in params], "sampling_params.n",
                         "sampling_params.stop")
    # (each pattern is searched every step: the same cap as stop strings)
    check_request_limits(args, obj.num_prompts, [], [p.get("stop_regex") for p in params],
                         stop_field="sampling_params.stop_regex")
