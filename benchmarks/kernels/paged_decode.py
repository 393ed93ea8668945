"""CPU paged-decode benchmark at the engine's shapes:
``python -m eclectus.benchmarks.kernels.paged_decode``.

One decode step's attention for every layer of a model (default 4, like ``tiny``: Hq 4, Hkv 2,
head_dim 64, fp32), batch B, distinct contexts drawn from [min, max] tokens, block tables
shuffled over a pool three times the batch's blocks, each layer its own cache, so the KV comes
from memory the way it does in the engine, not from a warm cache. Compared in the same run
(alternating, best of ``--repeats`` per round, best round):

* native     -- the compiled kernel (``kernels/native.py``): what the engine runs on a CPU
                with a C compiler; one pass over the blocks, no gather;
* torch      -- the torch path (head-major cache, block-run gathers in chunks, two bmm);
* token-rows -- the torch path before that: a token-major cache [blocks, block_size, Hkv, D]
                and one gather of the whole batch with one row per token and head;
* sdpa       -- ``scaled_dot_product_attention`` on KV already dense per request (gather not
                timed): what attention costs without any gather.

Ratios are baseline time / native time (> 1: native is faster; without a compiler the torch
path is the reference). GB/s: the KV bytes read (sum of contexts * Hkv * D * 2 * element
size) over the reference's time.
"""

from __future__ import annotations

import argparse
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from eclectus.kernels import native, torch_ops
from eclectus.kernels.gather import pooled_buffer
from eclectus.kernels.plans import DecodePlan, plan_decode


@dataclass(frozen=True)
class Shape:
    batch: int
    min_len: int
    max_len: int
    block_size: int
    num_layers: int = 4
    num_q_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64


@dataclass
class Step:
    """One step's inputs: per layer head-major and token-major caches holding the same KV."""

    q: Tensor  # [B, Hq, D]
    plan: DecodePlan
    k_layers: list[Tensor]  # [num_blocks, Hkv, block_size, D]
    v_layers: list[Tensor]
    k_token_major: list[Tensor]  # [num_blocks, block_size, Hkv, D]
    v_token_major: list[Tensor]
    k_dense: list[Tensor]  # [B, Hkv, max_len, D], zero-padded
    v_dense: list[Tensor]
    kv_bytes: int  # per layer, K and V


