"""Request normalization, execution classes, scheduling, ForwardBatch, and the step loop."""
