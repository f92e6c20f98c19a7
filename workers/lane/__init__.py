"""The compiled hot path (numba): socket pump, forward lane, the owner's own path, bulk in-flight kernels, their
warm-up."""
