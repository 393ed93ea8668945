"""The compiled CPU kernel: paged decode attention in C, built on first use.

The torch decode path gathers each request's KV window into a head-major copy, then runs two
bmm calls and a softmax: three trips through memory per byte of KV, and on a CPU decode is
memory-bound (the engine profile: gathers and bmm were ~70% of a batch-8 decode step).
``csrc/paged_decode.c`` reads every key and value row once, straight from the paged cache.

It is plain C (no torch headers, so building takes about a second), compiled with the
system's C compiler (``$CC``, else ``cc``) at ``-O3 -march=native`` with OpenMP, and loaded
with ctypes, which releases the GIL for the call. The library is cached under
``<eclectus cache>/kernels/`` keyed by the source, the flags, the compiler and the CPU, and
written atomically, so concurrent processes may build it at once. Where no compiler works,
:func:`available` is False and the dispatchers keep the torch path (logged once);
``ECLECTUS_KERNELS=torch`` switches it off (see ``dispatch``).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from eclectus.cache import cache_dir
from eclectus.kernels.plans import DecodePlan

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("csrc") / "paged_decode.c"
# -fassociative-math (with the two flags it needs) lets the reductions vectorize; unlike
# -ffast-math it keeps inf semantics (an empty window's LSE is -inf). Measured on the 2-core
# AVX-512 VM, batch 8 x 1,100 tokens: 0.37 ms against 0.64 ms at plain -O3.
FAST_MATH = ("-ffp-contract=fast", "-fassociative-math", "-fno-signed-zeros", "-fno-trapping-math")
FLAG_SETS = (  # tried in order: without OpenMP the pragmas are ignored (one thread)
    ("-O3", "-march=native", *FAST_MATH, "-fopenmp", "-fPIC", "-shared"),
    ("-O3", "-march=native", *FAST_MATH, "-fPIC", "-shared"),
)


def available() -> bool:
    """Whether the compiled kernel can serve calls here (builds it on first call)."""
    return _library() is not None


@dataclass(frozen=True, slots=True)
class PrefixStates:
    """Attention states for the kernel to join into each request's own window (the cascade's
    prefix pass): request b's are rows ``request_rows[request_offsets[b]:request_offsets[b +
    1]]`` of (o, lse), the exact attention over key sets disjoint from its window."""

    o: Tensor  # fp32 [M, Hq, D], contiguous
    lse: Tensor  # fp32 [M, Hq], contiguous, natural log; -inf for an empty state
    request_offsets: Tensor  # int32 [B + 1], non-decreasing, from 0
    request_rows: Tensor  # int32 [request_offsets[B]], each in [0, M)


def decode_window(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    plan: DecodePlan,
    scale: float,
    kv_starts: Sequence[int] | None = None,
    tag: str = "full",
    prefix: PrefixStates | None = None,
) -> tuple[Tensor, Tensor]:
    """The torch path's ``decode_window`` (torch_ops.DecodeWindow), on this kernel: the plan's
    tables and lengths as they are, the window starts cached in ``plan.scratch`` as int32; the
    bounds are checked once per plan. With ``prefix`` (its rows already checked against the
    plan, as ``native_cascade`` does once per plan), each request's window is joined with its
    prefix states in the same pass: the cascade's suffix pass and merge."""
    starts = None
    if kv_starts is not None:
        starts = plan.scratch.cached(
            (tag, "native_starts"), lambda: torch.tensor(kv_starts, dtype=torch.int32)
        )
    plan.scratch.cached(
        ("native_checked", tag, k_cache.shape),
        lambda: _check_bounds(k_cache, plan.block_tables, plan.seq_lens, starts, plan.block_size),
    )
    return _launch(q, k_cache, v_cache, plan.block_tables, plan.seq_lens, scale, starts, prefix)


def paged_decode_native(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    scale: float,
    kv_starts: Tensor | None = None,
    prefix: PrefixStates | None = None,
) -> tuple[Tensor, Tensor]:
    """Request i's query q[i] attends to its tokens [kv_starts[i] (default 0), seq_lens[i]),
    joined with its ``prefix`` states when given.

    q [B, Hq, D] fp32; caches [num_blocks, Hkv, block_size, D] fp32 (any strides but a unit
    head_dim stride); block_tables int32 [B, W]; seq_lens, kv_starts int32 [B]; all on the
    CPU. Returns (o [B, Hq, D] fp32, lse [B, Hq] fp32, natural log; an empty window and no
    non-empty prefix state give o = 0, lse = -inf). Pure. Raises ValueError for arguments the
    kernel would read outside of, RuntimeError if the kernel is unavailable.
    """
    _check_bounds(k_cache, block_tables, seq_lens, kv_starts, k_cache.shape[2])
    if prefix is not None:
        check_prefix_rows(
            prefix.request_offsets, prefix.request_rows, prefix.o.shape[0], seq_lens.shape[0]
        )
    return _launch(q, k_cache, v_cache, block_tables, seq_lens, scale, kv_starts, prefix)


