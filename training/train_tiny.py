"""Train the ``tiny`` preset: its tokenizer and weights, reproducibly, in minutes on a CPU.

    python -m eclectus.training.train_tiny            # rewrites eclectus/models/tiny/
    python -m eclectus.training.train_tiny --out DIR  # anywhere else

Builds the corpus (:mod:`.tiny_corpus`), trains the BPE tokenizer
(:mod:`eclectus.models.tiny_tokenizer`), then trains the Llama of ``PRESETS["tiny"]`` from
its seeded initialisation with AdamW on one CPU thread, and writes ``tokenizer.json`` and
``model.safetensors``; the preset's JSON files come from code
(``presets.write_preset_files``). One thread, fixed seeds, a fixed order of batches and fp32
make two runs on the same torch build give the same weights. Needs the dev extras
(transformers' ``LlamaForCausalLM`` is the training model, so what is trained is exactly
what transformers and vLLM load). Never runs at install or test time.
"""

from __future__ import annotations

import argparse
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from eclectus.models.presets import SHIPPED_DIR as TINY_DIR  # the committed files
from eclectus.models.tiny_chat import PAD_ID


@dataclass(frozen=True, slots=True)
class TrainSpec:
    """How ``tiny`` is trained (the numbers docs/models.md reports)."""

    seq_len: int = 512  # tokens per packed row; every corpus document fits in one
    batch_rows: int = 4
    steps: int = 600
    lr: float = 3e-3
    warmup_steps: int = 30
    min_lr_ratio: float = 0.05  # cosine decay ends at lr * this
    weight_decay: float = 0.01
    seed: int = 0


def pack_rows(docs_ids: list[list[int]], seq_len: int) -> torch.Tensor:
    """Documents packed in order into rows of ``seq_len`` ids, none split, PAD after the last
    one that fits: [num_rows, seq_len] int64 (pure). A document longer than a row is an error."""
    rows: list[list[int]] = [[]]
    for ids in docs_ids:
        if len(ids) > seq_len:
            raise ValueError(f"a corpus document has {len(ids)} tokens, more than {seq_len}")
        if len(rows[-1]) + len(ids) > seq_len:
            rows.append([])
        rows[-1].extend(ids)
    return torch.tensor([row + [PAD_ID] * (seq_len - len(row)) for row in rows])


def learning_rate(step: int, spec: TrainSpec) -> float:
    """Linear warm-up, then cosine decay to ``lr * min_lr_ratio`` (pure)."""
    if step < spec.warmup_steps:
        return spec.lr * (step + 1) / spec.warmup_steps
    progress = (step - spec.warmup_steps) / max(1, spec.steps - spec.warmup_steps)
    cosine = 0.5 * (1 + math.cos(math.pi * progress))
    return spec.lr * (spec.min_lr_ratio + (1 - spec.min_lr_ratio) * cosine)


def train(out_dir: Path, spec: TrainSpec, log_every: int = 50) -> dict[str, float]:
    """Train the tokenizer and the model; write both into ``out_dir`` (mutates disk).
    Returns the run's numbers (corpus size, tokens, loss, seconds)."""
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    from eclectus.models.presets import PRESETS, random_weights
    from eclectus.models.tiny_tokenizer import train_tokenizer
    from eclectus.training.tiny_corpus import build_corpus

    started = time.perf_counter()
    torch.set_num_threads(1)
    torch.manual_seed(spec.seed)
    docs = build_corpus(spec.seed)
    tokenizer = train_tokenizer(docs)
    docs_ids = [e.ids for e in tokenizer.encode_batch(docs, add_special_tokens=False)]
    rows = pack_rows(docs_ids, spec.seq_len)
    model_spec = PRESETS["tiny"]
    model = LlamaForCausalLM(LlamaConfig(**model_spec.hf_config()))
    model.load_state_dict(random_weights(model_spec))  # the same seeded start as `small`
    model.train()
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=spec.lr, betas=(0.9, 0.95), weight_decay=spec.weight_decay
    )
    order = random.Random(spec.seed)
    losses: list[float] = []
    for step in range(spec.steps):
        batch = rows[order.sample(range(len(rows)), spec.batch_rows)]
        labels = batch.masked_fill(batch == PAD_ID, -100)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, spec)
        loss = model(input_ids=batch, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        if step % log_every == 0 or step == spec.steps - 1:
            elapsed = time.perf_counter() - started
            print(f"step {step:5d}  loss {loss.item():.3f}  {elapsed:6.0f}s", flush=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    weights = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(weights, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    return {
        "corpus_bytes": sum(len(d.encode()) for d in docs),
        "corpus_docs": len(docs),
        "corpus_tokens": sum(len(ids) for ids in docs_ids),
        "rows": len(rows),
        "final_loss": sum(losses[-50:]) / len(losses[-50:]),
        "seconds": time.perf_counter() - started,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=TINY_DIR, help="where to write the files")
    parser.add_argument("--steps", type=int, default=TrainSpec().steps)
    args = parser.parse_args(argv)
    numbers = train(args.out, TrainSpec(steps=args.steps))
    for key, value in numbers.items():
        print(f"{key}: {value:.3f}" if isinstance(value, float) else f"{key}: {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
