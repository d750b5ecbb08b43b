"""What every layer of the engine shares and none owns: the forward-pass inputs of one step
(ForwardBatch, ForwardMode), the logprob types, the typed model facts (ModelConfig), the
per-token KV cache shape a model declares (KVCacheSpec) and how an fp8 KV cache stores its
values (kv_quant). Modules here import nothing from the rest of the package, so that any package
can depend on them without a cycle."""
