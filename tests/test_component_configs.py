"""RunnerConfig and SchedulerConfig are cut from ServerArgs field by field, by name."""

from __future__ import annotations

import dataclasses

import pytest

from radixlm.config import ServerArgs, config_from_args
from radixlm.model_executor.runner_config import RunnerConfig
from radixlm.scheduler.config import SchedulerConfig


def test_every_field_comes_from_the_server_args():
    args = ServerArgs(page_size=16, max_total_tokens=999, cuda_graph_max_bs=8,
                      attention_backend="torch_native", schedule_policy="lpm",
                      chunked_prefill_size=64, disable_jump_forward=True, random_seed=7)
    runner = RunnerConfig.from_server_args(args, tp_rank=1, draft_kv_bytes_per_token=64)
    sched = SchedulerConfig.from_server_args(args)
    # The fields a process fills in itself: its rank, and a draft model's KV cost; and one
    # derived from several flags.
    assert runner.tp_rank == 1 and runner.draft_kv_bytes_per_token == 64
    assert runner.draft_trees is args.uses_draft_trees is False
    for cfg in (runner, sched):
        for f in dataclasses.fields(cfg):
            if f.name not in ("tp_rank", "draft_kv_bytes_per_token", "draft_trees"):
                assert getattr(cfg, f.name) == getattr(args, f.name), f.name


def test_a_field_without_a_flag_must_be_passed():
    @dataclasses.dataclass
    class Other:
        page_size: int
        not_a_flag: int

    with pytest.raises(TypeError, match="not_a_flag"):
        config_from_args(ServerArgs(), Other)
    assert config_from_args(ServerArgs(page_size=4), Other, not_a_flag=3) == Other(4, 3)
