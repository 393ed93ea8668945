"""Our Llama-family forward against transformers on the same checkpoint directories."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from transformers import (
    LlamaForCausalLM as HFLlama,
)

from eclectus.models.presets import PRESETS, write_preset_files
from eclectus.models.tokenizer import Tokenizer
from eclectus.server.engine.model import LlamaForCausalLM, load_model
from eclectus.server.engine.model_config import ModelConfig

PROMPTS = ["Hello world", "The quick brown fox jumps", "1+1=", "Ünïcödé 😀 text"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def causal_sdpa(layer_idx: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """One contiguous sequence, no cache: q [T, Hq, D], k/v [T, Hkv, D] -> [T, Hq, D]."""
    del layer_idx
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    o = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True
    )
    return o.transpose(0, 1)


def our_logits(model: LlamaForCausalLM, ids: list[int]) -> Tensor:
    hidden = model(torch.tensor(ids), torch.arange(len(ids)), causal_sdpa)
    return model.compute_logits(hidden)


@torch.no_grad()
def hf_logits(model: torch.nn.Module, ids: list[int]) -> Tensor:
    return model(torch.tensor([ids])).logits[0].float()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny")
    write_preset_files(PRESETS["tiny"], out)
    return out


@pytest.fixture(scope="module")
def tiny_pair(tiny_dir: Path) -> tuple[LlamaForCausalLM, torch.nn.Module, Tokenizer]:
    ours, _ = load_model(tiny_dir, torch.float32)
    theirs = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    return ours, theirs, Tokenizer.from_dir(tiny_dir)


def test_tiny_logits_match_transformers(tiny_pair) -> None:
    """Every position's logits agree with transformers within 1e-4 in fp32."""
    ours, theirs, tok = tiny_pair
    for prompt in PROMPTS:
        ids = tok.encode(prompt)
        torch.testing.assert_close(our_logits(ours, ids), hf_logits(theirs, ids), atol=1e-4, rtol=0)


def greedy(step_logits, ids: list[int], steps: int) -> list[int]:
    ids = list(ids)
    for _ in range(steps):
        ids.append(int(step_logits(ids)[-1].argmax()))
    return ids


def test_tiny_greedy_identical_to_transformers_for_32_steps(tiny_pair) -> None:
    """Greedy continuation (full recompute per step) is token-identical to transformers."""
    ours, theirs, tok = tiny_pair
    for prompt in PROMPTS[:2]:
        ids = tok.encode(prompt)
        mine = greedy(lambda x: our_logits(ours, x), ids, 32)
        # transformers' own greedy loop (KV cached); it stops early only at EOS
        with torch.no_grad():
            hf_ids = theirs.generate(
                torch.tensor([ids]),
                max_new_tokens=32,
                do_sample=False,
                pad_token_id=tok.eos_token_ids[0],
            )[0].tolist()
        assert mine[: len(hf_ids)] == hf_ids
        assert len(hf_ids) == len(mine) or hf_ids[-1] in tok.eos_token_ids


def test_tiny_greedy_outputs_are_not_degenerate(tiny_pair) -> None:
    """The tiny weights give prompt-dependent, varied greedy outputs."""
    ours, _, tok = tiny_pair
    outputs = [
        tuple(greedy(lambda x: our_logits(ours, x), tok.encode(p), 16)[-16:]) for p in PROMPTS
    ]
    assert len(set(outputs)) == len(PROMPTS)
    assert all(len(set(out)) >= 8 for out in outputs)  # not stuck repeating a token or two


def test_forward_batches_tokens_independently_of_position_offset(tiny_pair) -> None:
    """A decode step at position p given the cached prefix equals the full recompute."""
    ours, _, tok = tiny_pair
    ids = tok.encode("incremental decoding")
    cache: dict[int, tuple[Tensor, Tensor]] = {}

    def cached_attn(layer_idx: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        old_k, old_v = cache.get(layer_idx, (k[:0], v[:0]))
        all_k, all_v = torch.cat([old_k, k]), torch.cat([old_v, v])
        cache[layer_idx] = (all_k, all_v)
        group = q.shape[1] // k.shape[1]
        kk, vv = all_k.repeat_interleave(group, 1), all_v.repeat_interleave(group, 1)
        n_prev = old_k.shape[0]
        mask = torch.ones(q.shape[0], kk.shape[0], dtype=torch.bool).tril(n_prev)
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1), kk.transpose(0, 1), vv.transpose(0, 1), attn_mask=mask
        )
        return o.transpose(0, 1)

    n = len(ids) - 1
    ours(torch.tensor(ids[:n]), torch.arange(n), cached_attn)
    last = ours.compute_logits(ours(torch.tensor(ids[n:]), torch.tensor([n]), cached_attn))
    torch.testing.assert_close(last[0], our_logits(ours, ids)[-1], atol=1e-5, rtol=0)