def check_prefix_rows(offsets: Tensor, rows: Tensor, num_states: int, batch: int) -> bool:
    """Refuse the request -> prefix rows tables of :class:`PrefixStates` (``request_offsets``,
    ``request_rows``) where they would take the kernel outside ``num_states`` rows (pure)."""
    if offsets.dtype != torch.int32 or rows.dtype != torch.int32:
        raise ValueError("prefix request_offsets and request_rows must be int32")
    if offsets.shape != (batch + 1,) or rows.dim() != 1:
        raise ValueError(f"want prefix request_offsets [{batch + 1}] and request_rows [N]")
    if int(offsets[0]) != 0 or int(offsets[-1]) != rows.shape[0]:
        raise ValueError("prefix request_offsets must run from 0 to len(request_rows)")
    if batch and bool((offsets[1:] < offsets[:-1]).any()):
        raise ValueError("prefix request_offsets must not decrease")
    if rows.numel() and not (int(rows.min()) >= 0 and int(rows.max()) < num_states):
        raise ValueError(f"prefix request_rows outside [0, {num_states})")
    return True


def _launch(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    scale: float,
    kv_starts: Tensor | None,
    prefix: PrefixStates | None = None,
) -> tuple[Tensor, Tensor]:
    """Call the kernel on checked bounds (types, shapes and strides are checked here)."""
    lib = loaded_library()
    batch, num_q_heads, _ = q.shape
    _check(q, k_cache, v_cache, block_tables, seq_lens, kv_starts)
    q = q.contiguous()
    tables, lens = block_tables.contiguous(), seq_lens.contiguous()
    starts = kv_starts.contiguous() if kv_starts is not None else None
    joined: tuple[int | None, ...] = (None, None, None, None)
    if prefix is not None:
        _check_prefix(prefix, q)
        joined = (
            prefix.o.data_ptr(),
            prefix.lse.data_ptr(),
            prefix.request_offsets.data_ptr(),
            prefix.request_rows.data_ptr(),
        )
    o = torch.empty_like(q)
    lse = torch.empty(batch, num_q_heads, dtype=torch.float32)
    status = lib.paged_decode_f32(
        *cache_args(q, k_cache, v_cache),
        tables.data_ptr(),
        tables.stride(0),
        lens.data_ptr(),
        starts.data_ptr() if starts is not None else None,
        *joined,
        o.data_ptr(),
        lse.data_ptr(),
        batch,
        *shape_args(q, k_cache, scale),
    )
    if status != 0:
        raise MemoryError("native decode kernel: scratch allocation failed")
    return o, lse


def _check_prefix(prefix: PrefixStates, q: Tensor) -> None:
    """The prefix states' o and lse against q [B, Hq, D], on every call (they are new each
    layer); the row tables' types, shapes and bounds are :func:`check_prefix_rows`', which
    every caller runs first (once per plan on the engine's path)."""
    num_states = prefix.o.shape[0]
    tensors = (prefix.o, prefix.lse, prefix.request_offsets, prefix.request_rows)
    if any(t.device.type != "cpu" or not t.is_contiguous() for t in tensors):
        raise ValueError("prefix states must be contiguous CPU tensors")
    if prefix.o.dtype != torch.float32 or prefix.lse.dtype != torch.float32:
        raise ValueError("prefix states o and lse must be fp32")
    if prefix.o.shape != (num_states, *q.shape[1:]) or prefix.lse.shape != prefix.o.shape[:2]:
        raise ValueError(
            f"want prefix o [M, {q.shape[1]}, {q.shape[2]}] and lse [M, {q.shape[1]}], got "
            f"{tuple(prefix.o.shape)} and {tuple(prefix.lse.shape)}"
        )


