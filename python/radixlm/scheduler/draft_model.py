"""The draft model of --speculative-algorithm STANDALONE: a smaller model with the target's
vocabulary proposes each request's next tokens (scheduler/speculation.py verifies them against
the target, so any draft is safe and a good one is fast). It drafts as the request samples: the
argmax for greedy requests, and for the others the request's own sampler with its seeded noise
at each position (sampling/noise.py), so a draft model whose distribution is the target's
proposes exactly the tokens the target will draw and every draft is kept.

Its KV lives in a pool of its own indexed by the target's slots: the draft runner reads the
target's req-to-token table, and every forward pass the target runs is run by the draft model on
the same ForwardBatch (`mirror`), so wherever the target has KV (prompts, cached prefixes,
accepted tokens, jump-forward rows) the draft model has its own. The radix cache, the allocator
and retraction need to know nothing of it. Drafting (`propose`) runs up to k decode steps of the
draft model from each request's last token, writing their KV into scratch slots that are freed
before the verify step takes its own; the verify step's mirror then writes the draft KV of the
rows that stay.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

import torch

from radixlm.config import ServerArgs
from radixlm.core.forward_batch import ForwardBatch
from radixlm.mem_cache.kv_cache_manager import KVCacheManager
from radixlm.model_executor.model_runner import ModelRunner
from radixlm.model_executor.runner_config import RunnerConfig
from radixlm.model_executor.weight_source import path_error
from radixlm.sampling.batch_info import SamplingBatchInfo
from radixlm.scheduler.request import Req
from radixlm.scheduler.draft_tree import forward_on_scratch, propose_tree
from radixlm.scheduler.speculation import (NgramDrafter, Speculator, plain_greedy,
                                          sampling_after)
from radixlm.speculative.ngram import DraftTree
from radixlm.utils.device import to_device

if TYPE_CHECKING:
    from radixlm.scheduler.config import SchedulerConfig

logger = logging.getLogger(__name__)


class DraftModel:
    """Loaded in two steps around the target (scheduler/process.py): `load` before it, so
    that its weights count against the --mem-fraction-static share the target then sizes its
    pool from (each token there costs the target's KV plus the draft's), `attach` after it, to
    take the target's slot count and req-to-token table."""

    FLAG = "--speculative-draft-model-path"

    def __init__(self, runner: ModelRunner, steps: int = 3, topk: int = 1):
        """steps: draft model steps per verify step (--speculative-num-steps); topk: the
        candidates kept per step (--speculative-eagle-topk; > 1: a tree,
        scheduler/draft_tree.py)."""
        self.runner = runner
        self.steps, self.topk = steps, topk
        self.target: ModelRunner | None = None
        self.kv: KVCacheManager | None = None

    def max_drafts(self, config: "SchedulerConfig") -> int:
        """Draft tokens a request gets at most: a chain's steps, a tree's node budget
        (--speculative-num-draft-tokens)."""
        return self.steps if self.topk == 1 else config.speculative_num_draft_tokens

    @classmethod
    def load(cls, args: ServerArgs) -> "DraftModel":
        """The draft model's weights, with a placeholder KV pool of two pages."""
        # Its own format: the engine resolved the target's path (a GGUF to a converted HF
        # directory, hence "safetensors"), not the draft's; dummy weights stay dummy.
        draft_args = dataclasses.replace(
            args, model_path=args.speculative_draft_model_path, tokenizer_path=None,
            load_format="dummy" if args.load_format == "dummy" else "auto",
            max_total_tokens=2 * args.page_size, max_running_requests=1, quantization=None,
            enable_torch_compile=False, json_model_override_args=None)  # (the target's)
        try:
            runner = ModelRunner(RunnerConfig.from_server_args(draft_args))
        except torch.OutOfMemoryError as e:
            raise RuntimeError(f"{cls.FLAG}: no GPU memory left for the draft model ({e})"
                               ) from None
        except (OSError, ValueError) as e:
            raise ValueError(path_error(e, cls.FLAG)) from None
        return cls(runner, args.speculative_num_steps, args.speculative_eagle_topk)

    @property
    def kv_bytes_per_token(self) -> int:
        return self.runner.kv_bytes_per_token

    def attach(self, target: ModelRunner, kv: KVCacheManager) -> None:
        """Check the draft fits the target, then give it a KV pool of the target's slots over
        the target's req-to-token table."""
        runner, flag = self.runner, self.FLAG
        draft_vocab, vocab = runner.model_config.vocab_size, target.model_config.vocab_size
        if draft_vocab != vocab:
            raise ValueError(f"{flag}: the draft model's vocabulary has {draft_vocab} tokens, "
                             f"the target's {vocab}: they must share a tokenizer")
        draft_ctx, ctx = runner.model_config.context_len, target.model_config.context_len
        if draft_ctx < ctx:
            raise ValueError(f"{flag}: the draft model covers {draft_ctx} positions, the "
                             f"target's context is {ctx}: lower --context-length to {draft_ctx}")
        try:
            runner.share_slots(target.memory_plan)
        except torch.OutOfMemoryError as e:
            raise RuntimeError(f"{flag}: no GPU memory left for the draft model's KV pool of "
                               f"{target.max_total_num_tokens} tokens; lower "
                               f"--mem-fraction-static or --max-total-tokens ({e})") from None
        runner.init_attention(kv.req_to_token_pool)
        self.target, self.kv = target, kv
        logger.info("draft model %s: %.1f MiB of weights, KV %.1f MiB", runner.hf_dir,
                    runner.weight_bytes / 2**20, runner.kv_pool.nbytes / 2**20)

    @torch.inference_mode()
    def mirror(self, fb: ForwardBatch) -> None:
        """Run the target's batch through the draft model: its KV where the target's is."""
        if fb.input_logprob_rows:
            fb = dataclasses.replace(fb, input_logprob_rows=[])
        self.runner.forward(fb)

    @torch.inference_mode()
    def propose(self, reqs: list[Req], ks: list[int]) -> list[list[int] | DraftTree]:
        """Drafts after each request's last token (each request decode-ready: its last token,
        on the device in the target's last_token_ids, has no KV yet): trees of up to ks[i]
        nodes when topk > 1 and every drafting request is plain greedy (`propose_tree`), else
        chains of up to min(ks[i], steps) tokens."""
        active = [i for i, k in enumerate(ks) if k > 0]
        if self.topk > 1 and active and all(plain_greedy(reqs[i]) for i in active):
            # Scratch slots a tree takes at most; free ones only (evicting cached prefixes
            # for slots freed again at once would cost more than a chain saves).
            fed = 1 + self.topk * (self.steps - 1)
            if fed * len(active) <= self.kv.allocator.available_size():
                return propose_tree(self.runner, self.kv, self.target.last_token_ids,
                                    self.steps, self.topk, reqs, ks, active)
        return self._propose_chains(reqs, [min(k, self.steps) for k in ks])

    def _propose_chains(self, reqs: list[Req], ks: list[int]) -> list[list[int]]:
        """ks[i] draft tokens after reqs[i]'s last token. Greedy batches read their drafts
        back once at the end; others once a step (the next step's penalties and noise
        positions count them)."""
        device = self.target.device
        drafts: list[list[int]] = [[] for _ in reqs]
        active = [i for i, k in enumerate(ks) if k > 0]
        if not active:
            return drafts
        greedy = all(plain_greedy(reqs[i]) for i in active)
        eos = self.target.model_config.eos_token_ids
        pool_rows = to_device([reqs[i].req_pool_idx for i in active], torch.int64, device)
        tokens = self.target.last_token_ids[pool_rows]
        steps, scratch = [], []
        for j in range(max(ks)):
            positions = [reqs[i].kv_allocated_len + j for i in active]
            pos_t = to_device(positions, torch.int64, device)
            logits, locs = forward_on_scratch(self.runner, self.kv, tokens, pool_rows, pos_t,
                                              positions)
            scratch.append(locs)
            if greedy:
                tokens = logits.argmax(-1)
                steps.append((active, tokens))
            else:
                info = SamplingBatchInfo.build(
                    [sampling_after(reqs[i], drafts[i], eos) for i in active],
                    logits.shape[1], device)
                tokens = self.runner.sampler(logits, info).next_token_ids
                for i, t in zip(active, tokens.tolist()):
                    drafts[i].append(t)
            still = [r for r, i in enumerate(active) if ks[i] > j + 1]
            if len(still) < len(active):
                keep = to_device(still, torch.int64, device)
                active = [active[r] for r in still]
                pool_rows, tokens = pool_rows[keep], tokens[keep]
                if not active:
                    break
        # The verify step allocates its own slots (and its mirror writes the draft KV there).
        self.kv.allocator.free(torch.cat(scratch))
        if steps:
            host = torch.cat([t for _, t in steps]).tolist()    # one wait for every draft
            at = 0
            for rows, _ in steps:
                for i in rows:
                    drafts[i].append(host[at])
                    at += 1
        return drafts


def speculator_for(config: "SchedulerConfig", draft_model: "DraftModel | None"
                   ) -> "Speculator | None":
    """The speculator --speculative-algorithm asks for; None when off. STANDALONE: the draft
    model runs every forward the target runs (draft_model.py); otherwise n-gram drafts."""
    if config.speculative_algorithm == "STANDALONE":
        assert draft_model is not None, "STANDALONE needs the draft model (DraftModel.load)"
        return Speculator(draft_model, draft_model.max_drafts(config))
    if config.speculative_algorithm is not None:
        return Speculator(NgramDrafter.from_config(config), config.speculative_num_draft_tokens)
    return None
