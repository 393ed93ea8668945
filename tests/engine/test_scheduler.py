"""The step scheduler on its own: chunking, budgets, priorities, preemption, no lost work."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from eclectus.protocol.sampling import SamplingParams
from eclectus.server.engine.block_manager import BlockManager
from eclectus.server.engine.scheduler import SchedulerOutput, StepScheduler
from eclectus.server.engine.sequence import FinishReason, Sequence, SequenceStatus

BS = 4


def make(num_blocks: int, budget: int = 64, seats: int = 8) -> StepScheduler:
    return StepScheduler(
        BlockManager(num_blocks, BS), max_num_batched_tokens=budget, max_num_seqs=seats
    )


def seq(i: int, prompt_len: int, priority: float = 0.0, start: int = 0) -> Sequence:
    return Sequence(
        f"r{i}",
        list(range(start, start + prompt_len)),
        SamplingParams(max_tokens=4),
        i,
        priority=priority,
    )


def step(sched: StepScheduler, max_outputs: int = 4) -> SchedulerOutput:
    """Schedule, then play the engine's postprocess: advance, sample a fake token, finish."""
    out = sched.schedule()
    for item in out.scheduled:
        s = item.seq
        samples = item.samples
        s.num_computed_tokens += item.num_new_tokens
        if samples:
            s.token_ids.append(1000 + s.num_output_tokens)
            if s.num_output_tokens >= max_outputs:
                sched.finish(s, FinishReason.LENGTH)
    return out


def test_long_prompt_is_chunked_and_decodes_ride_along() -> None:
    sched = make(64, budget=8)
    short, long = seq(0, 3), seq(1, 20)
    sched.add(short)
    sched.add(long)
    first = step(sched)
    assert [(s.seq.request_id, s.num_new_tokens) for s in first.scheduled] == [("r0", 3), ("r1", 5)]
    second = step(sched)
    assert [(s.seq.request_id, s.num_new_tokens) for s in second.scheduled] == [
        ("r0", 1),
        ("r1", 7),
    ]
    assert all(o.num_batched_tokens <= 8 for o in (first, second))


def test_waiting_admitted_by_priority_then_arrival() -> None:
    sched = make(64, budget=4, seats=8)
    for i, prio in enumerate([1.0, 0.0, 1.0, 0.0]):
        sched.add(seq(i, 4, priority=prio))
    order = []
    while sched.has_work:
        order += [s.seq.request_id for s in step(sched, 1).scheduled]
    assert order == ["r1", "r3", "r0", "r2"]


def test_seat_limit_holds() -> None:
    sched = make(64, budget=64, seats=2)
    for i in range(5):
        sched.add(seq(i, 2))
    assert len(step(sched).scheduled) == 2


def test_preemption_by_recompute_loses_nothing() -> None:
    sched = make(6, budget=64)  # 24 slots: three 7-token prompts cannot all grow
    seqs = [seq(i, 7, start=100 * i) for i in range(3)]
    for s in seqs:
        sched.add(s)
    preempted = 0
    for _ in range(100):
        if not sched.has_work:
            break
        out = step(sched, max_outputs=6)
        preempted += len(out.preempted)
        sched.block_manager.check_invariants(sched.running)
    assert preempted > 0 and sched.num_preemptions == preempted
    assert all(s.finish_reason is FinishReason.LENGTH and s.num_output_tokens == 6 for s in seqs)
    assert sched.block_manager.num_free_blocks == 6


def test_request_larger_than_pool_fails_instead_of_hanging() -> None:
    sched = make(2, budget=64)
    big = seq(0, 20)
    sched.add(big)
    out = step(sched)
    assert out.failed == [big] and big.finish_reason is FinishReason.LENGTH
    assert not sched.has_work


