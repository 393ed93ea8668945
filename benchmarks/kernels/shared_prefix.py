"""Shared-prefix decode benchmark:
``python -m eclectus.benchmarks.kernels.shared_prefix [--sizes B:P:S,...]``.

Every request of a batch shares one prefix of P tokens (the same physical blocks) and owns a
suffix of S tokens. Compared, one decode step of one layer:

* cascade  -- ``decode_attention`` with a cascade plan (prefix read once per group);
* paged    -- ``paged_decode_attention``: per-request paged decode over the same cache;
* sdpa     -- ``torch.nn.functional.scaled_dot_product_attention`` on KV already gathered
              into a dense [B, Hkv, P + S, D] tensor (the gather is not timed).

Ratios are baseline time / cascade time (> 1: cascade is faster). Bandwidth is the roofline
view: the bytes of KV that must be read at least once, (P + B * S) * Hkv * D * 2 (K and V) *
element size, over the time; the prefix pass alone moves P * Hkv * D * 2 * element size. Peak
bandwidth: the GPU's data-sheet figure when known, else a measured device copy (labelled).
GPU timings use triton.testing.do_bench (median, L2 flushed between runs); CPU timings, the
best of ``--repeats`` wall-clock runs (a shared CPU only ever adds noise on top).
Defaults: the issue's GPU grid in bf16, head_dim 128, Hq 32, Hkv 8; a small fp32 grid on CPU
that starts with the engine's target case (16 x 1024 x 64, head_dim 64, Hq 4, Hkv 2) and
brackets the native kernel's cascade thresholds (dispatch.NATIVE_CASCADE_THRESHOLDS). The
plans group any shared prefix (the torch path's thresholds), so every row times a cascade.
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from eclectus.kernels import dispatch, native_cascade
from eclectus.kernels.plans import DecodePlan, plan_decode

GPU_SIZES = [(b, p, s) for b, p, s in itertools.product((16, 64), (2048, 8192), (16, 256))]
# the engine's target case, then sizes on both sides of the native kernel's cascade thresholds
CPU_SIZES = [(16, 1024, 64), (8, 2048, 64), (32, 2048, 64), (64, 2048, 64), (32, 4000, 32)]
PEAK_BYTES_PER_S = {
    "H200": 4.8e12,
    "H100 SXM": 3.35e12,
    "H100 PCIe": 2.0e12,
    "H100": 3.35e12,
    "A100-SXM4-80GB": 2.04e12,
    "A100": 1.56e12,
    "L40S": 0.864e12,
    "A10G": 0.6e12,
    "L4": 0.3e12,
}


@dataclass(frozen=True)
class Case:
    batch: int
    prefix: int
    suffix: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: torch.dtype

    def kv_bytes(self, tokens: int) -> float:
        return tokens * self.num_kv_heads * self.head_dim * 2 * self.dtype.itemsize


@dataclass
class Inputs:
    q: torch.Tensor  # [B, Hq, D]
    k_cache: torch.Tensor  # [num_blocks, Hkv, block_size, D]
    v_cache: torch.Tensor
    cascade_plan: DecodePlan
    paged_plan: DecodePlan
    k_dense: torch.Tensor  # [B, Hkv, P + S, D], for the SDPA baseline
    v_dense: torch.Tensor


def make_inputs(case: Case, device: torch.device) -> Inputs:
    """Random caches where all requests' tables start with the same prefix blocks."""
    bs = case.block_size
    num_prefix_blocks = case.prefix // bs  # prefix is rounded down to whole shared blocks
    suffix_blocks = -(-(case.prefix % bs + case.suffix) // bs)
    num_blocks = num_prefix_blocks + case.batch * suffix_blocks + 1
    shape = (num_blocks, case.num_kv_heads, bs, case.head_dim)
    k_cache = torch.randn(shape, device=device, dtype=case.dtype)
    v_cache = torch.randn(shape, device=device, dtype=case.dtype)
    prefix_ids = list(range(1, num_prefix_blocks + 1))
    tables = [
        prefix_ids + [1 + num_prefix_blocks + i * suffix_blocks + j for j in range(suffix_blocks)]
        for i in range(case.batch)
    ]
    seq_lens = [case.prefix + case.suffix] * case.batch
    q = torch.randn(case.batch, case.num_q_heads, case.head_dim, device=device, dtype=case.dtype)
    table_t = torch.tensor(tables, device=device)
    length = case.prefix + case.suffix

    def dense(cache: torch.Tensor) -> torch.Tensor:
        blocks = cache[table_t]  # [B, nb, Hkv, bs, D]
        return blocks.transpose(1, 2).flatten(2, 3)[:, :, :length].contiguous()  # [B, Hkv, L, D]

    return Inputs(
        q,
        k_cache,
        v_cache,
        plan_decode(tables, seq_lens, bs, device),
        plan_decode(tables, seq_lens, bs, device, cascade=False),
        dense(k_cache),
        dense(v_cache),
    )


def timer(
    device: torch.device, repeats: int, cuda_graph: bool = False
) -> Callable[[Callable[[], object]], float]:
    """Returns a function timing a callable in seconds (GPU: median; CPU: best of repeats)."""
    if device.type == "cuda":
        import triton.testing

        if cuda_graph:  # replays a captured graph: no launch overhead, but no L2 flush either
            return lambda fn: triton.testing.do_bench_cudagraph(fn, return_mode="median") / 1e3
        return lambda fn: triton.testing.do_bench(fn, return_mode="median") / 1e3

    def cpu_time(fn: Callable[[], object]) -> float:
        fn()  # warm-up
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
        return min(samples)

    return cpu_time


def peak_bandwidth(
    device: torch.device,
    measure: Callable[[Callable[[], object]], float],
) -> tuple[float, str]:
    """(bytes/s, where the figure comes from)."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, value in PEAK_BYTES_PER_S.items():
            if key in name:
                return value, f"data sheet, {name}"
    src = torch.empty(16 * 2**20, dtype=torch.float32, device=device)  # 64 MiB: beyond caches
    dst = torch.empty_like(src)
    seconds = measure(lambda: dst.copy_(src))
    return 2 * src.numel() * 4 / seconds, "measured copy (read + write)"


def prefix_pass(inputs: Inputs, scale: float) -> Callable[[], object]:
    """The cascade's shared-prefix pass alone, on the path the dispatcher would pick."""
    cascade = inputs.cascade_plan.cascade
    assert cascade is not None
    if dispatch.use_triton(inputs.q):
        from eclectus.kernels.triton_cascade import cascade_prefix_partials

        return lambda: cascade_prefix_partials(
            inputs.q, inputs.k_cache, inputs.v_cache, inputs.cascade_plan, scale
        )
    from eclectus.kernels.torch_ops import cascade_prefix_torch

    prefix = cascade_prefix_torch
    if dispatch.use_native(inputs.q, inputs.k_cache):
        prefix = native_cascade.cascade_prefix
    return lambda: prefix(inputs.q, inputs.k_cache, inputs.v_cache, inputs.cascade_plan, scale)


@dataclass(frozen=True)
class Result:
    row: str  # the printed table row
    vs_paged: float | None = None  # paged time / cascade time
    prefix_peak: float | None = None  # prefix-pass bandwidth / peak


def run_case(
    case: Case, device: torch.device, measure: Callable[[Callable[[], object]], float], peak: float
) -> Result:
    inputs = make_inputs(case, device)
    scale = case.head_dim**-0.5
    q, k, v = inputs.q, inputs.k_cache, inputs.v_cache
    if inputs.cascade_plan.cascade is None:
        return Result(
            f"{case.batch:>5} {case.prefix:>6} {case.suffix:>6}  (prefix too short to group)"
        )
    o_cascade = dispatch.decode_attention(q, k, v, inputs.cascade_plan, scale)
    o_paged = dispatch.decode_attention(q, k, v, inputs.paged_plan, scale)
    err = (o_cascade.float() - o_paged.float()).abs().max().item()
    q_dense = q[:, :, None, :]  # [B, Hq, 1, D]
    t_cascade = measure(lambda: dispatch.decode_attention(q, k, v, inputs.cascade_plan, scale))
    t_paged = measure(lambda: dispatch.decode_attention(q, k, v, inputs.paged_plan, scale))
    t_sdpa = measure(
        lambda: F.scaled_dot_product_attention(
            q_dense, inputs.k_dense, inputs.v_dense, scale=scale, enable_gqa=True
        )
    )
    t_prefix = measure(prefix_pass(inputs, scale))
    unique = case.kv_bytes(case.prefix + case.batch * case.suffix)
    prefix_bw = case.kv_bytes(case.prefix // case.block_size * case.block_size) / t_prefix
    row = (
        f"{case.batch:>5} {case.prefix:>6} {case.suffix:>6} {t_cascade * 1e3:>9.3f} "
        f"{t_paged * 1e3:>9.3f} {t_sdpa * 1e3:>9.3f} {t_paged / t_cascade:>8.2f}x "
        f"{t_sdpa / t_cascade:>8.2f}x {unique / t_cascade / 1e9:>9.1f} "
        f"{100 * unique / t_cascade / peak:>6.1f}% {prefix_bw / 1e9:>9.1f} "
        f"{100 * prefix_bw / peak:>6.1f}% {err:>8.1e}"
    )
    return Result(row, t_paged / t_cascade, prefix_bw / peak)


def report_targets(results: dict[tuple[int, int, int], Result]) -> None:
    """The issue's GPU targets, for the batch-64 x 8k-prefix rows that ran."""
    for (batch, prefix, suffix), result in results.items():
        if (batch, prefix) != (64, 8192) or result.vs_paged is None:
            continue
        assert result.prefix_peak is not None
        print(
            f"target {batch}x{prefix}x{suffix}: vs paged {result.vs_paged:.1f}x (>= 10x "
            f"{'met' if result.vs_paged >= 10 else 'NOT met'}), prefix pass "
            f"{100 * result.prefix_peak:.0f}% of peak (> 70% "
            f"{'met' if result.prefix_peak > 0.7 else 'NOT met'})"
        )


def decode_path(device: torch.device, dtype: torch.dtype) -> str:
    """Which kernels serve the two decode columns here, in words (reads the environment)."""
    probe = torch.empty(1, 1, 1, device=device, dtype=dtype)
    if dispatch.use_triton(probe):
        return "triton kernels"
    if dispatch.use_native(probe, probe[None]):
        return "native C paged decode and cascade (prefix pass, suffix pass + merge)"
    return "torch paths"


def parse_sizes(text: str) -> list[tuple[int, int, int]]:
    """ "16:1024:64,64:8192:16" -> [(16, 1024, 64), (64, 8192, 16)]."""
    sizes = []
    for item in text.split(","):
        batch, prefix, suffix = (int(x) for x in item.split(":"))
        sizes.append((batch, prefix, suffix))
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--sizes", type=parse_sizes, help="batch:prefix:suffix,...")
    parser.add_argument("--dtype", choices=["bf16", "fp16", "fp32"])
    parser.add_argument("--head-dim", type=int)
    parser.add_argument("--q-heads", type=int)
    parser.add_argument("--kv-heads", type=int)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=10, help="CPU timing repeats")
    parser.add_argument("--threads", type=int, help="CPU: torch.set_num_threads (default: torch's)")
    parser.add_argument(
        "--cuda-graph",
        action="store_true",
        help="GPU: time CUDA-graph replays (no launch overhead, L2 kept warm)",
    )
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if args.threads:  # on a busy shared CPU, one thread avoids OpenMP barrier stalls
        torch.set_num_threads(args.threads)
    gpu = device.type == "cuda"
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[
        args.dtype or ("bf16" if gpu else "fp32")
    ]
    head_dim = args.head_dim or (128 if gpu else 64)
    num_q_heads, num_kv_heads = (
        args.q_heads or (32 if gpu else 4),
        args.kv_heads or (8 if gpu else 2),
    )
    measure = timer(device, args.repeats, args.cuda_graph)
    peak, peak_source = peak_bandwidth(device, measure)
    path = decode_path(device, dtype)
    print(
        f"device {device} ({torch.cuda.get_device_name(device) if gpu else 'CPU'}, "
        f"{torch.get_num_threads()} threads), "
        f"{path}, {dtype}, head_dim {head_dim}, Hq {num_q_heads}, Hkv {num_kv_heads}, "
        f"block {args.block_size}; peak {peak / 1e9:.0f} GB/s ({peak_source})"
        + ("; CUDA-graph replays" if args.cuda_graph else "")
    )
    print("ratios = baseline time / cascade time; GB/s = unique KV bytes / time")
    print(
        f"{'batch':>5} {'prefix':>6} {'suffix':>6} {'cascade':>9} {'paged':>9} {'sdpa':>9} "
        f"{'vs paged':>9} {'vs sdpa':>9} {'GB/s':>9} {'%peak':>7} {'pfx GB/s':>9} "
        f"{'%peak':>7} {'max|err|':>8}"
    )
    print(f"{'':>20} {'ms':>9} {'ms':>9} {'ms':>9}")
    results = {}
    for size in args.sizes or (GPU_SIZES if gpu else CPU_SIZES):
        case = Case(*size, num_q_heads, num_kv_heads, head_dim, args.block_size, dtype)
        results[size] = run_case(case, device, measure, peak)
        print(results[size].row, flush=True)
    if gpu:
        report_targets(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
