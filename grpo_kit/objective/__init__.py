"""The objective: tensors in, loss out; the full, chunked and Liger policy-loss paths."""
