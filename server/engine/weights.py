"""Read a HF checkpoint's safetensors (single file or sharded) into :class:`LlamaForCausalLM`.

HF names map to ours one to one except the fused projections: ``q_proj``/``k_proj``/``v_proj``
fill row slices of ``qkv_proj`` and ``gate_proj``/``up_proj`` fill ``gate_up_proj``. Every
parameter must be filled exactly, so a checkpoint with missing or misshapen tensors fails here
rather than producing a model with uninitialised memory.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor

from eclectus.server.engine.model import LlamaForCausalLM

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


def checkpoint_files(model_dir: Path) -> list[Path]:
    """The safetensors files of a checkpoint, from the shard index when there is one (pure)."""
    index = model_dir / INDEX_FILE
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        return [model_dir / name for name in sorted(set(weight_map.values()))]
    if (model_dir / SINGLE_FILE).is_file():
        return [model_dir / SINGLE_FILE]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ValueError(
            f"no safetensors weights in {model_dir} (pytorch_model.bin is not supported; "
            "convert it with transformers' save_pretrained(safe_serialization=True))"
        )
    return files


def iter_tensors(model_dir: Path) -> Iterator[tuple[str, Tensor]]:
    """Yield (HF name, CPU tensor) for every tensor of the checkpoint (pure; reads files)."""
    for file in checkpoint_files(model_dir):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                yield name, f.get_tensor(name)


def _target(model: LlamaForCausalLM, name: str) -> tuple[str, int] | None:
    """(our parameter name, row offset) for a HF tensor name; None for tensors we skip."""
    config = model.config
    if name.endswith("rotary_emb.inv_freq"):
        return None  # recomputed from the config
    if name == "lm_head.weight" and config.tie_word_embeddings:
        return None  # some tied checkpoints store a copy; we use the embedding
    q, kv, inter = config.q_size, config.kv_size, config.intermediate_size
    fused = {
        ".self_attn.q_proj.": (".self_attn.qkv_proj.", 0),
        ".self_attn.k_proj.": (".self_attn.qkv_proj.", q),
        ".self_attn.v_proj.": (".self_attn.qkv_proj.", q + kv),
        ".mlp.gate_proj.": (".mlp.gate_up_proj.", 0),
        ".mlp.up_proj.": (".mlp.gate_up_proj.", inter),
    }
    for hf_part, (our_part, offset) in fused.items():
        if hf_part in name:
            return name.replace(hf_part, our_part), offset
    return name, 0


@torch.no_grad()
def load_weights(model: LlamaForCausalLM, model_dir: Path) -> None:
    """Copy the checkpoint in ``model_dir`` into ``model`` (mutates the model's parameters),
    converting to the model's dtype and device. Raises ValueError on unknown, misshapen or
    missing tensors."""
    params = dict(model.named_parameters())
    rows_filled = dict.fromkeys(params, 0)
    for name, tensor in iter_tensors(Path(model_dir)):
        target = _target(model, name)
        if target is None:
            continue
        param_name, offset = target
        if param_name not in params:
            raise ValueError(f"checkpoint tensor {name!r} has no place in the model")
        param = params[param_name]
        rows = tensor.shape[0]
        if offset + rows > param.shape[0] or tuple(tensor.shape[1:]) != tuple(param.shape[1:]):
            raise ValueError(
                f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}, which does not "
                f"fit {param_name} {tuple(param.shape)} at row {offset}"
            )
        param.data[offset : offset + rows].copy_(tensor)
        rows_filled[param_name] += rows
    missing = [n for n, rows in rows_filled.items() if rows != params[n].shape[0]]
    if missing:
        raise ValueError(f"checkpoint in {model_dir} does not fill: {missing}")
