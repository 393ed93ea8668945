"""Decode step time as a shared prefix grows, cascade attention on vs off, same run.

    python -m eclectus.evals.shared_decode [--model tiny] [--batch 64] [--prefixes 512,1024]

``batch`` requests share one prefix of P tokens and own ``--own`` tokens each; every request
decodes ``--tokens`` tokens (ignore_eos). Each engine step is timed in THREAD CPU time (the
engine steps in this thread with torch on one thread, so other processes on a shared machine
slow neither side by taking the core away); a step counts once every request has its first
token, i.e. the batch only decodes. Two engines, equal but for ``cascade_attention``, run
interleaved on fresh prompts; the figure is the median decode step of the best of ``--runs``.
With the cascade a step's attention reads the shared prefix once, so its time should grow with
the batch's own tokens, not with P; without it, every request reads the prefix.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from eclectus.protocol.sampling import SamplingParams
from eclectus.server.engine.engine_config import EngineConfig
from eclectus.server.engine.llm import LLM


def decode_step_ms(llm: LLM, prompts: list[list[int]], tokens: int) -> float:
    """Median thread-CPU milliseconds of the steps where every request is decoding (runs the
    engine to completion: mutates it)."""
    engine = llm.engine
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    got = {f"sweep-{i}": 0 for i in range(len(prompts))}
    for request_id, ids in zip(got, prompts, strict=True):
        engine.add_tokens(request_id, ids, params)
    steps = []
    while engine.has_unfinished:
        decoding = all(n > 0 for n in got.values())
        start = time.thread_time()
        deltas = engine.step()
        if decoding:
            steps.append(time.thread_time() - start)
        for delta in deltas:
            got[delta.request_id] += len(delta.token_ids)
    if len(steps) < 2:
        raise ValueError(f"only {len(steps)} decode steps: raise --tokens")
    return statistics.median(steps) * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--prefixes", default="512,1024,2048,4000")
    parser.add_argument("--own", type=int, default=32, help="tokens of its own per prompt")
    parser.add_argument("--tokens", type=int, default=16, help="tokens decoded per request")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    base = EngineConfig(model=args.model, num_threads=1)
    engines = {
        "cascade": LLM(config=base),
        "plain": LLM(config=base.replace(cascade_attention=False)),
    }
    rng = random.Random(0)
    bos = engines["cascade"].tokenizer.bos_token_id

    def prompts(prefix: int) -> list[list[int]]:
        head = [bos, *(rng.randrange(32, 127) for _ in range(prefix - 1))]
        return [head + [rng.randrange(32, 127) for _ in range(args.own)] for _ in range(args.batch)]

    print(f"{args.model}, {args.batch} requests x (P shared + {args.own} own) -> {args.tokens}")
    print("| shared prefix P | cascade ms/step | plain ms/step | plain / cascade |")
    print("| ---: | ---: | ---: | ---: |")
    for prefix in (int(p) for p in args.prefixes.split(",")):
        best = dict.fromkeys(engines, float("inf"))
        for _ in range(args.runs):
            for name, llm in engines.items():
                best[name] = min(best[name], decode_step_ms(llm, prompts(prefix), args.tokens))
        ratio = best["plain"] / best["cascade"]
        print(f"| {prefix} | {best['cascade']:.1f} | {best['plain']:.1f} | {ratio:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
