"""Where the engine's throughput levels off as its batch grows: what ``--max-engine-seqs``
should admit (docs/architecture.md, "Admission"). A benchmark, not a test.

    python -m eclectus.benchmarks.engine.batch [--model tiny] [--batches 1,4,16,64]
        [--prompt-tokens 300] [--output-tokens 32] [--rounds 3]

Each round runs, for every batch size B in turn (the order rotated per round), B requests
of random prompts at once to their end, on one torch thread, and records the wall time; the
table gives per B the median (min-max over rounds) of the time and of the output tokens per
second, and that throughput as a share of the best B's: the knee is the smallest B near the
top, and a request's latency grows with B past it.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from eclectus.protocol.sampling import SamplingParams
from eclectus.server.engine.llm import LLM


def run_batch(llm: LLM, batch: int, prompt_tokens: int, output_tokens: int, seed: int) -> float:
    """Seconds to run ``batch`` fresh random prompts to their end (mutates the engine)."""
    rng = random.Random(seed)
    vocab = llm.engine.tokenizer.vocab_size
    prompts = [[rng.randrange(3, vocab) for _ in range(prompt_tokens)] for _ in range(batch)]
    sampling = SamplingParams(max_tokens=output_tokens, temperature=0.0, ignore_eos=True)
    started = time.perf_counter()
    llm.generate(prompt_token_ids=prompts, sampling_params=sampling)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--batches", default="1,4,8,16,32,64,128")
    parser.add_argument("--prompt-tokens", type=int, default=300)
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    torch.set_num_threads(1)
    llm = LLM(args.model, num_threads=1)
    run_batch(llm, 4, args.prompt_tokens, args.output_tokens, seed=0)  # warm-up
    times: dict[int, list[float]] = {b: [] for b in batches}
    for round_ in range(args.rounds):
        shift = round_ % len(batches)
        for batch in batches[shift:] + batches[:shift]:
            seed = 1 + round_ * 1000 + batch
            times[batch].append(run_batch(llm, batch, args.prompt_tokens, args.output_tokens, seed))
    rates = {b: [b * args.output_tokens / t for t in ts] for b, ts in times.items()}
    best = max(statistics.median(r) for r in rates.values())
    print(f"| batch | wall s | output tok/s | of the best | ({args.prompt_tokens} in, "
          f"{args.output_tokens} out, {args.rounds} rounds) |")  # fmt: skip
    print("|---|---|---|---|---|")
    for batch in batches:
        t, r = times[batch], rates[batch]
        print(
            f"| {batch} | {statistics.median(t):.3f} ({min(t):.3f}–{max(t):.3f}) | "
            f"{statistics.median(r):.0f} ({min(r):.0f}–{max(r):.0f}) | "
            f"{statistics.median(r) / best:.0%} | |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
