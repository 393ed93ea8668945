"""The sync core on the real tiny model: pins, tenants, priorities, and counters."""

from __future__ import annotations

from dataclasses import fields

import pytest
from engine_helpers import TOKENIZER, prompt_request
from hypothesis import given, settings
from hypothesis import strategies as st

from eclectus.server.backend import EngineOutput, EngineRequest
from eclectus.server.engine import EngineConfig, LLMEngine, SamplingParams
from eclectus.server.engine.llm_engine import Counters

HELLO = tuple(TOKENIZER.encode("Hello there. "))
ONCE = tuple(TOKENIZER.encode("Once upon"))
SYSTEM = "You are a helpful assistant. Answer in one short sentence, please. " * 2


@pytest.fixture()
def engine() -> LLMEngine:
    return LLMEngine(EngineConfig(model="tiny", num_kv_blocks=256))


def run(engine: LLMEngine) -> dict[str, list[EngineOutput]]:
    outputs: dict[str, list[EngineOutput]] = {}
    while engine.has_unfinished:
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
    return outputs


def req(request_id: str, *segments: str, **fields: object) -> EngineRequest:
    return prompt_request(request_id, segments, SamplingParams(max_tokens=4), **fields)


def test_pin_survives_eviction_pressure_until_unpin(engine: LLMEngine) -> None:
    engine.add_request(req("pin", SYSTEM, "Q?", pin_segments=1))
    run(engine)
    pinned = engine.block_manager.pins["pin"]
    assert len(pinned) == len(engine.tokenizer.encode(SYSTEM)) // 16
    for i in range(16):  # overflow the pool with other prompts: LRU would evict the prefix
        engine.add_request(req(f"other{i}", f"{i} " * 150))
    run(engine)
    engine.add_request(req("again", SYSTEM, "Another?"))
    assert run(engine)["again"][-1].num_cached_tokens == len(pinned) * 16
    engine.unpin("pin")
    assert not engine.block_manager.pins
    engine.block_manager.check_invariants([])


def test_unpin_before_the_pin_is_taken_prevents_it(engine: LLMEngine) -> None:
    engine.add_request(req("p", SYSTEM, "Q?", pin_segments=1))
    engine.unpin("p")
    run(engine)
    assert not engine.block_manager.pins
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_tenants_never_share_kv(engine: LLMEngine) -> None:
    engine.add_request(req("a1", SYSTEM, "x", tenant="a"))
    run(engine)
    engine.add_request(req("b1", SYSTEM, "x", tenant="b"))
    engine.add_request(req("a2", SYSTEM, "y", tenant="a"))
    outs = run(engine)
    assert outs["b1"][-1].num_cached_tokens == 0
    assert outs["a2"][-1].num_cached_tokens > 0


def test_priority_decides_admission_under_a_seat_limit() -> None:
    engine = LLMEngine(EngineConfig(model="tiny", num_kv_blocks=64, max_num_seqs=1))
    engine.add_request(req("late", "b", priority=5.0))
    engine.add_request(req("urgent", "a", priority=-1.0))
    order = [out.request_id for out in engine.step()]
    assert order == ["urgent"]


def test_counters_add_up(engine: LLMEngine) -> None:
    engine.add_request(req("c1", SYSTEM, "one"))
    engine.add_request(req("c2", SYSTEM, "two"))
    outs = run(engine)
    stats = engine.stats()
    prompt = sum(o[-1].num_prompt_tokens for o in outs.values())
    assert stats.prompt_tokens == prompt
    assert stats.prefill_tokens + stats.cache_hit_tokens == prompt
    assert stats.cache_hit_tokens == outs["c2"][-1].num_cached_tokens > 0
    assert stats.generated_tokens == 8
    assert stats.extra["kv_usage"] == 0.0  # all finished: every block free (maybe cached)
    assert stats.num_cached_blocks > 0


def test_every_counter_reaches_the_stats(engine: LLMEngine) -> None:
    """Each of the engine's counters is in its stats under its own name (the step count in
    ``extra``), with the counter's value."""
    engine.add_request(req("s1", SYSTEM, "one"))
    run(engine)
    stats, counters = engine.stats(), engine.counters
    assert stats.extra["num_steps"] == counters.num_steps > 0
    names = [f.name for f in fields(Counters) if f.name != "num_steps"]
    assert names and all(getattr(stats, n) == getattr(counters, n) for n in names)


def test_a_request_is_its_ids(engine: LLMEngine) -> None:
    """The engine takes the ids it is given as they are (their count is the prompt's)."""
    ids = tuple(engine.tokenizer.encode("abcdef"))
    assert len(ids) > 3
    engine.add_request(EngineRequest("ids", ids[:3], SamplingParams(max_tokens=4)))
    last = run(engine)["ids"][-1]
    assert last.finished and last.num_prompt_tokens == 3


def test_a_request_that_breaks_the_sampler_fails_alone(engine: LLMEngine) -> None:
    """A temperature too large for a float (constructed without validation, as a bug or a
    missed bound would let through) makes the batched sampler raise: that request ends with
    "error", its neighbour completes."""
    bad = SamplingParams.model_construct(max_tokens=4, temperature=2**1100)
    engine.add_request(EngineRequest("bad", HELLO, bad))
    good = SamplingParams(max_tokens=4, temperature=0.8, seed=1)
    engine.add_request(EngineRequest("good", HELLO, good))
    outs = run(engine)
    assert outs["bad"][-1].finish_reason == "error"
    assert "Overflow" in engine.pop_failure("bad")
    assert outs["good"][-1].finish_reason in ("stop", "length")
    assert outs["good"][-1].num_output_tokens == 4
    engine.block_manager.check_invariants([])
    assert not engine.has_unfinished and not engine.failures


