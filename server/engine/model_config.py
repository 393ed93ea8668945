"""ModelConfig: the architecture of a Llama-family checkpoint, parsed from its config.json
(what the forward computes; how the engine runs it is ``engine_config.EngineConfig``).

Supported: ``LlamaForCausalLM``, ``MistralForCausalLM`` and ``Qwen2ForCausalLM`` with SiLU
SwiGLU MLPs, and RoPE that is plain, ``linear`` or ``llama3`` scaled. Both config layouts are
read: the classic one (``rope_theta`` + ``rope_scaling``) and transformers 5's
(``rope_parameters``). Anything else is rejected with a ValueError that names the field, so a
checkpoint never loads into a model that would compute something different.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eclectus.server.engine.engine_config import SUPPORTED_DTYPES

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """The numbers a forward pass needs. Frozen; built by :meth:`from_dict`/:meth:`from_dir`.

    ``rope_scaling`` is None for plain RoPE, else a dict with ``rope_type`` ("linear" or
    "llama3") and that type's parameters. ``sliding_window`` is None unless the checkpoint
    really uses windowed attention (Mistral v0.1; Qwen2 with ``use_sliding_window``); we do not
    implement the window, so sequences longer than it are refused (see ``max_model_len``).
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool  # q/k/v projections carry a bias (Qwen2); o_proj never does
    sliding_window: int | None
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    torch_dtype: str  # the checkpoint's dtype: "float32" | "bfloat16" | "float16"
    architecture: str

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"unsupported architecture {self.architecture!r}; "
                f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "max_position_embeddings",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.torch_dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"unsupported torch_dtype {self.torch_dtype!r}")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window must be >= 1, got {self.sliding_window}")
        _check_rope_scaling(self.rope_scaling)

    @property
    def num_queries_per_kv(self) -> int:
        """Query heads sharing one KV head (grouped-query attention)."""
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def max_model_len(self) -> int:
        """Longest sequence (prompt + output, tokens) this model computes correctly."""
        if self.sliding_window is None:
            return self.max_position_embeddings
        return min(self.max_position_embeddings, self.sliding_window)

    def num_parameters(self) -> int:
        """Parameter count implied by the shapes (pure; counts a tied head once)."""
        h, i = self.hidden_size, self.intermediate_size
        qkv = h * (self.q_size + 2 * self.kv_size)
        if self.attention_bias:
            qkv += self.q_size + 2 * self.kv_size
        per_layer = qkv + self.q_size * h + 3 * h * i + 2 * h
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return self.vocab_size * h + self.num_hidden_layers * per_layer + h + head

    @classmethod
    def from_dir(cls, path: str | Path) -> ModelConfig:
        """Read ``config.json`` (and ``generation_config.json`` for extra EOS ids) (pure)."""
        path = Path(path)
        config_file = path / "config.json"
        if not config_file.is_file():
            raise ValueError(f"{path} is not a model directory: no config.json")
        hf = json.loads(config_file.read_text())
        gen_file = path / "generation_config.json"
        generation = json.loads(gen_file.read_text()) if gen_file.is_file() else {}
        return cls.from_dict(hf, generation)

    @classmethod
    def from_dict(cls, hf: dict[str, Any], generation: dict[str, Any] | None = None) -> ModelConfig:
        """Parse a Hugging Face config dict; raise ValueError on what we cannot run (pure)."""
        architecture = _architecture(hf)
        if hf.get("hidden_act", "silu") != "silu":
            raise ValueError(f"unsupported hidden_act {hf['hidden_act']!r}; only 'silu'")
        if hf.get("mlp_bias", False):
            raise ValueError("unsupported: mlp_bias=true")
        rope_theta, rope_scaling = _rope(hf)
        num_heads = int(hf["num_attention_heads"])
        head_dim = hf.get("head_dim") or int(hf["hidden_size"]) // num_heads
        is_qwen2 = architecture == "Qwen2ForCausalLM"
        # Qwen2 always has q/k/v biases; Llama-style configs say so with attention_bias.
        attention_bias = True if is_qwen2 else bool(hf.get("attention_bias", False))
        if is_qwen2 and not hf.get("use_sliding_window", False):
            sliding_window = None  # Qwen2 stores a window it does not use unless told to
        else:
            sliding_window = hf.get("sliding_window")
        eos = _eos_ids(hf.get("eos_token_id"), (generation or {}).get("eos_token_id"))
        return cls(
            vocab_size=int(hf["vocab_size"]),
            hidden_size=int(hf["hidden_size"]),
            intermediate_size=int(hf["intermediate_size"]),
            num_hidden_layers=int(hf["num_hidden_layers"]),
            num_attention_heads=num_heads,
            num_key_value_heads=int(hf.get("num_key_value_heads") or num_heads),
            head_dim=int(head_dim),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=int(hf.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            attention_bias=attention_bias,
            sliding_window=None if sliding_window is None else int(sliding_window),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=eos,
            torch_dtype=str(hf.get("torch_dtype") or hf.get("dtype") or "float32"),
            architecture=architecture,
        )


def _architecture(hf: dict[str, Any]) -> str:
    architectures = hf.get("architectures") or []
    if len(architectures) != 1:
        raise ValueError(f"config.json must name exactly one architecture, got {architectures}")
    return str(architectures[0])


def _rope(hf: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(theta, scaling) from either config layout; scaling None means plain RoPE."""
    params = hf.get("rope_parameters")
    if params is None:  # classic layout
        theta = float(hf.get("rope_theta", 10000.0))
        scaling = hf.get("rope_scaling")
    else:  # transformers 5: one dict holds theta and the scaling parameters
        theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    if not scaling:
        return theta, None
    scaling = dict(scaling)
    # old configs spell the key "type"; normalise to "rope_type"
    rope_type = scaling.pop("rope_type", None) or scaling.pop("type", None) or "default"
    scaling.pop("type", None)
    if rope_type == "default":
        return theta, None
    return theta, {"rope_type": rope_type, **scaling}


def _check_rope_scaling(scaling: dict[str, Any] | None) -> None:
    if scaling is None:
        return
    rope_type = scaling.get("rope_type")
    if scaling.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("unsupported: partial_rotary_factor != 1")
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"unsupported rope_scaling type {rope_type!r}; supported: "
            f"{', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    required = {
        "linear": ("factor",),
        "llama3": (
            "factor",
            "low_freq_factor",
            "high_freq_factor",
            "original_max_position_embeddings",
        ),
    }
    missing = [k for k in required.get(rope_type, ()) if k not in scaling]
    if missing:
        raise ValueError(f"rope_scaling type {rope_type!r} is missing {missing}")


def _eos_ids(*values: int | list[int] | None) -> tuple[int, ...]:
    """Union of EOS ids from config.json and generation_config.json, in first-seen order."""
    ids: list[int] = []
    for value in values:
        items = [] if value is None else value if isinstance(value, list) else [value]
        ids.extend(int(v) for v in items if int(v) not in ids)
    return tuple(ids)
