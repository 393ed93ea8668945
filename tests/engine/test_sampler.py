"""The batch sampler: greedy, filters, and per-request seeds independent of the batch."""

from __future__ import annotations

import torch
from eclectus.server.engine.sampler import Sampler
from eclectus.server.engine.sampling_params import SamplingParams

VOCAB = 50


def logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_is_argmax() -> None:
    x = logits(4)
    assert Sampler()(x, [SamplingParams()] * 4, [None] * 4) == x.argmax(-1).tolist()


def test_top_k_one_equals_greedy_at_any_temperature() -> None:
    x = logits(6)
    params = [SamplingParams(temperature=2.0, top_k=1)] * 6
    assert Sampler(seed=3)(x, params, [None] * 6) == x.argmax(-1).tolist()


def test_seeded_rows_ignore_batch_composition() -> None:
    x = logits(5, seed=1)
    params = SamplingParams(temperature=1.0, seed=7)
    sampler = Sampler()

    def draw(batch: torch.Tensor, row: int, mates: int) -> list[int]:
        gen = sampler.new_generator(7)
        out = []
        for _ in range(20):
            ps = [SamplingParams(temperature=0.8)] * mates + [params]
            gens = [None] * mates + [gen]
            out.append(sampler(torch.cat([batch[:mates], batch[row : row + 1]]), ps, gens)[-1])
        return out

    alone = draw(x, 4, 0)
    assert alone == draw(x, 4, 3) == draw(x, 4, 1)
    assert len(set(alone)) > 1  # really sampling


def test_top_k_and_top_p_restrict_support() -> None:
    x = logits(1, seed=2).expand(400, VOCAB).contiguous()
    top3 = set(x[0].topk(3).indices.tolist())
    got = Sampler(seed=1)(x, [SamplingParams(temperature=1.0, top_k=3)] * 400, [None] * 400)
    assert set(got) == top3
    probs = x[0].softmax(-1)
    order = probs.argsort(descending=True)
    nucleus = set(order[: int((probs[order].cumsum(0) < 0.5).sum()) + 1].tolist())
    got = Sampler(seed=2)(x, [SamplingParams(temperature=1.0, top_p=0.5)] * 400, [None] * 400)
    assert set(got) == nucleus


def test_sampling_follows_probabilities() -> None:
    x = torch.tensor([[0.0, 1.0, 2.0]]).expand(6000, 3).contiguous()
    got = torch.tensor(Sampler(seed=0)(x, [SamplingParams(temperature=1.0)] * 6000, [None] * 6000))
    freq = torch.bincount(got, minlength=3).float() / 6000
    assert torch.allclose(freq, x[0].softmax(-1), atol=0.03)


def test_mixed_batch_keeps_greedy_rows_greedy() -> None:
    x = logits(4, seed=5)
    params = [
        SamplingParams(),
        SamplingParams(temperature=1.0),
        SamplingParams(),
        SamplingParams(temperature=1.0, seed=1),
    ]
    out = Sampler()(x, params, [None, None, None, torch.Generator().manual_seed(1)])
    assert out[0] == x[0].argmax() and out[2] == x[2].argmax()
