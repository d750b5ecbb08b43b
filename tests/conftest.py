"""Shared fixtures: the bundled model (converted once per machine), an HF reference model on the
same weights, and engines that are always shut down."""

from __future__ import annotations

import os

import pytest
import torch

# Every engine started by the tests checks KV accounting after every scheduler step.
os.environ.setdefault("RADIXLM_CHECK_INVARIANTS", "1")

# Under pytest-xdist (scripts/test.sh runs one worker per core, up to 4) the workers share the
# cores: each takes its share of torch threads, and so do the servers and ranks it starts
# (two workers on two cores each running two threads would oversubscribe them).
if os.environ.get("PYTEST_XDIST_WORKER"):
    from cores import usable_cores
    _share = max(1, usable_cores() // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    os.environ.setdefault("OMP_NUM_THREADS", str(_share))
    torch.set_num_threads(_share)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def smollm_dir() -> str:
    from radixlm.model_executor.weight_source import resolve_model_dir
    return resolve_model_dir(None, "auto")[0]


@pytest.fixture(scope="session")
def tokenizer(smollm_dir):
    from radixlm.model_executor.weight_source import load_tokenizer
    return load_tokenizer(smollm_dir)


@pytest.fixture(scope="session")
def hf_model(smollm_dir):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(smollm_dir, dtype=torch.float32).eval()


@pytest.fixture
def make_engine():
    from radixlm.entrypoints.engine import Engine
    engines = []

    def make(**kwargs):
        kwargs.setdefault("device", "cpu")
        kwargs.setdefault("log_level", "warning")
        engine = Engine(**kwargs)
        engines.append(engine)
        return engine

    yield make
    for e in engines:
        e.shutdown()
