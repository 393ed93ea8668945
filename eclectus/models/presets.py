"""Built-in models: Llama checkpoints written once as real HF directories.

``tiny`` (~1.5M parameters) is the default everywhere a model is needed without a download:
its weights were trained by ``train_tiny`` on a small generated corpus and ship with the
package (``eclectus/models/tiny/``), so it writes short English-like text, JSON and tool calls.
``small`` (~100M) has random weights from a seeded ``torch.Generator`` and gives realistic CPU
timings. Both use the shipped BPE tokenizer (``tiny/tokenizer.json``) and chat template.

Each is materialised on first use under the cache directory — ``$ECLECTUS_CACHE``, else
``$XDG_CACHE_HOME/eclectus``, else ``~/.cache/eclectus`` — in ``models/<name>-<key>``, where
``key`` hashes the preset's spec, the file format and the shipped files it uses, so a changed
preset never reuses stale files. The directory is built in a temporary sibling and renamed
into place, so concurrent processes are safe: the first rename wins, the others discard
their copy. Every machine builds byte-identical files, which transformers and vLLM load as
they are.

    eclectus model export tiny DIR     writes the preset's files into DIR
    eclectus model path tiny           prints the materialised cache directory
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from eclectus.cache import cache_dir
from eclectus.models.tiny_chat import BOS_ID, EOS_ID, PAD_ID

SHIPPED_DIR = Path(__file__).resolve().parent / "tiny"  # package data, written by train_tiny
SHIPPED_TOKENIZER = SHIPPED_DIR / "tokenizer.json"
SHIPPED_WEIGHTS = SHIPPED_DIR / "model.safetensors"

# What a preset's text is, in one line, for the commands that print it (``eclectus demo``,
# ``eclectus run``); docs/models.md states each line (tests/engine/test_presets.py holds it)
PRESET_NOTES = {
    "tiny": (
        "`tiny` is trained on a small made-up corpus: it writes short English-like "
        "sentences, JSON and tool calls, but its facts are the corpus's, not the prompt's"
    ),
    "small": "`small` has random weights: its text is gibberish, its compute is real",
}

FORMAT_VERSION = 2  # bump when the files written for a preset change
MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)


@dataclass(frozen=True, slots=True)
class PresetSpec:
    """The shape of a built-in model (Llama architecture, the shipped BPE tokenizer), and
    where its weights come from: the shipped trained file, or a seeded generator."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int = 64
    vocab_size: int = 2048  # the shipped tokenizer's, a multiple of 64
    max_position_embeddings: int = 4096
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    init_std: float = 0.02  # HF's initializer_range, for every projection
    # A larger embedding keeps each token's identity visible in the residual stream; at 0.02
    # the (near-uniform) attention average dominates and greedy decoding locks onto one
    # repeated token within a few steps. 0.3 gives varied, prompt-dependent continuations.
    embed_std: float = 0.3
    seed: int = 0
    trained: bool = False  # True: the weights are SHIPPED_WEIGHTS, not random

    def hf_config(self) -> dict[str, Any]:
        """config.json contents, in the classic layout both transformers and vLLM read."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": None,
            "attention_bias": False,
            "attention_dropout": 0.0,
            "mlp_bias": False,
            "tie_word_embeddings": False,
            "initializer_range": self.init_std,
            "bos_token_id": BOS_ID,
            "eos_token_id": EOS_ID,
            "pad_token_id": PAD_ID,
            "torch_dtype": "float32",
            "use_cache": True,
        }

    @property
    def cache_key(self) -> str:
        """Short hash of the spec, FORMAT_VERSION and the shipped files the preset copies
        (pure: reads them), so retrained files never meet a stale cache."""
        shipped = [SHIPPED_TOKENIZER, *([SHIPPED_WEIGHTS] if self.trained else [])]
        files = {p.name: _file_digest(p) for p in shipped}
        blob = json.dumps(
            {"format": FORMAT_VERSION, "files": files, **asdict(self)}, sort_keys=True
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


PRESETS: dict[str, PresetSpec] = {
    # ~1.5M parameters, trained (train_tiny.py). Heads of 64 as in real models (4 query heads,
    # so q/o project 128 <-> 256); MLP 3x hidden.
    "tiny": PresetSpec(
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        trained=True,
    ),
    # ~107M parameters, random
    "small": PresetSpec(
        hidden_size=768,
        intermediate_size=3072,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=4,
    ),
}


def preset_dir(name: str) -> Path:
    """Where preset ``name`` is (or will be) materialised; does not create it (pure)."""
    return cache_dir() / "models" / f"{name}-{_spec(name).cache_key}"


def resolve_model_dir(name_or_path: str) -> Path:
    """A preset name -> its materialised directory (built on first use: mutates the cache);
    an existing directory -> itself. Anything else raises ValueError."""
    if name_or_path in PRESETS:
        return materialize(name_or_path)
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    raise ValueError(
        f"model {name_or_path!r} is neither a preset ({', '.join(PRESETS)}) nor a directory; "
        "nothing is ever downloaded: pass a local Hugging Face checkpoint directory"
    )


def materialize(name: str) -> Path:
    """Build preset ``name`` in the cache unless it is there (mutates the cache); its dir."""
    final = preset_dir(name)
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        write_preset_files(_spec(name), tmp)
        _make_readable(tmp)
        os.rename(tmp, final)  # atomic; fails if another process renamed first
    except OSError:
        if not final.is_dir():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone after a successful rename
    return final


def export_model(name: str, out_dir: Path) -> Path:
    """Copy preset ``name``'s files into ``out_dir`` (created; existing files overwritten)."""
    source = materialize(name)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for file in MODEL_FILES:
        shutil.copyfile(source / file, out_dir / file)
    return out_dir