def save_random(model: torch.nn.Module, out: Path, **save_kwargs) -> Path:
    """Randomise every parameter (biases too, which HF initialises to zero) and save."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(
                torch.randn(param.shape, generator=generator) * 0.05
                + (1.0 if param.ndim == 1 and "norm" in _name_of(model, param) else 0.0)
            )
    model.save_pretrained(out, **save_kwargs)
    return out


def _name_of(model: torch.nn.Module, param: torch.nn.Parameter) -> str:
    return next(n for n, p in model.named_parameters() if p is param)


SMALL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=128,
    max_position_embeddings=1024,
)


def check_against_transformers(path: Path, num_tokens: int, atol: float = 1e-4) -> None:
    ids = torch.randint(0, 128, (num_tokens,), generator=torch.Generator().manual_seed(2)).tolist()
    ours, config = load_model(path, torch.float32)
    theirs = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    num_params = config.num_parameters()
    assert num_params == sum(p.numel() for p in ours.parameters())
    assert num_params == sum(p.numel() for p in theirs.parameters())  # tied: counted once
    torch.testing.assert_close(our_logits(ours, ids), hf_logits(theirs, ids), atol=atol, rtol=0)


def test_qwen2_bias_tied_embeddings_sharded(tmp_path: Path) -> None:
    """Qwen2 (q/k/v biases, tied head) saved as several shards matches transformers."""
    config = Qwen2Config(**SMALL, tie_word_embeddings=True)
    path = save_random(Qwen2ForCausalLM(config), tmp_path, max_shard_size="100KB")
    assert (path / "model.safetensors.index.json").is_file()
    parsed = ModelConfig.from_dir(path)
    assert parsed.attention_bias and parsed.tie_word_embeddings and parsed.sliding_window is None
    check_against_transformers(path, 24)


@pytest.mark.parametrize(
    "rope",
    [
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 256,
        },
        {"rope_type": "linear", "factor": 4.0},
    ],
)
def test_llama_rope_scaling_matches_transformers(tmp_path: Path, rope: dict) -> None:
    """Scaled RoPE variants agree with transformers over 300 positions."""
    config = LlamaConfig(**SMALL, head_dim=16, rope_parameters={"rope_theta": 10000.0, **rope})
    path = save_random(HFLlama(config), tmp_path)
    assert ModelConfig.from_dir(path).rope_scaling["rope_type"] == rope["rope_type"]
    check_against_transformers(path, 300)


def test_classic_rope_scaling_layout_is_read(tmp_path: Path) -> None:
    """Older config.json files spell scaling as rope_theta + rope_scaling {"type": ...}."""
    config = LlamaConfig(**SMALL)
    path = save_random(HFLlama(config), tmp_path)
    raw = json.loads((path / "config.json").read_text())
    raw.pop("rope_parameters", None)
    raw |= {"rope_theta": 500000.0, "rope_scaling": {"type": "linear", "factor": 2.0}}
    parsed = ModelConfig.from_dict(raw)
    assert parsed.rope_theta == 500000.0
    assert parsed.rope_scaling == {"rope_type": "linear", "factor": 2.0}


def test_mistral_sliding_window_refuses_long_sequences(tmp_path: Path) -> None:
    """Within the window Mistral matches transformers; beyond it we raise, not miscompute."""
    config = MistralConfig(**SMALL, sliding_window=32)
    path = save_random(MistralForCausalLM(config), tmp_path)
    check_against_transformers(path, 32)
    ours, parsed = load_model(path, torch.float32)
    assert parsed.max_model_len == 32
    with pytest.raises(ValueError, match="sliding_window"):
        our_logits(ours, list(range(33)))


def test_bf16_load_is_close_to_fp32(tiny_pair, tiny_dir: Path) -> None:
    """bf16 weights and activations: same shapes, fp32 logits close to the fp32 model's."""
    ours32, _, tok = tiny_pair
    ours16, _ = load_model(tiny_dir, "bfloat16")
    assert ours16.model.layers[0].self_attn.qkv_proj.weight.dtype == torch.bfloat16
    ids = tok.encode(PROMPTS[1])
    logits16 = our_logits(ours16, ids)
    assert logits16.dtype == torch.float32
    torch.testing.assert_close(logits16, our_logits(ours32, ids), atol=0.05, rtol=0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"architectures": ["GPT2LMHeadModel"]}, "unsupported architecture"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "unsupported rope_scaling"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"num_key_value_heads": 3}, "multiple of"),
    ],
)
def test_config_rejects_what_we_cannot_run(tiny_dir: Path, change: dict, message: str) -> None:
    raw = json.loads((tiny_dir / "config.json").read_text()) | change
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_dict(raw)


