"""Where a decode step's time goes: the engine's step split into its parts, at issue #18's
shapes, in thread CPU time.

    python -m eclectus.server.engine.step_bench [--model tiny] [--runs 3]
        [--shapes random,prefix-1x2048,prefix-2x1536] [--table-cache both]

The engine steps in this thread with torch on one thread (``--threads 1`` of the served
benchmark), so other processes on a shared machine slow no part by taking the core away.
Requests sample at temperature 1 without top-k/p (what vLLM's client sends) and ignore EOS;
a step counts once every request of the batch has its first token. Each part is timed by
wrapping the engine's own calls ("attention kernels" includes their Python launch glue, "plans"
the decode and prefill plans and the slot tensor); "model, not attention" is the runner's time
minus the plans, the attention kernels and the KV stores: the matmuls, norms, RoPE, MLP and LM
head, the flat batch built from the sequences, and the per-layer glue. With ``--table-cache
both`` two engines, equal but for the decode steps' block-table cache (``runner.table_cache``),
alternate run by run. Medians over the decode steps of a run; the best run of ``--runs``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch

from eclectus.protocol.sampling import SamplingParams
from eclectus.server.engine import model_runner
from eclectus.server.engine.engine_config import EngineConfig
from eclectus.server.engine.llm_engine import LLMEngine

# name -> (requests, prefixes, prefix tokens, own tokens, output tokens): issue #18's shapes
SHAPES = {
    "random": (32, 0, 0, 512, 64),
    "prefix-1x2048": (64, 1, 2048, 32, 64),
    "prefix-2x1536": (32, 2, 1536, 64, 32),
}
PARTS = ("schedule", "plans", "attention kernels", "KV store", "model, not attention")
PARTS += ("sampler", "postprocess", "step")


class StepTimer:
    """Wraps one engine's calls to add their thread CPU time to :attr:`parts` (mutated by
    every step; the kernels' wrappers are module-wide, so time one engine at a time)."""

    def __init__(self, engine: LLMEngine) -> None:
        self.parts: dict[str, float] = defaultdict(float)
        self._wrap(engine.scheduler, "schedule", "schedule")
        self._wrap(engine.runner, "_attention", "plans")
        self._wrap(engine.runner, "execute", "runner")
        self._wrap(engine, "_sample", "sampler")
        self._wrap(engine, "_postprocess", "postprocess")
        self._wrap(model_runner.kernels, "decode_attention", "attention kernels")
        self._wrap(model_runner.kernels, "store_kv", "KV store")

    def _wrap(self, owner: Any, name: str, part: str) -> None:
        inner: Callable[..., Any] = getattr(owner, name)
        inner = getattr(inner, "__wrapped_by_step_bench__", inner)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.thread_time()
            try:
                return inner(*args, **kwargs)
            finally:
                self.parts[part] += time.thread_time() - start

        timed.__wrapped_by_step_bench__ = inner  # type: ignore[attr-defined]
        setattr(owner, name, timed)


def prompts(shape: str, bos: int, rng: random.Random) -> tuple[list[list[int]], int]:
    """Fresh token prompts of ``shape`` (BOS first) and its output length (draws from
    ``rng``)."""
    requests, num_prefixes, prefix, own, out = SHAPES[shape]

    def text(n: int) -> list[int]:
        return [rng.randrange(32, 127) for _ in range(n)]

    heads = [[bos, *text(prefix - 1)] for _ in range(num_prefixes)] or [[bos]]
    own -= len(heads[0]) - prefix  # without a prefix, BOS is one of the prompt's tokens
    return [heads[i % len(heads)] + text(own) for i in range(requests)], out


def decode_parts(engine: LLMEngine, shape: str, rng: random.Random) -> dict[str, float]:
    """Median milliseconds per part over the decode steps of one run of ``shape`` (runs the
    engine to completion: mutates it)."""
    timer = StepTimer(engine)
    batch, out = prompts(shape, engine.tokenizer.bos_token_id, rng)
    params = SamplingParams(max_tokens=out, ignore_eos=True, temperature=1.0)
    got = {}
    for ids in batch:
        request_id = f"{shape}-{rng.getrandbits(64):x}"
        got[request_id] = 0
        engine.add_tokens(request_id, ids, params)
    steps: dict[str, list[float]] = defaultdict(list)
    while engine.has_unfinished:
        decoding = all(got.values()) and len(engine.scheduler.running) == len(batch)
        timer.parts.clear()
        start = time.thread_time()
        outputs = engine.step()
        if decoding:
            steps["step"].append(time.thread_time() - start)
            for part, seconds in timer.parts.items():
                steps[part].append(seconds)
        for output in outputs:
            got[output.request_id] += len(output.token_ids)
    ms = {part: statistics.median(times) * 1e3 for part, times in steps.items()}
    attention = ms["plans"] + ms["attention kernels"] + ms["KV store"]
    ms["model, not attention"] = ms.pop("runner") - attention
    return ms


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--table-cache", choices=("on", "off", "both"), default="on")
    args = parser.parse_args(argv)
    shapes = args.shapes.split(",")
    if unknown := [s for s in shapes if s not in SHAPES]:
        parser.error(f"unknown shape {unknown[0]!r}; choose from {', '.join(SHAPES)}")
    torch.set_num_threads(1)
    modes = ("on", "off") if args.table_cache == "both" else (args.table_cache,)
    engines = {}
    for mode in modes:
        engines[mode] = LLMEngine(EngineConfig(model=args.model, num_threads=1))
        if mode == "off":
            engines[mode].runner.table_cache = None
    rng = random.Random(0)
    for shape in shapes:
        best: dict[str, dict[str, float]] = {}
        for run in range(args.runs + 1):  # the first run warms up
            for mode, engine in engines.items():
                ms = decode_parts(engine, shape, rng)
                if run and (mode not in best or ms["step"] < best[mode]["step"]):
                    best[mode] = ms
        print(f"\n{args.model}, {shape}: ms per decode step (thread CPU, median, best run)")
        print("| part | " + " | ".join(f"table cache {m}" for m in modes) + " |")
        print("| --- |" + " ---: |" * len(modes))
        for part in PARTS:
            print(f"| {part} | " + " | ".join(f"{best[m][part]:.2f}" for m in modes) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