def store_kv_native(
    k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor
) -> None:
    """``dispatch.store_kv`` in C: one copy of each token's rows, where torch's indexed
    assignment costs ~25 us per cache and layer in index arithmetic and dispatch. MUTATES the
    caches. k, v [T, Hkv, D] fp32 with a unit last stride (views of the fused projection are
    fine); caches fp32, equal strides, unit head_dim stride; slot_mapping int64 [T], all on
    the CPU. Raises ValueError for arguments it would write outside of."""
    tensors = (k, v, k_cache, v_cache)
    if any(t.device.type != "cpu" or t.dtype != torch.float32 for t in tensors):
        raise ValueError("the native store_kv takes fp32 CPU tensors")
    num_blocks, num_kv_heads, block_size, head_dim = k_cache.shape
    shape = (slot_mapping.shape[0], num_kv_heads, head_dim)
    if k.shape != shape or v.shape != shape or k.stride(2) != 1 or v.stride(2) != 1:
        raise ValueError(f"want k and v {shape} with a unit last stride, got {tuple(k.shape)}")
    if k_cache.stride() != v_cache.stride() or k_cache.stride(3) != 1:
        raise ValueError("k and v caches need equal strides and a unit head_dim stride")
    if slot_mapping.dtype != torch.int64 or not slot_mapping.is_contiguous():
        raise ValueError("slot_mapping must be contiguous int64")
    status = loaded_library().store_kv_f32(
        k.data_ptr(),
        v.data_ptr(),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        k_cache.stride(0),
        k_cache.stride(2),
        k_cache.stride(1),
        slot_mapping.data_ptr(),
        shape[0],
        num_kv_heads,
        head_dim,
        block_size,
        num_blocks,
    )
    if status != 0:
        raise ValueError(f"a slot in slot_mapping lies outside the cache's {num_blocks} blocks")


def loaded_library() -> ctypes.CDLL:
    """The compiled kernel library (built on first use); RuntimeError when it could not be
    built (the log says why)."""
    lib = _library()
    if lib is None:
        raise RuntimeError("the native decode kernel is unavailable (see the log for why)")
    return lib


def cache_args(q: Tensor, k_cache: Tensor, v_cache: Tensor) -> tuple[int, ...]:
    """The leading arguments of each attention kernel in the library (pure): the q, k and v
    pointers, then the cache's block, slot and head strides (elements). ``q`` contiguous."""
    return (
        q.data_ptr(),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        k_cache.stride(0),  # block
        k_cache.stride(2),  # slot
        k_cache.stride(1),  # head
    )


def shape_args(q: Tensor, k_cache: Tensor, scale: float) -> tuple[int | float, ...]:
    """The trailing arguments of each attention kernel (pure): query heads, KV heads, head
    size, block size, the softmax scale and the threads to use."""
    _, num_q_heads, head_dim = q.shape
    num_kv_heads, block_size = k_cache.shape[1:3]
    return (num_q_heads, num_kv_heads, head_dim, block_size, scale, torch.get_num_threads())


def _check_bounds(
    k_cache: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    kv_starts: Tensor | None,
    block_size: int,
) -> bool:
    """The kernel reads wherever the tables point: refuse tables, lengths or starts that
    would take it outside the cache (the torch path would raise an IndexError)."""
    num_blocks, _, cache_block_size, _ = k_cache.shape
    if block_size != cache_block_size:
        raise ValueError(f"plan block_size {block_size} != cache block size {cache_block_size}")
    if block_tables.dim() != 2 or seq_lens.shape != (block_tables.shape[0],):
        raise ValueError("want block_tables [B, W] and seq_lens [B]")
    if kv_starts is not None and kv_starts.shape != seq_lens.shape:
        raise ValueError("want kv_starts [B] like seq_lens")
    if block_tables.numel() and not (
        int(block_tables.min()) >= 0 and int(block_tables.max()) < num_blocks
    ):
        raise ValueError(f"block table entries outside [0, {num_blocks})")
    if seq_lens.numel() and int(seq_lens.max()) > block_tables.shape[1] * block_size:
        raise ValueError("a sequence is longer than its block table")
    if kv_starts is not None and kv_starts.numel() and int(kv_starts.min()) < 0:
        raise ValueError("negative kv_starts")
    return True


