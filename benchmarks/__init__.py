"""Benchmarks that need a running server or the engine, kept out of the runtime packages
(as vLLM's ``benchmarks/`` and mini-sglang's ``benchmark/``), so ``adapters/`` imports
nothing of ``eclectus.server``. Each module runs as ``python -m eclectus.benchmarks.NAME``."""
