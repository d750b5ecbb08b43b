"""When speculation pays (issue 18's adaptive policy): draft only while a request's drafts yield
more tokens than the verify steps cost.

A step that carries drafts cannot overlap the host's work with the GPU's: the drafts are read
from the text, so the previous step's tokens must be on the host before the step is built
(Scheduler._must_process_before_scheduling). Such a step costs `cost_ratio` plain overlapped
steps: on a small model, whose decode step takes about as long on the host as on the GPU, up to
twice as much; on a large one, where the GPU's time dominates, barely more. A proposal that
finds no match costs the same (the host waited for nothing). So each request keeps `gain`, a
running average of the tokens its attempts gave (1 + accepted drafts for a verify step, 1 for a
proposal without drafts), and drafts while gain >= cost_ratio. Below it, the request pauses:
its steps overlap again for `FIRST_PAUSE_STEPS`, doubling with each pause in a row up to
`MAX_PAUSE_STEPS` (text that never repeats itself soon costs next to nothing), back to the
first length once an attempt pays for itself. After a pause the request starts from a gain
that one more empty attempt takes below the ratio.

`StepTimes` measures the ratio as the engine runs: the wall time between the results of two
decode steps of the same batch size, for verify steps and for plain overlapped steps, each a
running average (before both were seen, DEFAULT_COST_RATIO; RADIXLM_SPEC_COST_RATIO fixes it,
for decisions that do not depend on timing). Under the plain loop (no overlap)
every step waits for its results and the ratio is only the verify rows' extra compute.

In a batch, a step with drafts makes every request's step wait: drafts are planned only when
the drafting requests' expected extra tokens, sum(gain - 1), cover the extra cost of the whole
batch's step, (cost_ratio - 1) x batch size.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import radixlm.envs as envs

if TYPE_CHECKING:
    from radixlm.scheduler.request import Req

EMA_WEIGHT = 0.3            # weight of the newest attempt in a request's gain
TIME_EMA_WEIGHT = 0.1       # weight of the newest step in StepTimes' averages
FIRST_PAUSE_STEPS = 4
MAX_PAUSE_STEPS = 64
DEFAULT_COST_RATIO = 1.5    # a verify step over a plain overlapped one, until both are timed
MAX_COST_RATIO = 8.0
START_GAIN_MARGIN = 1.0     # a new request's gain: the ratio plus this (a few misses' credit)


@dataclass
class StepTimes:
    """Running averages of the wall time a decode step takes, verify steps and plain ones
    apart; `cost_ratio` is their quotient."""
    verify_s: float | None = None
    plain_s: float | None = None
    plain_waits: bool = False   # the plain loop: every step waits for its results
    # RADIXLM_SPEC_COST_RATIO: the ratio to use instead of the measured one
    fixed_ratio: float | None = field(default_factory=envs.spec_cost_ratio)
    _last_at: float | None = field(default=None, repr=False)
    _last_key: tuple[int, bool, bool] | None = field(default=None, repr=False)

    def on_processed(self, decode: bool, batch_size: int, verify: bool, waited: bool,
                     now: float | None = None) -> None:
        """A step's results were just processed. `waited`: the host waited for them before it
        could build the next step. Only the interval between two decode steps of one batch
        size is a step's time: a verify step's after any such step, a plain step's after
        another plain one that, like it, overlapped (under the plain loop, where every step
        waits: waited). (An overlapped loop's waiting plain steps are proposals that found no
        drafts, which cost what a verify step costs; they are not timed.)"""
        now = time.perf_counter() if now is None else now
        key = (batch_size, verify, waited) if decode else None
        last_key, last_at = self._last_key, self._last_at
        self._last_at, self._last_key = now, key
        if key is None or last_key is None or last_at is None or last_key[0] != batch_size:
            return
        seconds = now - last_at
        if verify:
            self.verify_s = _ema(self.verify_s, seconds)
        elif waited == self.plain_waits and last_key == key:
            self.plain_s = _ema(self.plain_s, seconds)

    @property
    def cost_ratio(self) -> float:
        if self.fixed_ratio is not None:
            return self.fixed_ratio
        if self.verify_s is None or self.plain_s is None or self.plain_s <= 0:
            return DEFAULT_COST_RATIO
        return min(max(self.verify_s / self.plain_s, 1.0), MAX_COST_RATIO)


def _ema(old: float | None, new: float) -> float:
    return new if old is None else (1 - TIME_EMA_WEIGHT) * old + TIME_EMA_WEIGHT * new


class DraftPolicy:
    """Which requests draft (the module docstring): per request gain and pauses, the batch's
    cost, the measured ratio."""

    def __init__(self, times: StepTimes | None = None):
        self.times = times or StepTimes()

    @property
    def cost_ratio(self) -> float:
        return self.times.cost_ratio

    def gain(self, req: "Req") -> float:
        if req.spec_gain is None:
            req.spec_gain = self.cost_ratio + START_GAIN_MARGIN
        return req.spec_gain

    def pays(self, req: "Req") -> bool:
        return self.gain(req) >= self.cost_ratio

    def batch_pays(self, candidates: list["Req"], batch_size: int) -> bool:
        """Whether drafts for `candidates` (requests not paused) are worth making the whole
        step of `batch_size` requests wait."""
        extra = sum(self.gain(r) - 1.0 for r in candidates if self.pays(r))
        return extra > 0 and extra >= (self.cost_ratio - 1.0) * batch_size

    def after_attempt(self, req: "Req", tokens: int) -> None:
        """`req` tried to draft and got `tokens` from the step (1 + accepted drafts; 1 when no
        drafts were found): update its gain, pause it if drafting stopped paying."""
        ratio = self.cost_ratio
        req.spec_gain = (1 - EMA_WEIGHT) * self.gain(req) + EMA_WEIGHT * tokens
        if tokens >= ratio:
            req.spec_pauses = 0
        if req.spec_gain < ratio:
            self.pause(req)

    def pause(self, req: "Req") -> None:
        """Stop `req` drafting for a while: longer after each pause in a row. (Also for a
        request whose gain the measured ratio overtook since its last attempt: it would
        neither draft nor pause.)"""
        ratio = self.cost_ratio
        req.spec_cooldown = min(FIRST_PAUSE_STEPS << req.spec_pauses, MAX_PAUSE_STEPS)
        req.spec_pauses += 1
        # A fresh chance after the pause, that one more empty attempt ends:
        # (1 - w) * g + w * 1 < ratio.
        req.spec_gain = ratio + 0.5 * (ratio - 1.0) * EMA_WEIGHT / (1 - EMA_WEIGHT)
