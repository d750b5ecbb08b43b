"""What every layer of the engine shares and none owns: the forward-pass inputs of one step
(ForwardBatch, ForwardMode), the logprob types, the typed model facts (ModelConfig) and the
per-token KV cache shape a model declares (KVCacheSpec). Modules here import nothing from the rest
of the package, so that any package can depend on them without a cycle."""
