"""Engine benchmark: prefill and decode tokens/s beside transformers, prefix sharing on/off,
the native CPU decode kernel against the torch path, a burst of requests over one shared
prefix (prefill tokens computed, first-token time with the suffixes as decode rows or as
chunks), and the vLLM CPU anchor workload. A benchmark, not a test: it prints a markdown
table.

    python -m eclectus.benchmarks.engine.throughput [--model tiny] [--quick] [--threads N]
        [--only burst]

Every figure is measured in this run; ratios compare against transformers' batched
``generate`` on the same weights and thread count, or against this engine with prefix caching
off. Prompts are random printable bytes, fresh per measurement so no cache helps by accident.
"""

from __future__ import annotations

import argparse
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from eclectus.models.presets import resolve_model_dir
from eclectus.protocol.sampling import SamplingParams
from eclectus.server.engine.engine_config import EngineConfig
from eclectus.server.engine.llm import LLM


@dataclass(slots=True)
class Row:
    case: str
    engine: str
    baseline: str
    ratio: float


class Bench:
    """Holds the engines, the HF model and a prompt generator (mutated as prompts are drawn)."""

    def __init__(self, model: str, threads: int) -> None:
        import transformers

        torch.set_num_threads(threads)
        base = EngineConfig(model=model, num_threads=threads)
        self.llm = LLM(config=base)
        self.llm_nocache = LLM(config=base.replace(enable_prefix_caching=False))
        self.hf = transformers.AutoModelForCausalLM.from_pretrained(
            resolve_model_dir(model), dtype=torch.float32
        ).eval()
        self.bos = self.llm.tokenizer.bos_token_id
        self.rng = random.Random(0)
        self.rows: list[Row] = []

    def prompts(self, batch: int, length: int, shared: int = 0) -> list[list[int]]:
        """``batch`` prompts of ``length`` ids (BOS first); the first ``shared`` are common."""

        def tokens(n: int) -> list[int]:
            return [self.rng.randrange(32, 127) for _ in range(n)]

        head = [self.bos, *tokens(max(0, shared - 1))] if shared else [self.bos]
        return [head + tokens(length - len(head)) for _ in range(batch)]

    def run_engine(self, llm: LLM, prompts: list[list[int]], max_tokens: int) -> float:
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        start = time.perf_counter()
        outs = llm.generate(prompt_token_ids=prompts, sampling_params=params)
        elapsed = time.perf_counter() - start
        assert all(len(o.token_ids) == max_tokens for o in outs)
        return elapsed

    def run_hf(self, prompts: list[list[int]], max_tokens: int) -> float:
        ids = torch.tensor(prompts)  # equal lengths: no padding
        start = time.perf_counter()
        with torch.inference_mode():
            self.hf.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                min_new_tokens=max_tokens,
                max_new_tokens=max_tokens,
                pad_token_id=self.bos,
            )
        return time.perf_counter() - start

    def add(self, case: str, engine: str, baseline: str, ratio: float) -> None:
        self.rows.append(Row(case, engine, baseline, ratio))
        speed_up = "-" if math.isnan(ratio) else f"{ratio:.2f}x"
        print(f"| {case} | {engine} | {baseline} | {speed_up} |", flush=True)


def best_pair(runs: int, a: Callable[[], float], b: Callable[[], float]) -> tuple[float, float]:
    """The fastest of ``runs`` timings of each, interleaved (a, b, a, b, ...) so that load
    from other processes on a shared machine hits both sides alike; extra load only adds
    time, so the minimum is the cleanest figure."""
    times = [(a(), b()) for _ in range(runs)]
    return min(t[0] for t in times), min(t[1] for t in times)


def engine_vs_hf(
    b: Bench, llm: LLM, batch: int, prompt_len: int, new_tokens: int, shared: int, runs: int
) -> tuple[float, float]:
    """Best seconds of the engine and of HF on fresh prompts of this shape."""
    return best_pair(
        runs,
        lambda: b.run_engine(llm, b.prompts(batch, prompt_len, shared), new_tokens),
        lambda: b.run_hf(b.prompts(batch, prompt_len, shared), new_tokens),
    )


