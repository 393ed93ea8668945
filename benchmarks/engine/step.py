"""Where a decode or a prefill step's time goes: the engine's step split into its parts, at
issue #18's shapes, in thread CPU time.

    python -m eclectus.benchmarks.engine.step [--model tiny] [--runs 3]
        [--shapes random,prefix-1x2048,prefix-2x1536] [--phase prefill]
        [--table-cache both | --sampled-rows both | --column-major-weights both]

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

``--phase prefill`` times the steps before the last request has its first token instead (the
prompts' chunks, and the decodes of the requests already started): the same parts, with the
model's GEMMs (every ``F.linear``: QKV, O, gate/up, down, the LM head over the sampled rows)
split out of the rest of the model (embedding, norms, RoPE, SwiGLU, the flat batch, per-layer
glue), and the sum of those steps (the in-process first token of the batch's last request).
``--sampled-rows both`` alternates two engines equal but for ``runner.sampled_rows_only`` (the
last layer for the sampled rows only, or for every row), as ``--table-cache both`` does, and
``--column-major-weights both`` two engines equal but for the projections' weight layout
(``LlamaForCausalLM.set_column_major_weights``; column-major is the default on a CPU).
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
PREFILL_PARTS = ("schedule", "plans", "attention kernels", "KV store", "matmuls")
PREFILL_PARTS += ("model, rest", "sampler", "postprocess", "step")


class StepTimer:
    """Wraps one engine's calls to add their thread CPU time to :attr:`parts` (mutated by
    every step; the kernels' wrappers are module-wide, so time one engine at a time)."""

    def __init__(self, engine: LLMEngine, *, matmuls: bool = False) -> None:
        self.parts: dict[str, float] = defaultdict(float)
        self._wrap(engine.scheduler, "schedule", "schedule")
        self._wrap(engine.runner, "_attention", "plans")
        self._wrap(engine.runner, "execute", "runner")
        self._wrap(engine, "_sample", "sampler")
        self._wrap(engine, "_postprocess", "postprocess")
        self._wrap(model_runner.kernels, "decode_attention", "attention kernels")
        self._wrap(model_runner.kernels, "prefill_attention", "attention kernels")
        self._wrap(model_runner.kernels, "store_kv", "KV store")
        if matmuls:  # nn.Linear and the LM head both call F.linear
            self._wrap(torch.nn.functional, "linear", "matmuls")

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
    steps = _run(engine, shape, rng, StepTimer(engine), prefill=False)
    ms = {part: statistics.median(times) * 1e3 for part, times in steps.items()}
    attention = ms["plans"] + ms["attention kernels"] + ms["KV store"]
    ms["model, not attention"] = ms.pop("runner") - attention
    return ms


def prefill_parts(engine: LLMEngine, shape: str, rng: random.Random) -> dict[str, float]:
    """Median milliseconds per part over the steps of one run of ``shape`` before its last
    request's first token, plus ``"steps"`` (their number) and ``"total"`` (their summed
    milliseconds). Runs the engine to completion (mutates it; F.linear is wrapped meanwhile)."""
    timer = StepTimer(engine, matmuls=True)
    try:
        steps = _run(engine, shape, rng, timer, prefill=True)
    finally:
        torch.nn.functional.linear = torch.nn.functional.linear.__wrapped_by_step_bench__  # type: ignore[attr-defined]
    ms = {part: statistics.median(times) * 1e3 for part, times in steps.items()}
    attention = ms["plans"] + ms["attention kernels"] + ms["KV store"]
    ms["model, rest"] = ms.pop("runner") - attention - ms["matmuls"]
    ms["steps"] = len(steps["step"])
    ms["total"] = sum(steps["step"]) * 1e3
    return ms


