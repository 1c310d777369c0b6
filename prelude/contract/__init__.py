"""Contract types, the bottom layer every other layer may import: the configuration, sampling
parameters, and the ForwardBatch / result types that pass between scheduler and executors.
Nothing here imports torch or any other part of Prelude."""