def prefill_and_decode(
    b: Bench, batches: list[int], prompt_len: int, new_tokens: int, runs: int
) -> None:
    for batch in batches:
        e, h = engine_vs_hf(b, b.llm_nocache, batch, prompt_len, 1, 0, runs)
        tokens = batch * prompt_len
        b.add(
            f"prefill b={batch} x {prompt_len}",
            f"{tokens / e:,.0f} tok/s",
            f"{tokens / h:,.0f} tok/s",
            h / e,
        )
        e, h = engine_vs_hf(b, b.llm_nocache, batch, 16, new_tokens, 0, runs)
        tokens = batch * new_tokens
        b.add(
            f"decode b={batch} x {new_tokens} (16-token prompts)",
            f"{tokens / e:,.0f} tok/s",
            f"{tokens / h:,.0f} tok/s",
            h / e,
        )


def shared_prefix(b: Bench, prefix: int, runs: int) -> None:
    def run(llm: LLM) -> float:
        return b.run_engine(llm, b.prompts(16, prefix + 16, shared=prefix), 32)

    on, off = best_pair(runs, lambda: run(b.llm), lambda: run(b.llm_nocache))
    b.add(
        f"16 x ({prefix} shared + 16) -> 32, sharing on vs off",
        f"{on:.2f} s",
        f"{off:.2f} s",
        off / on,
    )


def cpu_decode_kernels(b: Bench, runs: int) -> None:
    """The evals' map shape with decode attention on the native CPU kernel vs the torch path
    (ECLECTUS_KERNELS=torch), same engine, fresh prompts each run. Skipped without the
    kernel (no compiler, or not a CPU engine)."""
    from eclectus.kernels import dispatch, native

    if b.llm.engine.config.device != "cpu" or not native.available():
        return

    def run(backend: str) -> float:
        with dispatch.force_backend(backend):
            return b.run_engine(b.llm, b.prompts(8, 1024), 100)

    nat, tor = best_pair(runs, lambda: run("native"), lambda: run("torch"))
    b.add(
        "8 x 1024 -> 100, native vs torch decode attention",
        f"{nat:.2f} s",
        f"{tor:.2f} s",
        tor / nat,
    )


@dataclass(slots=True)
class Burst:
    """One burst's counts and times (thread CPU seconds: this thread steps the engine)."""

    prefill_tokens: int  # known tokens the engine computed
    mean_ttft: float  # mean over requests of the CPU time until its first token
    first_token_step: int  # the step by which every request had its first token


def run_burst(llm: LLM, prompts: list[list[int]], max_tokens: int, tag: str) -> Burst:
    """Add every prompt, then step until all finish; mutates the engine (its counters)."""
    engine = llm.engine
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    before = engine.counters.prefill_tokens
    for i, ids in enumerate(prompts):
        engine.add_tokens(f"{tag}-{i}", ids, params)
    first: dict[str, tuple[int, float]] = {}
    start, step = time.thread_time(), 0
    while engine.has_unfinished:
        outputs = engine.step()
        step += 1
        for out in outputs:
            if out.token_ids and out.request_id not in first:
                first[out.request_id] = (step, time.thread_time() - start)
    return Burst(
        engine.counters.prefill_tokens - before,
        sum(t for _, t in first.values()) / len(first),
        max(s for s, _ in first.values()),
    )