def _run(
    engine: LLMEngine, shape: str, rng: random.Random, timer: StepTimer, *, prefill: bool
) -> dict[str, list[float]]:
    """Each part's seconds in each decode step (``prefill``: each step before the last first
    token) of one run of ``shape``; every part is listed for every kept step (mutates the
    engine: runs it to completion)."""
    batch, out = prompts(shape, engine.tokenizer.bos_token_id, rng)
    params = SamplingParams(max_tokens=out, ignore_eos=True, temperature=1.0)
    got = {}
    for ids in batch:
        request_id = f"{shape}-{rng.getrandbits(64):x}"
        got[request_id] = 0
        engine.add_tokens(request_id, ids, params)
    steps: dict[str, list[float]] = defaultdict(list)
    parts = ("schedule", "plans", "runner", "sampler", "postprocess", "attention kernels")
    parts += ("KV store", "matmuls") if prefill else ("KV store",)
    while engine.has_unfinished:
        started = all(got.values())
        keep = not started if prefill else started and len(engine.scheduler.running) == len(batch)
        timer.parts.clear()
        start = time.thread_time()
        outputs = engine.step()
        if keep:
            steps["step"].append(time.thread_time() - start)
            for part in parts:
                steps[part].append(timer.parts.get(part, 0.0))
        for output in outputs:
            got[output.request_id] += len(output.token_ids)
    return steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--table-cache", choices=("on", "off", "both"), default="on")
    parser.add_argument("--sampled-rows", choices=("on", "off", "both"), default="on")
    parser.add_argument("--column-major-weights", choices=("on", "off", "both"), default="on")
    parser.add_argument("--phase", choices=("decode", "prefill"), default="decode")
    args = parser.parse_args(argv)
    shapes = args.shapes.split(",")
    if unknown := [s for s in shapes if s not in SHAPES]:
        parser.error(f"unknown shape {unknown[0]!r}; choose from {', '.join(SHAPES)}")
    switches = {
        "table cache": args.table_cache,
        "sampled rows only": args.sampled_rows,
        "column-major weights": args.column_major_weights,
    }
    both = [name for name, value in switches.items() if value == "both"]
    if len(both) > 1:
        parser.error(f"{' and '.join(both)} both: compare one at a time")
    torch.set_num_threads(1)
    # the column heading: the option compared, else the one switched off, else the first
    option = (
        both or [name for name, value in switches.items() if value == "off"] or ["table cache"]
    )[0]
    modes = ("on", "off") if switches[option] == "both" else (switches[option],)
    engines = {}
    for mode in modes:
        engine = engines[mode] = LLMEngine(EngineConfig(model=args.model, num_threads=1))
        value = {name: mode if name == option else v for name, v in switches.items()}
        if value["table cache"] == "off":
            engine.runner.table_cache = None
        if value["sampled rows only"] == "off":
            engine.runner.sampled_rows_only = False
        if value["column-major weights"] == "off":
            engine.runner.model.set_column_major_weights(False)
    rng = random.Random(0)
    measure, rows = (
        (prefill_parts, PREFILL_PARTS) if args.phase == "prefill" else (decode_parts, PARTS)
    )
    best_of = "total" if args.phase == "prefill" else "step"
    for shape in shapes:
        best: dict[str, dict[str, float]] = {}
        for run in range(args.runs + 1):  # the first run warms up
            for mode, engine in engines.items():
                ms = measure(engine, shape, rng)
                if run and (mode not in best or ms[best_of] < best[mode][best_of]):
                    best[mode] = ms
        print(f"\n{args.model}, {shape}: ms per {args.phase} step (thread CPU, median, best run)")
        print("| part | " + " | ".join(f"{option} {m}" for m in modes) + " |")
        print("| --- |" + " ---: |" * len(modes))
        for part in rows:
            print(f"| {part} | " + " | ".join(f"{best[m][part]:.2f}" for m in modes) + " |")
        if args.phase == "prefill":
            for part in ("steps", "total"):
                print(f"| {part} | " + " | ".join(f"{best[m][part]:.2f}" for m in modes) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
