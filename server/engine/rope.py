"""Rotary position embeddings: inverse frequencies (plain, linear, llama3) and a cos/sin cache.

The numerics follow transformers' Llama: inverse frequencies in fp32, angles
``position * inv_freq`` in fp32, cos/sin cast to the activation dtype, and the "rotate half"
(GPT-NeoX) layout where dimension ``i`` pairs with ``i + head_dim/2``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor


def inverse_frequencies(head_dim: int, theta: float, scaling: dict[str, Any] | None) -> Tensor:
    """fp32 [head_dim/2] inverse frequencies, scaled as ``scaling`` says (pure)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (theta**exponents)
    if scaling is None:
        return inv_freq
    if scaling["rope_type"] == "linear":
        # dividing frequencies by the factor equals dividing positions by it
        return inv_freq / float(scaling["factor"])
    if scaling["rope_type"] == "llama3":
        return _llama3_scale(inv_freq, scaling)
    raise ValueError(f"unsupported rope_type {scaling['rope_type']!r}")


def _llama3_scale(inv_freq: Tensor, scaling: dict[str, Any]) -> Tensor:
    """Llama 3.1 scaling: long wavelengths divided by ``factor``, short ones kept, the band
    between interpolated smoothly (same formula and comparisons as transformers)."""
    factor = float(scaling["factor"])
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old_len = float(scaling["original_max_position_embeddings"])
    low_freq_wavelen, high_freq_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(torch.nn.Module):
    """Precomputed cos/sin for positions [0, max_positions); see :func:`apply_rope`.

    The cache is fp32 (buffers ``cos_cache``/``sin_cache`` of shape [max_positions, D/2])
    and is gathered by position then cast to the activation dtype, as transformers does.
    """

    def __init__(
        self,
        head_dim: int,
        max_positions: int,
        theta: float,
        scaling: dict[str, Any] | None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        inv_freq = inverse_frequencies(head_dim, theta, scaling)
        positions = torch.arange(max_positions, dtype=torch.float32)
        angles = positions[:, None] * inv_freq[None, :]  # [P, D/2]
        # half width: both halves of a head use the same angles (rotate-half layout), so the
        # duplication happens per forward on T rows, not on all P (131072 for Llama 3.1)
        self.register_buffer("cos_cache", angles.cos().to(device), persistent=False)
        self.register_buffer("sin_cache", angles.sin().to(device), persistent=False)

    def cos_sin(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos [T, 1, D] and the *signed* sin [T, 1, D] = (-sin, sin) in ``dtype`` for
        positions [T] (pure), the form :func:`apply_rope` takes. Gathered once per forward and
        shared by every layer."""
        # index_select, not advanced indexing: the same rows, in one plain gather
        cos = self.cos_cache.index_select(0, positions).to(dtype)
        sin = self.sin_cache.index_select(0, positions).to(dtype)
        return torch.cat((cos, cos), -1)[:, None, :], torch.cat((-sin, sin), -1)[:, None, :]


def apply_rope(x: Tensor, cos: Tensor, signed_sin: Tensor) -> Tensor:
    """Rotate x [T, H, D] (q and k heads may be stacked along H) with cos and the signed sin
    [T, 1, D] of :meth:`RotaryEmbedding.cos_sin` (pure: a new tensor).

    Equals transformers' ``x * cos + rotate_half(x) * sin`` bit for bit: rotate_half(x) is
    (-x2, x1), and (-x2) * sin == x2 * (-sin) exactly, so the sign moves into the table and
    the per-layer negation disappears. The rotated halves come from one ``roll`` of x by
    half a head, (x2, x1), times the signed table: the same products and sums, in four
    kernels instead of a product and an in-place sum per half through slices (the slices,
    products, sums and setitem copies were ~15 dispatcher calls per layer; on a decode step
    each costs far more than its arithmetic: docs/benchmarks.md, issue #18).
    """
    out = x * cos
    return out.add_(torch.roll(x, x.shape[-1] // 2, -1).mul_(signed_sin))
