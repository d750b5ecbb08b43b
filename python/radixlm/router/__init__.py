"""The cache-aware router (`radixlm router`) and data parallelism (`radixlm serve --dp-size N`).

It speaks only HTTP to its workers and imports nothing of the engine: policy.py (which worker),
prefix_tree.py (the approximate per-worker trees), workers.py (membership, health),
proxy.py (forwarding, retries, streams), server.py (the endpoints), dp.py (N engines + router).
"""
