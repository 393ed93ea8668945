"""The batch sampler: greedy, filters, and per-request seeds independent of the batch."""

from __future__ import annotations

import pytest
import torch

from eclectus.protocol.sampling import SamplingParams
from eclectus.server.engine import LLM, EngineConfig
from eclectus.server.engine.sampler import Sampler

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


def test_unfiltered_rows_follow_probabilities_without_the_sort() -> None:
    """No top-k / top-p: the draw skips the sort and still follows the softmax, and an id
    masked to zero probability is never drawn (nor is id 0 for a draw of 0)."""
    x = torch.tensor([[-torch.inf, 0.0, -torch.inf, 1.0, 2.0, -torch.inf]]).expand(6000, 6)
    got = torch.tensor(
        Sampler(seed=0)(x.contiguous(), [SamplingParams(temperature=1.0)] * 6000, [None] * 6000)
    )
    freq = torch.bincount(got, minlength=6).float() / 6000
    assert torch.allclose(freq, x[0].softmax(-1), atol=0.03)
    assert set(got.tolist()) == {1, 3, 4}
    sampler = Sampler()
    sampler._uniforms = lambda n, gens: torch.zeros(n)  # type: ignore[method-assign]
    assert sampler(x[:1].contiguous(), [SamplingParams(temperature=1.0)], [None]) == [1]


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


# ---- through the engine -------------------------------------------------------------------

MiB = 1 << 20


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(config=EngineConfig(model="tiny", kv_cache_bytes=16 * MiB))


def test_seeded_request_reproducible_in_any_batch(llm: LLM) -> None:
    seeded = SamplingParams(max_tokens=16, temperature=1.0, seed=1234, ignore_eos=True)
    (alone,) = llm.generate(["Once upon a time"], seeded)
    mates = [
        SamplingParams(max_tokens=20, temperature=0.7),
        SamplingParams(max_tokens=5),
        SamplingParams(max_tokens=16, temperature=1.0, seed=99),
    ]
    outs = llm.generate(
        ["Hello", "Once upon a time", "Bye", "Once upon a time, long ago"],
        [mates[0], seeded, mates[1], mates[2]],
    )
    assert outs[1].token_ids == alone.token_ids
    assert outs[3].token_ids != alone.token_ids  # a different seed really differs


def test_top_k_one_matches_greedy(llm: LLM) -> None:
    greedy, top1 = llm.generate(
        ["The cat", "The cat"],
        [SamplingParams(max_tokens=12), SamplingParams(max_tokens=12, temperature=1.5, top_k=1)],
    )
    assert top1.token_ids == greedy.token_ids


def test_max_tokens_and_stop_token_ids(llm: LLM) -> None:
    (full,) = llm.generate(["Count: "], SamplingParams(max_tokens=10, ignore_eos=True))
    assert len(full.token_ids) == 10 and full.finish_reason == "length"
    stop_id = full.token_ids[4]
    (cut,) = llm.generate(["Count: "], SamplingParams(max_tokens=10, stop_token_ids=(stop_id,)))
    k = full.token_ids.index(stop_id)
    assert cut.finish_reason == "stop" and cut.token_ids == full.token_ids[: k + 1]
    assert cut.text == llm.tokenizer.decode(full.token_ids[:k])  # the stop token adds no text


def test_stop_string_cut_from_text(llm: LLM) -> None:
    (full,) = llm.generate(["Story: "], SamplingParams(max_tokens=20, ignore_eos=True))
    stop = full.text[5:7]
    (cut,) = llm.generate(["Story: "], SamplingParams(max_tokens=20, stop=(stop,)))
    assert cut.finish_reason == "stop"
    assert cut.text == full.text[: full.text.index(stop)]


def test_ignore_eos_generates_past_eos(llm: LLM) -> None:
    eos = llm.tokenizer.eos_token_ids[0]
    # the trained tiny ends a text with EOS: sampled at temperature 1, within ~50 tokens
    hot = SamplingParams(max_tokens=3000, temperature=1.0, seed=5)
    (stopped,) = llm.generate(["x"], hot)
    assert stopped.finish_reason == "stop" and stopped.token_ids[-1] == eos
    k = len(stopped.token_ids)
    (going,) = llm.generate(
        ["x"], SamplingParams(max_tokens=k + 5, temperature=1.0, seed=5, ignore_eos=True)
    )
    assert going.finish_reason == "length" and len(going.token_ids) == k + 5
    assert going.token_ids[:k] == stopped.token_ids


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_an_all_sampled_batch_draws_what_it_draws_beside_a_greedy_row(temperature: float) -> None:
    """The all-sampled path (no argmax, no row gather, no division at temperature 1) gives
    each seeded row the token the general path gives it next to a greedy row."""
    x = logits(6, seed=5)
    sampled = [SamplingParams(temperature=temperature, seed=s) for s in range(6)]
    sampler = Sampler()
    for _ in range(10):
        alone = sampler(x, sampled, [sampler.new_generator(s) for s in range(6)])
        mixed = sampler(
            torch.cat([x[:1], x]),
            [SamplingParams(temperature=0.0), *sampled],
            [None, *(sampler.new_generator(s) for s in range(6))],
        )
        assert mixed[0] == int(x[0].argmax()) and mixed[1:] == alone
