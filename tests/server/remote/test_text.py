"""What the remote backend reads from engines: /metrics pages and the text after a failover."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eclectus.models.tokenizer import IncrementalDetokenizer, Tokenizer
from eclectus.server.remote.continuation import LocalText
from eclectus.server.remote.load import EngineLoad, parse_load

VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 4.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.5
"""


def test_parse_load_reads_vllm_sglang_and_eclectus() -> None:
    """Counts are summed over data-parallel engines, KV usage is the fullest one's."""
    assert parse_load(VLLM_METRICS) == EngineLoad(5, 4, 0.5)
    old = "vllm:num_requests_running 1\nvllm:gpu_cache_usage_perc 0.75\n"
    assert parse_load(old) == EngineLoad(1, None, 0.75)
    sglang = 'sglang:num_running_reqs{tp_rank="0"} 7\nsglang:num_queue_reqs 1\n'
    assert parse_load(sglang) == EngineLoad(7, 1, None)
    ours = "eclectus_engine_running 2\neclectus_engine_waiting 0\n"
    ours += "eclectus_engine_free_blocks 30\neclectus_engine_total_blocks 40\n"
    assert parse_load(ours) == EngineLoad(2, 0, 0.25)
    assert parse_load("# nothing\nother_metric 3\n") == EngineLoad()


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    from eclectus.models.presets import resolve_model_dir

    return Tokenizer.from_dir(resolve_model_dir("tiny"))


def engine_text(tokenizer: Tokenizer, ids: list[int]) -> list[str]:
    """The pieces an engine streams for ``ids`` (the same incremental detokenizer)."""
    detokenizer = IncrementalDetokenizer(tokenizer)
    return [detokenizer.feed(i) for i in ids] + [detokenizer.flush()]


@settings(max_examples=60, deadline=None)
@given(text=st.text(min_size=1, max_size=30), cut=st.integers(0, 200))
def test_text_after_a_failover_is_the_uninterrupted_text(
    tokenizer: Tokenizer, text: str, cut: int
) -> None:
    """Fail over after any id, even inside a multi-byte character: what the graph got
    before plus what LocalText gives after is exactly the uninterrupted engine's text."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    cut = min(cut, len(ids))
    emitted = "".join(engine_text(tokenizer, ids[:cut])[:-1])  # the stream dropped: no flush
    local = LocalText.resume(tokenizer, ids[:cut], emitted, stop=())
    assert local is not None
    rest, stopped = local.feed(ids[cut:])
    tail, _ = local.flush()
    assert emitted + rest + tail == tokenizer.decode(ids) and not stopped


def test_local_text_stops_at_a_stop_string_across_pieces(tokenizer: Tokenizer) -> None:
    """A stop string split over several ids ends the text before it, never emitting its
    prefix early."""
    local = LocalText.resume(tokenizer, [], "", stop=("END",))
    assert local is not None
    pieces = [local.feed(tokenizer.encode(c, add_special_tokens=False)) for c in "ab EN"]
    assert "".join(t for t, _ in pieces) == "ab " and not any(s for _, s in pieces)
    assert local.feed(tokenizer.encode("D more", add_special_tokens=False)) == ("", True)
    assert (
        LocalText.resume(tokenizer, tokenizer.encode("xy", add_special_tokens=False), "z", ())
        is None
    )


def test_parse_load_reads_the_kv_cache_size_and_preemptions() -> None:
    """vLLM's ``cache_config_info`` labels give each engine's KV cache (blocks x block
    size, summed over data-parallel engines); its preemption counter is summed too. A
    sample missing a label adds nothing rather than failing the page."""
    info = (
        'vllm:cache_config_info{{block_size="{b}",cache_dtype="auto",num_gpu_blocks="{n}"}} 1.0\n'
    )
    page = VLLM_METRICS + info.format(b=16, n=100) + info.format(b=32, n=10)
    page += 'vllm:num_preemptions_total{engine="0",model_name="m"} 2.0\n'
    page += 'vllm:num_preemptions_total{engine="1",model_name="m"} 1.0\n'
    assert parse_load(page) == EngineLoad(
        5, 4, 0.5, kv_tokens=100 * 16 + 10 * 32, num_preemptions=3
    )
    unsized = 'vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1.0\n'
    assert parse_load(VLLM_METRICS + unsized) == EngineLoad(5, 4, 0.5)
    assert parse_load("eclectus_engine_preemptions_total 4\n").num_preemptions == 4


def test_parse_load_reads_the_block_size_prefixes_are_shared_at() -> None:
    """An engine caching prefixes shares them at its block size; one that does not, or
    data-parallel engines that disagree, share none the admission may count."""
    info = (
        'vllm:cache_config_info{{block_size="{b}",enable_prefix_caching="{on}",'
        'engine="{e}",num_gpu_blocks="10"}} 1.0\n'
    )
    on = info.format(b=32, on="True", e=0)
    assert parse_load(VLLM_METRICS + on).shared_block_size == 32
    assert parse_load(VLLM_METRICS + on + info.format(b=32, on="True", e=1)).shared_block_size == 32
    assert parse_load(VLLM_METRICS + info.format(b=32, on="False", e=0)).shared_block_size is None
    assert (
        parse_load(VLLM_METRICS + on + info.format(b=16, on="True", e=1)).shared_block_size is None
    )
    assert parse_load(VLLM_METRICS).shared_block_size is None


async def test_the_builtin_member_reports_its_engines_kv_cache() -> None:
    """The built-in engine as a pool member reports the KV cache the scheduler admits
    within (its blocks x block size), beside its load."""
    from eclectus.server.engine import AsyncEngine
    from eclectus.server.remote.members import LocalMember

    engine = AsyncEngine.from_config(model="tiny", num_kv_blocks=96, num_threads=1)
    try:
        await engine.start()
        load = await LocalMember(engine).load()
        assert load.kv_tokens == 96 * engine.config.block_size
        assert (load.num_running, load.num_waiting, load.num_preemptions) == (0, 0, 0)
    finally:
        await engine.shutdown()
