"""The Llama-family decoder (Llama, Mistral, Qwen2) as a flat-token forward pass.

The forward takes a batch as one flat sequence of tokens ([T] ids and [T] positions, any mix
of prompts and decodes) and leaves attention to an :class:`AttentionFn` that the engine's
runner supplies: it owns the KV cache and knows which tokens see which. Everything else
(embedding, RMSNorm, RoPE, projections, SwiGLU MLP, the LM head) is here.

Layout differences from the Hugging Face checkpoint, applied at load (see weights.py):
``q_proj``/``k_proj``/``v_proj`` are fused into ``qkv_proj`` and ``gate_proj``/``up_proj``
into ``gate_up_proj`` so each layer does two input GEMMs instead of five.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from eclectus.server.engine.engine_config import SUPPORTED_DTYPES
from eclectus.server.engine.model_config import ModelConfig
from eclectus.server.engine.rope import RotaryEmbedding, apply_rope


class AttentionFn(Protocol):
    """Causal attention for one layer, implemented by the engine's model runner.

    ``q`` [T, Hq, D], ``k``/``v`` [T, Hkv, D] in the model dtype, RoPE already applied, for the
    T tokens of this forward (row i is the token at ``positions[i]``). Returns ``o``
    [T, Hq, D]: softmax(q·kᵀ / sqrt(D)) v over each token's own sequence up to and including
    itself (earlier tokens come from the cache). The implementation typically mutates its KV
    cache (stores k/v); the model never looks at the cache.

    In the last layer of a forward given ``rows`` (R < T of them; see
    :meth:`LlamaForCausalLM.forward`), q holds only those rows ([R, Hq, D], in the order
    given) while k/v still hold all T tokens (every token's K/V is stored); o is then
    [R, Hq, D]. So q and k of different lengths mean the rows' last layer.
    """

    def __call__(self, layer_idx: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor: ...


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm of x [T, size] -> [T, size] in x's dtype (pure): fp32 accumulation, cast back
    before the weight (transformers' numerics)."""
    if x.dtype == torch.float32:  # same ops, fewer temporaries (a * b == b * a exactly)
        inv = x.pow(2).mean(-1, keepdim=True).add_(eps).rsqrt_()
        return (x * inv).mul_(weight)
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


class RMSNorm(nn.Module):
    """The weight and epsilon of an RMSNorm (:func:`rms_norm`)."""

    def __init__(self, size: int, eps: float, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size, dtype=dtype, device=device))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        """x [T, size] -> [T, size] in x's dtype (pure)."""
        return rms_norm(x, self.weight, self.eps)


def _linear(
    n_in: int, n_out: int, bias: bool, dtype: torch.dtype, device: torch.device
) -> nn.Linear:
    """An uninitialised nn.Linear (the checkpoint fills it). On a CPU its weight [out, in] is
    laid out column-major, i.e. the transpose of a contiguous [in, out]: F.linear multiplies
    by weight.t(), which is then a plain row-major matrix, and MKL's sgemm on the small-row
    shapes of a decode step runs ~25% faster on that than on a transposed operand (64 rows:
    docs/benchmarks.md, issue #18), with the same sums in the same order. Loading copies
    into the weight whatever its strides; other devices keep the checkpoint's layout."""
    # skip_init: weights come from the checkpoint; random init would only cost time
    linear = torch.nn.utils.skip_init(nn.Linear, n_in, n_out, bias=bias, device=device, dtype=dtype)
    if device.type == "cpu":
        linear.weight = nn.Parameter(torch.empty(n_in, n_out, dtype=dtype, device=device).t())
    return linear


class Attention(nn.Module):
    """Grouped-query self-attention's projections (the forward is :class:`LayerWeights`')."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        hidden, q_size, kv_size = config.hidden_size, config.q_size, config.kv_size
        self.qkv_proj = _linear(hidden, q_size + 2 * kv_size, config.attention_bias, dtype, device)
        self.o_proj = _linear(q_size, hidden, False, dtype, device)


class MLP(nn.Module):
    """SwiGLU's projections, gate and up fused in one GEMM (the forward is
    :class:`LayerWeights`')."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.gate_up_proj = _linear(
            config.hidden_size, 2 * config.intermediate_size, False, dtype, device
        )
        self.down_proj = _linear(config.intermediate_size, config.hidden_size, False, dtype, device)