def shared_prefix_burst(b: Bench, runs: int, batch: int = 64, prefix: int = 2048) -> None:
    """``batch`` requests over one ``prefix``-token prefix (+ 32 own tokens each, 64 out)
    added together, as vLLM's client sends them (issue #18's prefix-1x2048). Counts the
    prefill tokens computed against the ideal (the prefix once, every suffix once), and the
    first-token CPU time with the suffixes attending as decode rows in one cascade group vs
    as per-request SDPA chunks (``max_row_prefill_tokens`` 0), interleaved, best of runs."""
    runner = b.llm.engine.runner
    default = runner.max_row_prefill_tokens
    bursts: dict[bool, list[Burst]] = {True: [], False: []}
    for r in range(runs):
        for rows in (True, False):
            runner.max_row_prefill_tokens = default if rows else 0
            prompts = b.prompts(batch, prefix + 32, shared=prefix)
            bursts[rows].append(run_burst(b.llm, prompts, 64, f"burst-{r}-{rows}"))
    runner.max_row_prefill_tokens = default
    ideal = prefix + batch * 32
    on = min(bursts[True], key=lambda x: x.mean_ttft)
    off = min(bursts[False], key=lambda x: x.mean_ttft)
    counts = {x.prefill_tokens for x in bursts[True] + bursts[False]}
    b.add(
        f"{batch} x ({prefix} shared + 32) -> 64 at once: prefill tokens (ideal {ideal:,})",
        ", ".join(f"{n:,}" for n in sorted(counts)),
        f"all first tokens by step {on.first_token_step}",
        float("nan"),
    )
    b.add(
        f"{batch} x ({prefix} shared + 32) -> 64: mean TTFT (CPU), suffixes as rows vs chunks",
        f"{on.mean_ttft * 1000:.0f} ms",
        f"{off.mean_ttft * 1000:.0f} ms",
        off.mean_ttft / on.mean_ttft,
    )


def vllm_anchor(b: Bench, runs: int) -> None:
    """The workload measured on stock vLLM CPU: 16 x 501-token prompts x 64 tokens."""
    for shared in (0, 450):
        e, h = engine_vs_hf(b, b.llm, 16, 501, 64, shared, runs)
        label = "distinct" if not shared else "90% shared"
        b.add(
            f"anchor 16 x 501 -> 64, {label} (vLLM 2.6-3.0 s / 1.4-1.6 s)",
            f"{e:.2f} s",
            f"HF {h:.2f} s",
            h / e,
        )
    ttft, total = best_pair(
        runs,
        lambda: b.run_engine(b.llm_nocache, b.prompts(1, 501), 1),
        lambda: b.run_engine(b.llm_nocache, b.prompts(1, 501), 65),
    )
    b.add(
        "single 501-token request (vLLM ~0.1 s, 6-8 ms/token)",
        f"TTFT {ttft * 1000:.0f} ms, {(total - ttft) / 64 * 1000:.1f} ms/token",
        "-",
        float("nan"),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument(
        "--only",
        choices=("burst",),
        default=None,
        help="run one case: burst (many requests over one shared prefix, no transformers)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="fewer sizes, one run each (default: best of 3)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads for engine and HF (default: the engine's)",
    )
    args = parser.parse_args(argv)
    from eclectus.server.engine.llm_engine import default_num_threads

    threads = args.threads or default_num_threads()
    bench = Bench(args.model, threads)
    runs = 1 if args.quick else 3
    bench.run_engine(bench.llm, bench.prompts(2, 32), 4)  # warm-up both paths
    bench.run_engine(bench.llm_nocache, bench.prompts(2, 32), 4)
    bench.run_hf(bench.prompts(2, 32), 4)
    print(f"model {args.model}, torch threads {threads}, {time.strftime('%Y-%m-%d %H:%M')}")
    print("| case | engine | baseline | speed-up |\n|---|---|---|---|")
    if args.only == "burst":
        shared_prefix_burst(bench, runs)
        return 0
    batches = [1, 32] if args.quick else [1, 8, 32]
    prefill_and_decode(bench, batches, 128 if args.quick else 256, 32 if args.quick else 64, runs)
    shared_prefix(bench, 1024, runs)
    cpu_decode_kernels(bench, runs)
    shared_prefix_burst(bench, runs)
    vllm_anchor(bench, runs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
