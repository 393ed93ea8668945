"""RoPE: the engine's rotation equals transformers' formula bit for bit."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.models.llama.modeling_llama import rotate_half

from eclectus.server.engine.rope import RotaryEmbedding, apply_rope


@settings(max_examples=20, deadline=None)
@given(
    st.integers(1, 70),
    st.integers(1, 6),
    st.sampled_from([8, 64, 128]),
    st.sampled_from([torch.float32, torch.bfloat16]),
    st.integers(0, 2**31),
)
def test_apply_rope_equals_transformers_bit_for_bit(
    tokens: int, heads: int, head_dim: int, dtype: torch.dtype, seed: int
) -> None:
    """Any token count, heads, head size and dtype, q and k stacked as a strided view of a
    fused projection: ``x * cos + rotate_half(x) * sin`` exactly, x untouched."""
    generator = torch.Generator().manual_seed(seed)
    fused = torch.randn(tokens, (heads + 1) * head_dim, generator=generator).to(dtype)
    x = fused[:, : heads * head_dim].view(tokens, heads, head_dim)  # strided, as in the model
    before = x.clone()
    positions = torch.randint(0, 4096, (tokens,), generator=generator)
    rotary = RotaryEmbedding(head_dim, 4096, 10000.0, None)
    cos, signed_sin = rotary.cos_sin(positions, dtype)
    half = head_dim // 2
    sin = signed_sin[..., half:].repeat(1, 1, 2)  # transformers' plain sin table
    assert torch.equal(apply_rope(x, cos, signed_sin), x * cos + rotate_half(x) * sin)
    assert torch.equal(x, before)