def write_preset_files(spec: PresetSpec, out_dir: Path) -> None:
    """Write the five HF files of ``spec`` into the existing ``out_dir`` (mutates disk): the
    JSON files from code, the shipped tokenizer, the shipped or the seeded random weights."""
    from safetensors.torch import save_file

    from eclectus.models.tiny_tokenizer import tokenizer_config

    generation = {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID}
    _write_json(out_dir / "config.json", spec.hf_config())
    _write_json(out_dir / "generation_config.json", generation)
    _write_json(out_dir / "tokenizer_config.json", tokenizer_config(spec.max_position_embeddings))
    shutil.copyfile(SHIPPED_TOKENIZER, out_dir / "tokenizer.json")
    if spec.trained:
        shutil.copyfile(SHIPPED_WEIGHTS, out_dir / "model.safetensors")
    else:
        weights = random_weights(spec)
        save_file(weights, str(out_dir / "model.safetensors"), metadata={"format": "pt"})


def random_weights(spec: PresetSpec) -> dict[str, Any]:
    """HF-named fp32 tensors: N(0, init_std) projections, N(0, embed_std) embeddings and unit
    norms, drawn in a fixed order from one seeded generator, so the result depends on
    ``spec`` only (pure)."""
    import torch

    generator = torch.Generator().manual_seed(spec.seed)
    h, q, kv = (
        spec.hidden_size,
        spec.num_attention_heads * spec.head_dim,
        spec.num_key_value_heads * spec.head_dim,
    )

    def normal(*shape: int, std: float = spec.init_std) -> torch.Tensor:
        return torch.randn(shape, generator=generator) * std

    tensors = {"model.embed_tokens.weight": normal(spec.vocab_size, h, std=spec.embed_std)}
    for i in range(spec.num_hidden_layers):
        p = f"model.layers.{i}."
        tensors |= {
            p + "self_attn.q_proj.weight": normal(q, h),
            p + "self_attn.k_proj.weight": normal(kv, h),
            p + "self_attn.v_proj.weight": normal(kv, h),
            p + "self_attn.o_proj.weight": normal(h, q),
            p + "mlp.gate_proj.weight": normal(spec.intermediate_size, h),
            p + "mlp.up_proj.weight": normal(spec.intermediate_size, h),
            p + "mlp.down_proj.weight": normal(h, spec.intermediate_size),
            p + "input_layernorm.weight": torch.ones(h),
            p + "post_attention_layernorm.weight": torch.ones(h),
        }
    tensors["model.norm.weight"] = torch.ones(h)
    tensors["lm_head.weight"] = normal(spec.vocab_size, h)
    return tensors


def _make_readable(directory: Path) -> None:
    """Make the folder 0755 and its files 0644 (mutates disk): mkdtemp makes the folder 0700
    and safetensors writes 0600, which would hide a shared cache. (Fixed modes rather than
    the umask: reading the umask means setting it, which races with other threads.)"""
    directory.chmod(0o755)
    for file in directory.iterdir():
        file.chmod(0o644)


@functools.cache
def _file_digest(path: Path) -> str:
    """sha256 of a shipped file (read once per process: the package does not change)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _spec(name: str) -> PresetSpec:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")
    return PRESETS[name]


def _write_json(path: Path, value: dict[str, Any]) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`eclectus model {export,path}` (mutates ``parser``)."""
    sub = parser.add_subparsers(dest="model_command", required=True)
    export = sub.add_parser("export", help="write a built-in model as a HF directory")
    export.add_argument("name", choices=sorted(PRESETS))
    export.add_argument("out_dir", type=Path)
    path = sub.add_parser("path", help="print a built-in model's cache directory")
    path.add_argument("name", choices=sorted(PRESETS))


def run(args: argparse.Namespace) -> int:
    """Run the chosen `model` subcommand; prints the directory it wrote or found."""
    if args.model_command == "export":
        print(export_model(args.name, args.out_dir))
    else:
        print(materialize(args.name))
    return 0
