"""Built-in presets: cache materialisation, determinism, export and the `model` CLI."""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from eclectus.models import presets
from eclectus.models.presets import (
    MODEL_FILES,
    PRESET_NOTES,
    PRESETS,
    cache_dir,
    export_model,
    materialize,
    resolve_model_dir,
)
from eclectus.models.tiny_chat import BOS_ID
from eclectus.server.engine.model_config import ModelConfig

REPO = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("ECLECTUS_CACHE", str(root))
    return root


def digest(directory: Path) -> dict[str, str]:
    return {f: hashlib.sha256((directory / f).read_bytes()).hexdigest() for f in MODEL_FILES}


def test_cache_dir_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """$ECLECTUS_CACHE, else $XDG_CACHE_HOME/eclectus, else ~/.cache/eclectus."""
    monkeypatch.setenv("ECLECTUS_CACHE", str(tmp_path / "a"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert cache_dir() == tmp_path / "a"
    monkeypatch.delenv("ECLECTUS_CACHE")
    assert cache_dir() == tmp_path / "x" / "eclectus"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "eclectus"


def test_materialize_is_idempotent(cache: Path) -> None:
    """The second call finds the directory and rewrites nothing."""
    first = materialize("tiny")
    assert first.parent == cache / "models" and sorted(os.listdir(first)) == sorted(MODEL_FILES)
    assert first.stat().st_mode & 0o777 == 0o755  # a shared cache stays readable
    assert all((first / f).stat().st_mode & 0o777 == 0o644 for f in MODEL_FILES)
    stamps = {f: (first / f).stat().st_mtime_ns for f in MODEL_FILES}
    before = digest(first)
    assert resolve_model_dir("tiny") == first
    assert {f: (first / f).stat().st_mtime_ns for f in MODEL_FILES} == stamps
    assert digest(first) == before


def test_materialize_is_deterministic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two independent caches hold byte-identical files (fixed seed, sorted JSON)."""
    monkeypatch.setenv("ECLECTUS_CACHE", str(tmp_path / "one"))
    one = digest(materialize("tiny"))
    monkeypatch.setenv("ECLECTUS_CACHE", str(tmp_path / "two"))
    assert digest(materialize("tiny")) == one


def test_concurrent_materialize_leaves_one_complete_dir(cache: Path) -> None:
    """Racing builders all return the same complete directory; no temp dirs remain."""
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(materialize("tiny"))) for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results)) == 1 and len(results) == 3
    assert os.listdir(cache / "models") == [results[0].name]
    assert sorted(os.listdir(results[0])) == sorted(MODEL_FILES)


def test_tiny_matches_its_spec(cache: Path) -> None:
    config = ModelConfig.from_dir(materialize("tiny"))
    assert (
        config.hidden_size,
        config.num_hidden_layers,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
    ) == (128, 4, 4, 2, 64)
    assert config.max_position_embeddings >= 4096 and config.vocab_size % 64 == 0


def test_small_is_about_100m_parameters() -> None:
    """Checked from the spec alone: building it writes ~400 MB, too much for every run."""
    config = ModelConfig.from_dict(PRESETS["small"].hf_config())
    assert 90e6 < config.num_parameters() < 110e6
    assert config.head_dim == 64 and config.num_queries_per_kv == 3


def test_random_weights_param_count_matches_config() -> None:
    spec = PRESETS["tiny"]
    count = sum(t.numel() for t in presets.random_weights(spec).values())
    assert count == ModelConfig.from_dict(spec.hf_config()).num_parameters()


def test_changed_spec_gets_a_new_cache_dir() -> None:
    spec = PRESETS["tiny"]
    assert dataclasses.replace(spec, seed=1).cache_key != spec.cache_key
    assert dataclasses.replace(spec).cache_key == spec.cache_key


def test_retrained_files_get_a_new_cache_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key hashes the shipped files a preset copies: new weights, new directory (and
    none for a random-weight preset, which does not copy them)."""
    trained, untrained = PRESETS["tiny"], dataclasses.replace(PRESETS["tiny"], trained=False)
    keys = trained.cache_key, untrained.cache_key
    retrained = tmp_path / "model.safetensors"
    retrained.write_bytes(presets.SHIPPED_WEIGHTS.read_bytes() + b" ")
    monkeypatch.setattr(presets, "SHIPPED_WEIGHTS", retrained)
    assert trained.cache_key != keys[0] and untrained.cache_key == keys[1]


def test_tiny_is_the_shipped_trained_model(cache: Path) -> None:
    """tiny copies the committed weights and tokenizer; small draws random weights."""
    path = materialize("tiny")
    assert (path / "model.safetensors").read_bytes() == presets.SHIPPED_WEIGHTS.read_bytes()
    assert (path / "tokenizer.json").read_bytes() == presets.SHIPPED_TOKENIZER.read_bytes()
    assert PRESETS["tiny"].trained and not PRESETS["small"].trained


def test_resolve_model_dir(cache: Path, tmp_path: Path) -> None:
    """A directory resolves to itself; an unknown name is a clear error, never a download."""
    assert resolve_model_dir(str(tmp_path)) == tmp_path
    with pytest.raises(ValueError, match="nothing is ever downloaded"):
        resolve_model_dir("meta-llama/Llama-3-8B")
    assert not (cache / "models").exists()


def test_export_writes_a_loadable_hf_directory(cache: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    out = export_model("tiny", tmp_path / "out")
    assert digest(out) == digest(materialize("tiny"))
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert model.config.num_hidden_layers == 4
    assert json.loads((out / "tokenizer_config.json").read_text())["chat_template"]


def test_model_subcommand_via_add_arguments(
    cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser()
    presets.add_arguments(parser)
    args = parser.parse_args(["export", "tiny", str(tmp_path / "x")])
    assert presets.run(args) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "x")
    assert sorted(os.listdir(tmp_path / "x")) == sorted(MODEL_FILES)
    assert presets.run(parser.parse_args(["path", "tiny"])) == 0
    assert capsys.readouterr().out.strip() == str(materialize("tiny"))


def _cli_modules_present() -> bool:
    # eclectus/cli.py imports every subcommand's module to build its parser
    from eclectus.cli import SUBCOMMANDS

    return all(importlib.util.find_spec(module) for module, _ in SUBCOMMANDS.values())


@pytest.mark.skipif(not _cli_modules_present(), reason="other CLI subcommand modules missing")
def test_python_m_eclectus_model_export(cache: Path, tmp_path: Path) -> None:
    out = tmp_path / "x"
    env = {**os.environ, "ECLECTUS_CACHE": str(cache)}
    done = subprocess.run(
        [sys.executable, "-m", "eclectus", "model", "export", "tiny", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(out)) == sorted(MODEL_FILES)


@pytest.mark.slow
def test_small_materializes_and_matches_transformers(cache: Path) -> None:
    """The one 100M forward of the suite: 8 tokens through ours and transformers."""
    from transformers import AutoModelForCausalLM

    from eclectus.server.engine.model import load_model

    path = materialize("small")
    ours, config = load_model(path)
    assert config.num_parameters() == sum(p.numel() for p in ours.parameters())
    ids = torch.tensor([BOS_ID, 72, 101, 108, 108, 111, 33, 10])
    hidden = ours(ids, torch.arange(8), _causal_attention)
    theirs = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = theirs(ids[None]).logits[0]
    torch.testing.assert_close(ours.compute_logits(hidden), expected, atol=1e-4, rtol=0)


def _causal_attention(
    layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> torch.Tensor:
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    return torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True
    ).transpose(0, 1)


MODELS_MD = Path(__file__).parents[2] / "docs" / "models.md"


def test_what_the_commands_say_of_a_preset_is_docs_models_md() -> None:
    """The line ``eclectus demo`` and the ``eclectus run`` report print about each preset
    is a line of docs/models.md's Presets section, and it agrees with the description
    there: tiny is trained (not random weights), small is random."""
    text = MODELS_MD.read_text()
    presets_section = text[text.index("## Presets") : text.index("### How `tiny` was trained")]
    assert set(PRESET_NOTES) == set(PRESETS)
    for note in PRESET_NOTES.values():
        assert f"\n- {note}\n" in presets_section
    assert "**`tiny` is trained**" in presets_section
    assert "**`small` has random weights**" in presets_section
    assert "trained" in PRESET_NOTES["tiny"] and "random" not in PRESET_NOTES["tiny"]
    assert "random weights" in PRESET_NOTES["small"]
