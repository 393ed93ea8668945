"""Engine benchmarks: throughput beside transformers, one step's parts, constrained decoding."""