@dataclass(frozen=True, slots=True)
class LayerWeights:
    """One decoder layer's tensors and sizes, read off its modules once, and its forward as
    plain calls on them.

    Why not the modules' own calls: on a decode step each op of a layer starts with cold
    caches (its attention has just streamed the K/V), and so does nn.Module's call machinery;
    the 9 module calls of a layer cost ~0.4 ms at 64 rows, the same ops as plain calls ~27%
    less time per forward (docs/benchmarks.md, issue #18).
    """

    layer_idx: int
    eps: float
    num_heads: int
    num_kv_heads: int
    head_dim: int
    q_size: int
    kv_size: int
    intermediate_size: int
    input_norm: Tensor  # [hidden]
    qkv: Tensor  # [q_size + 2 kv_size, hidden]
    qkv_bias: Tensor | None
    o: Tensor  # [hidden, q_size]
    post_norm: Tensor  # [hidden]
    gate_up: Tensor  # [2 intermediate, hidden]
    down: Tensor  # [hidden, intermediate]

    def forward(
        self,
        x: Tensor,
        rope: tuple[Tensor, Tensor],
        attn: AttentionFn,
        rows: Tensor | None = None,
    ) -> Tensor:
        """Pre-norm residual block: x [T, hidden], rope (cos, sin) [T, 1, D] -> [T, hidden],
        or [R, hidden] for the ``rows`` [R] only (every token's K/V still goes to ``attn``,
        and their attention sees it). Pure here; ``attn`` may write its cache."""
        t = x.shape[0]
        qkv = F.linear(rms_norm(x, self.input_norm, self.eps), self.qkv, self.qkv_bias)
        qk_size = self.q_size + self.kv_size
        # q and k heads are adjacent in qkv: rotate them together (one set of kernels)
        qk = apply_rope(qkv[:, :qk_size].view(t, -1, self.head_dim), *rope)
        q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
        v = qkv[:, qk_size:].view(t, self.num_kv_heads, self.head_dim)
        if rows is not None:
            q, x = q[rows], x[rows]
        o = attn(self.layer_idx, q, k, v)
        # each residual sum in place in its projection's own output (h + x == x + h exactly)
        x = F.linear(o.reshape(q.shape[0], self.q_size), self.o).add_(x)
        gate_up = F.linear(rms_norm(x, self.post_norm, self.eps), self.gate_up)
        gate, up = gate_up.split(self.intermediate_size, dim=-1)
        return F.linear(F.silu(gate, inplace=True).mul_(up), self.down).add_(x)


class DecoderLayer(nn.Module):
    def __init__(
        self, config: ModelConfig, layer_idx: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        super().__init__()
        self.config, self.layer_idx = config, layer_idx
        eps = config.rms_norm_eps
        self.input_layernorm = RMSNorm(config.hidden_size, eps, dtype, device)
        self.self_attn = Attention(config, dtype, device)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps, dtype, device)
        self.mlp = MLP(config, dtype, device)

    def weights(self) -> LayerWeights:
        """This layer's current parameters and sizes (pure; the tensors are the parameters
        themselves, not copies)."""
        c, attn, mlp = self.config, self.self_attn, self.mlp
        return LayerWeights(
            self.layer_idx,
            c.rms_norm_eps,
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim,
            c.q_size,
            c.kv_size,
            c.intermediate_size,
            self.input_layernorm.weight,
            attn.qkv_proj.weight,
            attn.qkv_proj.bias,
            attn.o_proj.weight,
            self.post_attention_layernorm.weight,
            mlp.gate_up_proj.weight,
            mlp.down_proj.weight,
        )


