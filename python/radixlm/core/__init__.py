"""What every layer of the engine shares and none owns: the forward-pass inputs of one step
(ForwardBatch, ForwardMode) and the logprob types. Modules here import nothing from the rest
of the package, so that any package can depend on them without a cycle."""
