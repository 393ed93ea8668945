"""Kernel benchmarks: the shared-prefix cascade and CPU paged decode against their baselines."""
