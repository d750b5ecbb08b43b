"""Expert selection: router logits -> each token's top-k experts and their weights.

The families differ only in how scores are made and chosen, so one function with a typed
config covers them (each model builds its `RoutingConfig` from the HF config):

  Mixtral, Qwen2/3-MoE   softmax over all experts, top-k, renormalised over the k
                         (Mixtral always; Qwen when `norm_topk_prob`)
  DeepSeek-V2            softmax, optionally group-limited (`topk_method: group_limited_greedy`:
                         keep the `topk_group` groups with the best single expert), scaled by
                         `routed_scaling_factor`
  DeepSeek-V3            sigmoid scores; the choice (not the weights) adds a learned correction
                         bias; groups ranked by the sum of their two best experts
                         (`topk_method: noaux_tc`); weights renormalised and scaled

Everything here has shapes fixed by the batch, so it runs inside CUDA graphs and needs no
host sync. On CUDA, ungrouped routing is one Triton kernel (topk_kernel.py); grouped routing
and the CPU use the torch ops below.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from radixlm.layers.kernels import triton_available

Scoring = Literal["softmax", "sigmoid"]
GroupScore = Literal["max", "top2_sum"]


@dataclass(frozen=True)
class RoutingConfig:
    top_k: int
    scoring: Scoring = "softmax"
    renormalize: bool = False
    num_groups: int = 1                 # expert groups (DeepSeek's n_group); 1: no grouping
    topk_groups: int = 1                # groups a token may use (topk_group)
    group_score: GroupScore = "max"     # how a group is ranked
    scaling_factor: float = 1.0         # routed_scaling_factor, applied to the final weights

    def __post_init__(self) -> None:
        if self.top_k < 1:
            raise ValueError(f"num_experts_per_tok must be >= 1, got {self.top_k}")
        if self.scoring not in ("softmax", "sigmoid"):
            raise ValueError(f"unsupported MoE scoring function {self.scoring!r}")
        if self.num_groups > 1 and not 1 <= self.topk_groups <= self.num_groups:
            raise ValueError(f"topk_group {self.topk_groups} must be in 1..n_group "
                             f"({self.num_groups})")

    def check(self, num_experts: int) -> None:
        """Refuse, at model build time, a routing these experts cannot serve (rather than an
        error at the first forward pass, or experts picked from outside the allowed groups)."""
        def bad(why: str) -> ValueError:
            return ValueError(f"--model-path: unsupported MoE config: {why}")
        if num_experts < 1:
            raise bad("no experts (num_experts / num_local_experts / n_routed_experts)")
        if self.top_k > num_experts:
            raise bad(f"num_experts_per_tok {self.top_k} > {num_experts} experts")
        if self.grouped:
            if num_experts % self.num_groups:
                raise bad(f"n_group {self.num_groups} does not divide {num_experts} experts")
            size = num_experts // self.num_groups
            if self.group_score == "top2_sum" and size < 2:
                raise bad("groups ranked by their two best experts need >= 2 experts each")
            if self.topk_groups * size < self.top_k:
                raise bad(f"topk_group {self.topk_groups} groups of {size} experts hold fewer "
                          f"than num_experts_per_tok {self.top_k}")

    @property
    def grouped(self) -> bool:
        return self.num_groups > 1 and self.topk_groups < self.num_groups


def select_experts(router_logits: torch.Tensor, cfg: RoutingConfig,
                   correction_bias: torch.Tensor | None = None, force_triton: bool = False
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [T, E] -> (weights [T, k] float32, expert ids [T, k] int32).
    `force_triton`: the kernel on any device (tests under TRITON_INTERPRET=1)."""
    if (force_triton or (router_logits.is_cuda and triton_available())) and not cfg.grouped:
        from radixlm.layers.moe import topk_kernel
        if topk_kernel.supports(router_logits.shape[1], cfg.top_k):
            return topk_kernel.route(router_logits, cfg.top_k, cfg.scoring == "sigmoid",
                                     cfg.renormalize, cfg.scaling_factor, correction_bias)
    return select_experts_torch(router_logits, cfg, correction_bias)


def select_experts_torch(router_logits: torch.Tensor, cfg: RoutingConfig,
                         correction_bias: torch.Tensor | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch ops (the reference, the CPU path, grouped routing)."""
    logits = router_logits.float()
    scores = logits.softmax(dim=-1) if cfg.scoring == "softmax" else logits.sigmoid()
    # What experts are chosen by: the scores, plus the correction bias where there is one
    # (DeepSeek-V3 balances load with it; it never enters the weights).
    choice = scores if correction_bias is None else scores + correction_bias.float()
    if cfg.grouped:
        choice = _mask_to_best_groups(choice, cfg)
    ids = torch.topk(choice, cfg.top_k, dim=-1, sorted=False).indices
    weights = scores.gather(1, ids)
    if cfg.renormalize and cfg.top_k > 1:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    if cfg.scaling_factor != 1.0:
        weights = weights * cfg.scaling_factor
    return weights, ids.to(torch.int32)


def _mask_to_best_groups(choice: torch.Tensor, cfg: RoutingConfig) -> torch.Tensor:
    """`choice` with every expert outside the token's `topk_groups` best groups set to -inf
    (so top-k never picks them; their real scores are untouched)."""
    t, e = choice.shape
    if e % cfg.num_groups:
        raise ValueError(f"n_group {cfg.num_groups} must divide the number of experts ({e})")
    grouped = choice.view(t, cfg.num_groups, e // cfg.num_groups)
    if cfg.group_score == "max":
        group_scores = grouped.max(dim=-1).values
    else:
        group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
    best = torch.topk(group_scores, cfg.topk_groups, dim=-1, sorted=False).indices
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best, True)
    return grouped.masked_fill(~keep.unsqueeze(-1), float("-inf")).view(t, e)