def test_missing_tensor_is_an_error(tmp_path: Path) -> None:
    """A checkpoint that does not fill every parameter fails to load."""
    from safetensors.torch import load_file, save_file

    write_preset_files(PRESETS["tiny"], tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    del tensors["model.layers.1.self_attn.k_proj.weight"]
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"layers\.1\.self_attn\.qkv_proj"):
        load_model(tmp_path)


def test_forward_with_rows_computes_those_rows_of_the_full_forward(tiny_pair) -> None:
    """``rows``: the last layer's output for those rows only, in the order given, equal to
    the same rows of the full forward; every token's K/V still reaches the attention."""
    ours, _, tok = tiny_pair
    ids = tok.encode("only the rows that sample get logits")
    seen: list[int] = []

    def rows_attn(layer_idx: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        seen.append(k.shape[0])
        if q.shape[0] == k.shape[0]:
            return causal_sdpa(layer_idx, q, k, v)
        # the last layer: query row r at position rows[r] over keys 0..rows[r]
        return torch.stack([causal_sdpa(layer_idx, q_full, k, v)[r] for r in rows.tolist()])

    full = ours(torch.tensor(ids), torch.arange(len(ids)), causal_sdpa)
    rows = torch.tensor([len(ids) - 1, 3, 0])
    q_full = torch.empty(0)

    def capture(layer_idx: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        nonlocal q_full
        if layer_idx == ours.config.num_hidden_layers - 1 and q.shape[0] == k.shape[0]:
            q_full = q
        return causal_sdpa(layer_idx, q, k, v)

    ours(torch.tensor(ids), torch.arange(len(ids)), capture)  # the last layer's full queries
    got = ours(torch.tensor(ids), torch.arange(len(ids)), rows_attn, rows)
    assert got.shape == (3, ours.config.hidden_size)
    assert seen == [len(ids)] * ours.config.num_hidden_layers
    torch.testing.assert_close(got, full[rows], atol=1e-5, rtol=0)


def test_cpu_projections_are_column_major_and_compute_what_row_major_does(tiny_dir: Path) -> None:
    """On a CPU every projection's weight is stored column-major (weight.t() is a contiguous
    row-major matrix for the GEMM); the logits are the ones of the checkpoint's row-major
    layout, and switching the layout back and forth keeps every value."""
    model, _ = load_model(tiny_dir, torch.float32)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 4 * model.config.num_hidden_layers + 1  # and the LM head
    assert all(m.weight.t().is_contiguous() and not m.weight.is_contiguous() for m in linears)
    ids = list(range(3, 40))
    column_major = our_logits(model, ids)
    weights = [m.weight.clone() for m in linears]
    model.set_column_major_weights(False)
    assert all(m.weight.is_contiguous() for m in linears)
    assert all(torch.equal(m.weight, w) for m, w in zip(linears, weights, strict=True))
    torch.testing.assert_close(our_logits(model, ids), column_major, atol=1e-5, rtol=0)
    model.set_column_major_weights(True)
    assert all(m.weight.t().is_contiguous() for m in linears)
    assert torch.equal(our_logits(model, ids), column_major)


def test_layer_weights_follow_the_parameters(tiny_dir: Path) -> None:
    """The forward's per-layer tensors are the modules' parameters themselves (a load into
    them is seen), and replacing the parameters (a layout switch, a dtype conversion)
    rebuilds them."""
    model, _ = load_model(tiny_dir, torch.float32)
    first = model.layer_weights()
    assert first[0].qkv is model.model.layers[0].self_attn.qkv_proj.weight
    assert [w.layer_idx for w in first] == list(range(model.config.num_hidden_layers))
    model.set_column_major_weights(False)
    assert model.layer_weights()[0].qkv is model.model.layers[0].self_attn.qkv_proj.weight
    model.to(torch.float64)
    assert model.layer_weights()[0].down.dtype == torch.float64