def make_step(shape: Shape, seed: int = 0) -> Step:
    """Random contexts, shuffled block tables, one cache pair per layer."""
    gen = torch.Generator().manual_seed(seed)
    bs, heads, dim = shape.block_size, shape.num_kv_heads, shape.head_dim
    lens = torch.randint(shape.min_len, shape.max_len + 1, (shape.batch,), generator=gen).tolist()
    counts = [-(-n // bs) for n in lens]
    num_blocks = 2 * sum(counts)  # half the pool unused, so tables are scattered
    ids = torch.randperm(num_blocks, generator=gen).tolist()
    tables = [ids[sum(counts[:i]) : sum(counts[: i + 1])] for i in range(shape.batch)]
    width = max(lens)
    keep = (torch.arange(width)[None, :] < torch.tensor(lens)[:, None])[:, None, :, None]
    names = ("k", "v", "k_tm", "v_tm", "k_d", "v_d")
    layers: dict[str, list[Tensor]] = {name: [] for name in names}
    for _, side in itertools.product(range(shape.num_layers), ("k", "v")):
        cache = torch.randn(num_blocks, heads, bs, dim, generator=gen)
        dense = [cache[t].transpose(0, 1).reshape(heads, -1, dim) for t in tables]
        dense = [F.pad(d, (0, 0, 0, max(0, width - d.shape[1])))[:, :width] for d in dense]
        layers[side].append(cache)
        layers[f"{side}_tm"].append(cache.transpose(1, 2).contiguous())
        layers[f"{side}_d"].append(torch.stack(dense) * keep)
    return Step(
        torch.randn(shape.batch, shape.num_q_heads, dim, generator=gen),
        plan_decode(tables, lens, bs, torch.device("cpu"), cascade=False),
        layers["k"],
        layers["v"],
        layers["k_tm"],
        layers["v_tm"],
        layers["k_d"],
        layers["v_d"],
        kv_bytes=sum(lens) * heads * dim * 2 * 4,
    )


def token_rows_decode(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, plan: DecodePlan, scale: float
) -> Tensor:
    """The replaced path: token-major cache, one gathered row per (token, kv head), whole
    batch at once, pooled buffers. q [B, Hq, D] -> o [B, Hq, D] fp32."""
    batch, num_q_heads, head_dim = q.shape
    bs, heads = k_cache.shape[1], k_cache.shape[2]
    rows, masked = plan.scratch.cached("token_rows", lambda: _token_rows(plan, bs, heads))
    flat_k, flat_v = k_cache.view(-1, head_dim), v_cache.view(-1, head_dim)
    out_shape = (rows.numel(), head_dim)
    k = torch.index_select(flat_k, 0, rows, out=pooled_buffer("tr_k", out_shape, q.dtype, q.device))
    v = torch.index_select(flat_v, 0, rows, out=pooled_buffer("tr_v", out_shape, q.dtype, q.device))
    k, v = k.view(batch, heads, -1, head_dim), v.view(batch, heads, -1, head_dim)
    scores = (q.view(batch, heads, -1, head_dim) * scale) @ k.transpose(-1, -2)
    scores.masked_fill_(masked, -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    return (torch.exp(scores - lse[..., None]) @ v).view(batch, num_q_heads, head_dim)


def _token_rows(plan: DecodePlan, bs: int, heads: int) -> tuple[Tensor, Tensor]:
    blocks = plan.block_tables[:, : plan.max_blocks].long()
    tokens = (blocks[..., None] * bs + torch.arange(bs)).flatten(-2)  # [B, L]
    rows = tokens[:, None, :] * heads + torch.arange(heads)[:, None]  # [B, Hkv, L]
    masked = torch.arange(tokens.shape[1])[None, :] >= plan.seq_lens[:, None]
    return rows.reshape(-1), masked[:, None, None, :]


def time_best(fn: Callable[[], object], repeats: int) -> float:
    """Best wall-clock seconds of ``repeats`` calls, after one warm-up."""
    fn()
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def run_shape(shape: Shape, repeats: int, rounds: int) -> str:
    """Time the three paths over all layers (interleaved rounds) and format one table row."""
    step = make_step(shape)
    scale = shape.head_dim**-0.5
    layers = range(shape.num_layers)
    q, plan = step.q, step.plan
    q_dense = q[:, :, None, :]

    def native_path() -> None:
        for i in layers:
            native.decode_window(q, step.k_layers[i], step.v_layers[i], plan, scale)

    def torch_path() -> None:
        for i in layers:
            torch_ops.decode_window(q, step.k_layers[i], step.v_layers[i], plan, scale)

    def token_rows() -> None:
        for i in layers:
            token_rows_decode(q, step.k_token_major[i], step.v_token_major[i], plan, scale)

    def sdpa() -> None:
        for i in layers:
            F.scaled_dot_product_attention(
                q_dense, step.k_dense[i], step.v_dense[i], scale=scale, enable_gqa=True
            )

    paths = {"torch": torch_path, "token_rows": token_rows, "sdpa": sdpa}
    if native.available():
        paths = {"native": native_path, **paths}
    reference = next(iter(paths))
    o_ref = torch_ops.decode_window(q, step.k_layers[0], step.v_layers[0], plan, scale)[0]
    o_rows = token_rows_decode(q, step.k_token_major[0], step.v_token_major[0], plan, scale)
    err = (o_ref - o_rows).abs().max().item()
    if reference == "native":
        o_native = native.decode_window(q, step.k_layers[0], step.v_layers[0], plan, scale)[0]
        err = max(err, (o_native - o_ref).abs().max().item())
    times: dict[str, float] = {}
    for _ in range(rounds):
        for name, fn in paths.items():
            times[name] = min(times.get(name, math.inf), time_best(fn, repeats))
    per_layer = {k: v / shape.num_layers for k, v in times.items()}
    t = per_layer[reference]
    cells = [
        f"{per_layer[name] * 1e3:>10.3f}" if name in per_layer else f"{'n/a':>10}"
        for name in ("native", "torch", "token_rows", "sdpa")
    ]
    ratios = [f"{per_layer[name] / t:>9.2f}x" for name in ("torch", "token_rows", "sdpa")]
    return (
        f"{shape.batch:>5} {shape.min_len:>5}-{shape.max_len:<5} {shape.block_size:>5} "
        f"{' '.join(cells)} {' '.join(ratios)} {step.kv_bytes / t / 1e9:>7.1f} {err:>8.1e}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="8,16,32", help="comma-separated batch sizes")
    parser.add_argument("--lens", default="1024:2048", help="min:max context tokens")
    parser.add_argument("--block-sizes", default="16,32")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    min_len, max_len = (int(x) for x in args.lens.split(":"))
    print(
        f"CPU, {torch.get_num_threads()} thread(s), fp32, {args.layers} layers, Hq 4, Hkv 2, "
        f"head_dim 64; ms per layer (best of {args.repeats} x {args.rounds} alternating rounds)"
    )
    print(
        f"{'batch':>5} {'context':^11} {'block':>5} {'native':>10} {'torch':>10} "
        f"{'token-rows':>10} {'sdpa':>10} {'torch/ref':>10} {'rows/ref':>10} {'sdpa/ref':>10} "
        f"{'GB/s':>7} {'max|err|':>8}"
    )
    for bs in (int(x) for x in args.block_sizes.split(",")):
        for batch in (int(x) for x in args.batches.split(",")):
            shape = Shape(batch, min_len, max_len, bs, num_layers=args.layers)
            print(run_shape(shape, args.repeats, args.rounds), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