def test_abort_waiting_and_running() -> None:
    sched = make(16)
    a, b = seq(0, 5), seq(1, 5)
    sched.add(a)
    step(sched)
    sched.add(b)
    sched.finish(a, FinishReason.ABORT)
    sched.finish(b, FinishReason.ABORT)
    assert step(sched).is_empty and not sched.has_work
    assert a.status is SequenceStatus.FINISHED and sched.block_manager.num_free_blocks == 16


def test_prefix_hits_counted_on_first_admission() -> None:
    sched = make(32)
    sched.add(seq(0, 9))
    step(sched)
    sched.add(seq(1, 9))
    out = step(sched)
    assert out.num_cache_hit_tokens == 8
    assert [s.num_new_tokens for s in out.scheduled] == [1, 1]


@settings(max_examples=40, deadline=None)
@given(
    num_blocks=st.integers(3, 24),
    budget=st.integers(1, 40),
    seats=st.integers(1, 6),
    prompts=st.lists(
        st.tuples(st.integers(1, 30), st.integers(0, 2), st.integers(1, 6)), min_size=1, max_size=8
    ),
    arrive_every=st.integers(0, 3),
)
def test_random_workloads_finish_every_request_without_leaks(
    num_blocks: int,
    budget: int,
    seats: int,
    prompts: list[tuple[int, int, int]],
    arrive_every: int,
) -> None:
    sched = StepScheduler(
        BlockManager(num_blocks, BS),
        max_num_batched_tokens=budget,
        max_num_seqs=seats,
        max_background_seqs=1,
    )
    seqs = []
    for i, (length, prefix_kind, max_out) in enumerate(prompts):
        s = seq(i, length, priority=float(i % 2), start=100 * prefix_kind)
        s.background = i % 3 == 2  # some throughput work, held back while others run
        s.sampling = SamplingParams(max_tokens=max_out)
        seqs.append(s)
    pending = list(seqs)
    for tick in range(2000):
        if pending and (arrive_every == 0 or tick % arrive_every == 0):
            sched.add(pending.pop(0))
        if not pending and not sched.has_work:
            break
        out = sched.schedule()
        assert out.num_batched_tokens <= budget and len(out.scheduled) <= seats
        for item in out.scheduled:
            s = item.seq
            samples = item.samples
            s.num_computed_tokens += item.num_new_tokens
            if samples:
                s.token_ids.append(7)
                if s.num_output_tokens >= s.sampling.max_tokens:
                    sched.finish(s, FinishReason.LENGTH)
        sched.block_manager.check_invariants(sched.running)
    assert all(s.is_finished for s in seqs), "a request was lost or starved"
    for s in seqs:  # finished normally, or failed because it can never fit the pool
        assert s.num_output_tokens == s.sampling.max_tokens or s.num_tokens > num_blocks * BS
    assert sched.block_manager.num_free_blocks == num_blocks


def test_high_priority_prefill_runs_beside_a_running_low_priority_long_prefill() -> None:
    """Latency first within a step: a low-priority background prompt that is mid-prefill
    does not take the whole token budget from a high-priority arrival."""
    sched = make(256, budget=16)
    background = seq(0, 200, priority=5.0)
    sched.add(background)
    first = step(sched)
    assert [(s.seq.request_id, s.num_new_tokens) for s in first.scheduled] == [("r0", 16)]
    chat = seq(1, 10, priority=0.0, start=500)  # arrives later, ranks higher
    sched.add(chat)
    second = step(sched)
    # the chat's whole prompt is computed (and sampled) in this very step, ahead of the
    # background chunk, which gets the rest of the budget
    assert [(s.seq.request_id, s.num_new_tokens) for s in second.scheduled] == [
        ("r1", 10),
        ("r0", 6),
    ]
    assert chat.num_output_tokens == 1
    # next step: the chat's decode first, then the background prefill
    third = step(sched)
    assert [(s.seq.request_id, s.num_new_tokens) for s in third.scheduled] == [
        ("r1", 1),
        ("r0", 15),
    ]