def _check(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    kv_starts: Tensor | None,
) -> None:
    tensors = [q, k_cache, v_cache, block_tables, seq_lens] + (
        [kv_starts] if kv_starts is not None else []
    )
    if any(t.device.type != "cpu" for t in tensors):
        raise ValueError("the native decode kernel runs on CPU tensors only")
    if not (q.dtype == k_cache.dtype == v_cache.dtype == torch.float32):
        raise ValueError(f"the native decode kernel is fp32 only, got {q.dtype}/{k_cache.dtype}")
    if k_cache.stride() != v_cache.stride() or k_cache.stride(3) != 1:
        raise ValueError("k and v caches need equal strides and a unit head_dim stride")
    int_tensors = [block_tables, seq_lens] + ([kv_starts] if kv_starts is not None else [])
    if any(t.dtype != torch.int32 for t in int_tensors):
        raise ValueError("block_tables, seq_lens and kv_starts must be int32")
    if q.dim() != 3 or q.shape[2] != k_cache.shape[3] or q.shape[1] % k_cache.shape[1]:
        raise ValueError(f"head mismatch: q {tuple(q.shape)} vs cache {tuple(k_cache.shape)}")


@functools.cache
def _library() -> ctypes.CDLL | None:
    """Build (or find in the cache) and load the library; None where no compiler works."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        log.warning("no C compiler found: decode attention stays on the torch path")
        return None
    source = SOURCE.read_bytes()
    for flags in FLAG_SETS:
        path = _cached_path(compiler, flags, source)
        if path.exists() or _build(compiler, flags, path):
            lib = ctypes.CDLL(str(path))
            _declare(lib)
            return lib
    log.warning(
        "building %s with %s failed: decode attention stays on the torch path", SOURCE, compiler
    )
    return None


def _cached_path(compiler: str, flags: tuple[str, ...], source: bytes) -> Path:
    """The library's path in the cache: a digest of everything that shapes the binary."""
    digest = hashlib.sha256(source)
    digest.update(" ".join((compiler, *flags)).encode())
    digest.update(_compiler_version(compiler).encode())
    digest.update(_cpu_signature().encode())
    return cache_dir() / "kernels" / f"paged_decode-{digest.hexdigest()[:16]}.so"


def _build(compiler: str, flags: tuple[str, ...], path: Path) -> bool:
    """Compile to a temporary file, then rename it into place (atomic). Mutates the cache."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
    os.close(fd)
    cmd = [compiler, *flags, str(SOURCE), "-o", tmp, "-lm"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            log.info("%s failed: %s", " ".join(cmd), done.stderr.strip()[-2000:])
            return False
        os.replace(tmp, path)
        return True
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.info("%s failed: %s", " ".join(cmd), exc)
        return False
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _compiler_version(compiler: str) -> str:
    try:
        return subprocess.run(
            [compiler, "--version"], capture_output=True, text=True, timeout=30, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def _cpu_signature() -> str:
    """What -march=native depends on: the machine and, on Linux, the CPU's feature flags."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        flags = ""
    return f"{platform.machine()} {platform.processor()} {flags}"


def _declare(lib: ctypes.CDLL) -> None:
    ptr, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.paged_decode_f32.restype = ctypes.c_int
    lib.paged_decode_f32.argtypes = [
        ptr, ptr, ptr,  # q, k_cache, v_cache
        i64, i64, i64,  # cache strides: block, slot, head
        ptr, i64, ptr, ptr,  # block_tables, its row stride, seq_lens, kv_starts (nullable)
        ptr, ptr, ptr, ptr,  # prefix states to join (all nullable): o_mem, lse_mem, CSR
        ptr, ptr,  # o, lse
        i32, i32, i32, i32, i32,  # B, Hq, Hkv, D, block_size
        ctypes.c_float, i32,  # scale, num_threads
    ]  # fmt: skip
    lib.store_kv_f32.restype = ctypes.c_int
    lib.store_kv_f32.argtypes = [
        ptr, ptr, i64, i64, i64, i64,  # k, v, their token and head strides
        ptr, ptr, i64, i64, i64,  # k_cache, v_cache, cache strides: block, slot, head
        ptr, i32, i32, i32, i32, i64,  # slots (int64), T, Hkv, D, block_size, num_blocks
    ]  # fmt: skip
    lib.cascade_prefix_f32.restype = ctypes.c_int
    lib.cascade_prefix_f32.argtypes = [
        ptr, ptr, ptr,  # q, k_cache, v_cache
        i64, i64, i64,  # cache strides: block, slot, head
        ptr, i64,  # block_tables, its row stride
        ptr, ptr, ptr, ptr, ptr,  # member ids, group offsets, table rows, starts, ends
        ptr, ptr,  # o, lse
        i32, i32, i32, i32, i32,  # num_groups, Hq, Hkv, D, block_size
        ctypes.c_float, i32,  # scale, num_threads
    ]  # fmt: skip