def test_a_huge_top_k_samples_like_no_top_k(engine: LLMEngine) -> None:
    """top_k = 2**70 overflowed the sampler's tensor and failed the whole step."""
    engine.add_request(req("k", "Hello there. "))
    huge = SamplingParams.model_construct(max_tokens=4, temperature=0.8, top_k=2**70, seed=7)
    engine.add_request(EngineRequest("huge", ONCE, huge))
    engine.add_request(
        EngineRequest("off", ONCE, SamplingParams(max_tokens=4, temperature=0.8, seed=7))
    )
    outs = run(engine)
    assert outs["huge"][-1].finish_reason in ("stop", "length")
    assert [o.token_ids for o in outs["huge"]] == [o.token_ids for o in outs["off"]]


def test_a_prompt_the_kv_pool_cannot_hold_is_refused_at_add() -> None:
    """A prompt larger than the whole pool used to 'finish' empty with "length"."""
    small = LLMEngine(EngineConfig(model="tiny", num_kv_blocks=4))  # 64 tokens of KV
    assert small.max_model_len == 64
    with pytest.raises(ValueError, match="at most 64"):
        small.add_request(req("big", "word " * 100))
    with pytest.raises(ValueError, match="at most 64"):
        small.add_tokens("exact", list(range(1, 65)), SamplingParams())
    small.add_tokens("fits", list(range(1, 64)), SamplingParams(max_tokens=4))
    outs = run(small)
    assert outs["fits"][-1].finish_reason == "length" and outs["fits"][-1].num_output_tokens == 1


# (prefix blocks shared, max_tokens, steps before it arrives) per request
_REQUESTS = st.tuples(st.integers(0, 3), st.integers(2, 24), st.integers(0, 3))
_PREFIX = list(range(40, 40 + 3 * 16))


def _outputs(
    requests: list[tuple[int, int, int]],
    num_kv_blocks: int,
    reuse: bool,
    *,
    sampled_rows_only: bool = True,
    max_num_batched_tokens: int = 2048,
) -> tuple[dict[str, tuple[int, ...]], LLMEngine]:
    """Greedy outputs of ``requests`` (see _REQUESTS), the block-table cache on or off, the
    last layer for the sampled rows only or for all."""
    config = EngineConfig(
        model="tiny", num_kv_blocks=num_kv_blocks, max_num_batched_tokens=max_num_batched_tokens
    )
    engine = LLMEngine(config)
    engine.runner.sampled_rows_only = sampled_rows_only
    if not reuse:
        engine.runner.table_cache = None
    got: dict[str, tuple[int, ...]] = {}

    def step() -> None:
        for out in engine.step():
            got[out.request_id] = got.get(out.request_id, ()) + out.token_ids

    for i, (shared, max_tokens, arrives) in enumerate(requests):
        for _ in range(arrives):  # arrives while the others run
            step()
        ids = [*_PREFIX[: 16 * shared], *range(100 + 6 * i, 106 + 6 * i)]
        engine.add_tokens(f"r{i}", ids, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    while engine.has_unfinished:
        step()
    return got, engine


@settings(max_examples=6, deadline=None)
@given(st.lists(_REQUESTS, min_size=2, max_size=7), st.sampled_from([10, 40]))
def test_the_block_table_cache_changes_no_output(
    requests: list[tuple[int, int, int]], num_kv_blocks: int
) -> None:
    """Requests sharing a prefix or not, leaving at different lengths, arriving while others
    decode, in a small pool or a roomy one: greedy outputs are the same whether the decode
    steps' block-table tensor is patched across steps or built anew each step."""
    assert _outputs(requests, num_kv_blocks, True)[0] == _outputs(requests, num_kv_blocks, False)[0]


def test_the_block_table_cache_changes_no_output_through_preemption() -> None:
    """Six requests outgrow a 14-block pool: some are preempted and recomputed, the cache
    patches rows in between, and the outputs equal those without the cache."""
    requests = [(0, 40, 0), (1, 40, 0), (2, 40, 1), (3, 40, 0), (1, 40, 2), (0, 40, 3)]
    cached, engine = _outputs(requests, 14, True)
    assert engine.scheduler.num_preemptions > 0
    table_cache = engine.runner.table_cache
    assert table_cache is not None and table_cache.num_patched_rows > 0
    assert cached == _outputs(requests, 14, False)[0]


@settings(max_examples=6, deadline=None)
@given(st.lists(_REQUESTS, min_size=2, max_size=7), st.sampled_from([24, 64, 2048]))
def test_the_last_layer_for_the_sampled_rows_only_changes_no_output(
    requests: list[tuple[int, int, int]], budget: int
) -> None:
    """Prompts split into chunks that do not sample (a small token budget), beside decodes,
    over shared prefixes or not: greedy outputs are the same whether the last layer computes
    only the sampled rows (as decode rows) or every row."""
    only = _outputs(requests, 40, True, max_num_batched_tokens=budget)[0]
    every = _outputs(requests, 40, True, sampled_rows_only=False, max_num_batched_tokens=budget)
    assert only == every[0]
