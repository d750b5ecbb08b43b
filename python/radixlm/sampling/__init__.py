"""Sampling: request sampling parameters (params.py), the batched sampler (sampler.py), the
logit adjustments it applies (penalties.py) and its seeded noise (noise.py)."""