def test_running_prefill_chunks_are_budgeted_by_priority_after_all_decodes() -> None:
    sched = make(256, budget=16)
    low = seq(0, 100, priority=5.0)
    decoder = seq(1, 3, priority=9.0)
    sched.add(low)
    sched.add(decoder)
    step(sched)  # low takes the whole budget; decoder waits (lower rank)
    high = seq(2, 40, priority=0.0, start=300)
    sched.add(high)
    out = step(sched)  # high admitted first, low gets nothing left
    assert [(s.seq.request_id, s.num_new_tokens) for s in out.scheduled] == [("r2", 16)]
    assert high.status is SequenceStatus.RUNNING and low.status is SequenceStatus.RUNNING
    # both running mid-prefill: the high one is budgeted first although it arrived later
    out = step(sched)
    assert [(s.seq.request_id, s.num_new_tokens) for s in out.scheduled] == [("r2", 16)]
    out = step(sched)
    assert [(s.seq.request_id, s.num_new_tokens) for s in out.scheduled] == [
        ("r2", 8),
        ("r0", 8),
    ]
    # high now decodes; a decode of every running request goes before any prefill chunk
    out = step(sched)
    assert out.scheduled[0].seq is high and out.scheduled[0].num_new_tokens == 1
    assert [(s.seq.request_id, s.num_new_tokens) for s in out.scheduled[1:]] == [("r0", 15)]


def bg(i: int, prompt_len: int, start: int) -> Sequence:
    """A background (throughput) request, ranked below foreground ones as the server does."""
    s = seq(i, prompt_len, priority=1e9 + i, start=start)
    s.background = True
    return s


def test_background_work_yields_to_a_foreground_request_while_it_runs() -> None:
    """Three background requests decode together; a chat arrives: while it is in the engine
    only one background request (the best-ranked) shares its steps; when it ends, all three
    run again."""
    sched = StepScheduler(
        BlockManager(256, BS), max_num_batched_tokens=64, max_num_seqs=8, max_background_seqs=1
    )
    jobs = [bg(i, 6, start=100 * i) for i in range(3)]
    for job in jobs:
        job.sampling = SamplingParams(max_tokens=50)
        sched.add(job)
    assert {s.seq.request_id for s in step(sched, 50).scheduled} == {"r0", "r1", "r2"}
    chat = seq(9, 5, priority=0.0, start=900)
    sched.add(chat)
    while chat.num_output_tokens < 3:
        out = step(sched, 50)
        assert sorted(s.seq.request_id for s in out.scheduled) == ["r0", "r9"]
    sched.finish(chat, FinishReason.LENGTH)
    assert {s.seq.request_id for s in step(sched, 50).scheduled} == {"r0", "r1", "r2"}
    assert all(job.status is SequenceStatus.RUNNING for job in jobs)  # held, not preempted


def test_without_a_limit_or_a_foreground_request_background_runs_freely() -> None:
    unlimited = make(256)
    limited = StepScheduler(
        BlockManager(256, BS), max_num_batched_tokens=64, max_num_seqs=8, max_background_seqs=1
    )
    for sched in (unlimited, limited):
        for i in range(3):
            sched.add(bg(i, 6, start=100 * i))
    assert len(step(limited).scheduled) == 3  # only background: nothing to yield to
    unlimited.add(seq(9, 5, start=900))
    assert len(step(unlimited).scheduled) == 4


def test_a_waiting_foreground_request_also_holds_background_back() -> None:
    """A chat that cannot be admitted yet (no seat) still limits background work."""
    sched = StepScheduler(
        BlockManager(256, BS), max_num_batched_tokens=64, max_num_seqs=2, max_background_seqs=1
    )
    for i in range(2):
        sched.add(bg(i, 6, start=100 * i))
    step(sched, 50)
    sched.add(seq(9, 5, start=900))  # both seats are taken by background work
    out = step(sched, 50)
    assert [s.seq.request_id for s in out.scheduled] == ["r0"]