class LlamaModel(nn.Module):
    """Embedding, decoder layers, final norm (named as in HF checkpoints under ``model.``)."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.embed_tokens = torch.nn.utils.skip_init(
            nn.Embedding, config.vocab_size, config.hidden_size, dtype=dtype, device=device
        )
        self.layers = nn.ModuleList(
            DecoderLayer(config, i, dtype, device) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype, device)


class LlamaForCausalLM(nn.Module):
    """A Llama-family causal LM over flat token batches. Inference only (no autograd state).

    ``forward`` returns final hidden states; call ``compute_logits`` on the rows you sample
    from (usually the last token of each sequence) so prefill does not pay for a full
    [T, vocab] projection.
    """

    def __init__(
        self, config: ModelConfig, dtype: torch.dtype, device: torch.device | str = "cpu"
    ) -> None:
        super().__init__()
        device = torch.device(device)
        self.config, self.dtype = config, dtype
        self.model = LlamaModel(config, dtype, device)
        self.rotary = RotaryEmbedding(
            config.head_dim,
            config.max_position_embeddings,
            config.rope_theta,
            config.rope_scaling,
            device,
        )
        self.lm_head: nn.Linear | None = None
        if not config.tie_word_embeddings:
            self.lm_head = _linear(config.hidden_size, config.vocab_size, False, dtype, device)
        self.requires_grad_(False)
        # forward() checks positions against max_model_len with one host sync; a runner that
        # already bounds sequence lengths (or captures CUDA graphs) may switch it off
        self.check_positions = True
        self._layer_weights: list[LayerWeights] | None = None  # see layer_weights()

    def layer_weights(self) -> list[LayerWeights]:
        """Each decoder layer's :class:`LayerWeights`, read off the modules on first use and
        kept (mutates that cache). Loading copies into the parameters in place, so it stays
        valid; what replaces parameters (``set_column_major_weights``, ``.to()`` and the
        other ``_apply`` conversions) clears it."""
        if self._layer_weights is None:
            self._layer_weights = [layer.weights() for layer in self.model.layers]
        return self._layer_weights

    def _apply(self, fn: Callable[..., Any], recurse: bool = True) -> LlamaForCausalLM:
        self._layer_weights = None  # the conversion may replace every parameter
        return super()._apply(fn, recurse)

    def set_column_major_weights(self, column_major: bool) -> None:
        """Lay every projection's weight (the LM head's too) out column-major, as
        :func:`_linear` does on a CPU, or row-major as in the checkpoint (mutates the
        parameters' storage, not their values; the benchmarks' A/B sets it)."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                weight = module.weight.detach()
                weight = weight.t().contiguous().t() if column_major else weight.contiguous()
                module.weight = nn.Parameter(weight, requires_grad=False)
        self._layer_weights = None

    @torch.inference_mode()
    def forward(
        self,
        input_ids: Tensor,
        positions: Tensor,
        attn: AttentionFn,
        rows: Tensor | None = None,
    ) -> Tensor:
        """input_ids [T] int64, positions [T] int64 -> hidden [T, hidden] in the model dtype,
        or [R, hidden] for ``rows`` [R < T] int64 only (the rows that get logits).

        With ``rows`` the last layer computes every token's K/V (for ``attn`` to store) but
        its queries, output projection, MLP and the final norm only for those rows: nothing
        after the last K/V reads another row, so the other rows' outputs would be thrown
        away (on a 2,048-token prefill step of 4 prompts, a layer's attention and MLP for
        2,044 unused rows). Raises ValueError if a position lies beyond what the model
        computes correctly (the RoPE table, or a sliding window we do not implement). Pure
        except through ``attn``.
        """
        if self.check_positions:
            self._check_positions(positions)
        x = F.embedding(input_ids, self.model.embed_tokens.weight)
        rope = self.rotary.cos_sin(positions, x.dtype)
        *layers, last = self.layer_weights()
        for layer in layers:
            x = layer.forward(x, rope, attn)
        norm = self.model.norm
        return rms_norm(last.forward(x, rope, attn, rows), norm.weight, norm.eps)

    @torch.inference_mode()
    def compute_logits(self, hidden: Tensor) -> Tensor:
        """hidden [N, hidden] -> logits [N, vocab] fp32 (pure). The GEMM runs in the model
        dtype, then the result is upcast, as transformers does."""
        weight = self.lm_head.weight if self.lm_head is not None else self.model.embed_tokens.weight
        return F.linear(hidden, weight).float()

    def _check_positions(self, positions: Tensor) -> None:
        if positions.numel() == 0:
            return
        limit = self.config.max_model_len
        # one host sync per forward; cheap next to the GEMMs and it prevents silent garbage
        top = int(positions.max())
        if top >= limit:
            reason = (
                f"sliding_window={self.config.sliding_window} (windowed attention is not "
                "implemented)"
                if self.config.sliding_window == limit
                else f"max_position_embeddings={limit}"
            )
            raise ValueError(f"position {top} is beyond this model's limit: {reason}")


def load_model(
    path: str | Path,
    dtype: torch.dtype | str | None = None,
    device: torch.device | str = "cpu",
) -> tuple[LlamaForCausalLM, ModelConfig]:
    """Build the model of a HF directory (or preset name) and load its safetensors weights.

    ``dtype`` None keeps the checkpoint's ``torch_dtype``; strings are "float32", "bfloat16",
    "float16". Returns the model in eval mode on ``device``.
    """
    from eclectus.models.presets import resolve_model_dir
    from eclectus.server.engine.weights import load_weights

    model_dir = resolve_model_dir(str(path))
    config = ModelConfig.from_dir(model_dir)
    torch_dtype = _to_dtype(dtype if dtype is not None else config.torch_dtype)
    model = LlamaForCausalLM(config, torch_dtype, device)
    load_weights(model, model_dir)
    return model.eval(), config


def _to_dtype(dtype: torch.dtype | str) -> torch.dtype:
    names = {name: getattr(torch, name) for name in SUPPORTED_DTYPES}
    if isinstance(dtype, torch.dtype):
        if dtype not in names.values():
            raise ValueError(f"unsupported dtype {dtype}")
        return dtype
    names |= {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    if dtype not in names:
        raise ValueError(f"unsupported dtype {dtype!r}; use one of {sorted(names)}")
    return names[dtype]
