"""Program-level policies (policies.py), each asserted on dispatch order with the scripted
engine and a fake clock: least attained service as PLAS (sequential programs add up) and
ATLAS (parallel branches take the heaviest), aging under LAS, fair queueing of programs,
and deadlines."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sched_helpers import FakeClock, call, drain, make_scheduler, order, submit
from scripted_engine import ScriptedEngine, prompt_text, scripted_text

from eclectus.protocol import Usage
from eclectus.server.config import ServerConfig
from eclectus.server.graph.policies import (
    PolicyParams,
    ProgramPolicy,
    attained_service,
    computed_tokens,
    program_arrival,
    program_term,
)
from eclectus.server.graph.scheduler import AppState, GraphScheduler

LAS = {"program_policy": "las", "aging_rate": 0.0}


def engine_text(engine: ScriptedEngine, index: int = 0) -> bytes:
    """What the scripted engine answered to its ``index``-th request."""
    request = engine.requests[index]
    return scripted_text(prompt_text(request), request.sampling.max_tokens).encode()


def tokens(engine: ScriptedEngine, index: int) -> int:
    """Tokens the scripted engine computed for a request: its prompt's ids (nothing cached
    in these tests) and its answer, one per byte."""
    request = engine.requests[index]
    return len(request.prompt_token_ids) + len(engine_text(engine, index))


async def run_alone(sched: GraphScheduler, app: AppState, **frame: object) -> None:
    """Submit and let it all finish before anything else queues."""
    submit(sched, app, **frame)
    await drain(sched)


def blocked(engine: ScriptedEngine, clock: FakeClock, **config: object) -> GraphScheduler:
    """One slot, held by a blocker, so that what is submitted next queues."""
    sched = make_scheduler(engine, clock, max_inflight=1, **config)
    submit(sched, sched.open_app("blocker"), calls=[call("block", "b")], gets=[{"var": "b"}])
    return sched


def test_tokens_computed_are_the_prompt_not_cached_plus_the_output() -> None:
    usage = Usage(prompt_tokens=100, completion_tokens=8, cached_tokens=60)
    assert computed_tokens(usage) == 48
    assert computed_tokens(None) == 0


def test_attained_service_is_the_heaviest_input_path_or_the_sessions() -> None:
    assert attained_service([5, 30, 12], linked=True, session_service=99) == 30
    assert attained_service([0, 0], linked=False, session_service=99) == 99


def test_las_ages_by_the_wait() -> None:
    """A call with service S waits at most S / (rate * aging) behind a fresh program."""
    params = PolicyParams(ProgramPolicy.LAS, aging_rate=0.5, las_tokens_per_s=100.0)
    heavy = program_term(params, arrival=0.0, service_tokens=1000, enqueued_at=0.0)  # 10 s
    fresh_soon = program_term(params, arrival=19.0, service_tokens=0, enqueued_at=19.0)
    fresh_late = program_term(params, arrival=21.0, service_tokens=0, enqueued_at=21.0)
    assert fresh_soon < heavy < fresh_late


async def test_plas_a_fresh_program_goes_before_one_that_has_computed_much() -> None:
    """An eager program (its calls one submit at a time) that has computed tokens ranks
    behind a program that arrived later and has computed none; app-FIFO orders them the
    other way round."""
    for policy, expected in (("las", ["fresh", "old-2"]), ("fifo", ["old-2", "fresh"])):
        engine, clock = ScriptedEngine(), FakeClock()
        sched = make_scheduler(engine, clock, max_inflight=1, program_policy=policy, aging_rate=0)
        old = sched.open_app("old")
        await run_alone(sched, old, calls=[call("old-1", "a", max_tokens=64)], gets=[{"var": "a"}])
        assert old.service == tokens(engine, 0)  # its prompt and its output
        engine.pause()
        submit(sched, sched.open_app("blocker"), calls=[call("block", "z")], gets=[{"var": "z"}])
        clock.now += 1
        fresh = sched.open_app("fresh")
        submit(sched, old, calls=[call("old-2", "b")], gets=[{"var": "b"}])
        submit(sched, fresh, calls=[call("fresh", "c")], gets=[{"var": "c"}])
        engine.release()
        await drain(sched)
        assert order(sched)[2:] == expected, policy


async def test_atlas_a_fan_in_takes_the_heaviest_branch_and_a_chain_adds_up() -> None:
    """In one graph, a reduce over three parallel maps starts from the heaviest map's
    service (ATLAS), not their sum; a chain's third step from its two steps' sum (PLAS)."""
    engine = ScriptedEngine()
    sched = make_scheduler(engine, **LAS)
    fan, chain = sched.open_app("fan"), sched.open_app("chain")
    maps = [call(f"m{i}", f"s{i}", text="map" + "x" * 10 * i) for i in range(3)]
    submit(sched, fan, calls=[*maps, call("r", "out", "s0", "s1", "s2")], gets=[{"var": "out"}])
    await drain(sched)
    by_id = {r.request_id.split("/")[1]: i for i, r in enumerate(engine.requests)}
    heaviest = max(tokens(engine, by_id[f"m{i}"]) for i in range(3))
    assert fan.graph.nodes["r"].service_key == heaviest
    steps = [call("c0", "x0"), call("c1", "x1", "x0"), call("c2", "x2", "x1")]
    submit(sched, chain, calls=steps, gets=[{"var": "x2"}])
    await drain(sched)
    by_id = {r.request_id.split("/")[1]: i for i, r in enumerate(engine.requests)}
    assert chain.graph.nodes["c2"].service_key == tokens(engine, by_id["c0"]) + tokens(
        engine, by_id["c1"]
    )


async def test_an_eager_programs_calls_rank_by_its_timeline() -> None:
    """With no edges between submits (an eager app), a call after a batch starts from the
    batch's heaviest call (they ran side by side), and the next from that plus its own."""
    engine = ScriptedEngine()
    sched = make_scheduler(engine, **LAS)
    app = sched.open_app("eager")
    batch = [call(f"a{i}", f"y{i}", text="a" + "x" * 7 * i) for i in range(3)]
    await run_alone(sched, app, calls=batch, gets=[{"var": f"y{i}"} for i in range(3)])
    await run_alone(sched, app, calls=[call("b", "yb")], gets=[{"var": "yb"}])
    await run_alone(sched, app, calls=[call("c", "yc")], gets=[{"var": "yc"}])
    heaviest = max(tokens(engine, i) for i in range(3))
    assert app.graph.nodes["b"].service_key == heaviest
    assert app.graph.nodes["c"].service_key == heaviest + tokens(engine, 3)


async def test_las_aging_lets_a_heavy_program_overtake_later_arrivals() -> None:
    """A program with attained service waits behind fresh programs only for a bounded
    time: a fresh call queued later than service / (las_tokens_per_s * aging_rate) after it
    ranks behind it."""
    engine, clock = ScriptedEngine(), FakeClock()
    config = {"program_policy": "las", "aging_rate": 0.5, "las_tokens_per_s": 10.0}
    sched = make_scheduler(engine, clock, max_inflight=1, **config)
    heavy = sched.open_app("heavy")
    await run_alone(sched, heavy, calls=[call("h1", "a")], gets=[{"var": "a"}])
    bound = heavy.service / (10.0 * 0.5)  # seconds it may wait behind fresh work
    engine.pause()
    submit(sched, sched.open_app("blocker"), calls=[call("block", "z")], gets=[{"var": "z"}])
    submit(sched, heavy, calls=[call("h2", "b")], gets=[{"var": "b"}])
    clock.now += bound / 2
    submit(sched, sched.open_app("f1"), calls=[call("f1", "c")], gets=[{"var": "c"}])
    clock.now += bound
    submit(sched, sched.open_app("f2"), calls=[call("f2", "d")], gets=[{"var": "d"}])
    engine.release()
    await drain(sched)
    assert order(sched)[2:] == ["f1", "h2", "f2"]


@given(
    service=st.integers(0, 10**7),
    rate=st.floats(1.0, 1e6),
    aging=st.floats(0.01, 10.0),
    queued_at=st.floats(0.0, 1e6),
    extra=st.floats(0.01, 1e3),
)
def test_nothing_starves_under_las_aging(
    service: int, rate: float, aging: float, queued_at: float, extra: float
) -> None:
    """Any call ranks before every fresh call queued more than service / (rate * aging)
    seconds after it, whatever its service."""
    params = PolicyParams(ProgramPolicy.LAS, aging_rate=aging, las_tokens_per_s=rate)
    waiting = program_term(params, arrival=0.0, service_tokens=service, enqueued_at=queued_at)
    later = queued_at + service / (rate * aging) + extra
    fresh = program_term(params, arrival=later, service_tokens=0, enqueued_at=later)
    assert waiting < fresh


@given(
    service=st.integers(0, 10**7),
    rate=st.floats(1.0, 1e6),
    arrival=st.floats(0.0, 1e6),
    gap=st.floats(0.0, 1e3),
)
def test_fair_a_program_ranks_as_if_it_arrived_later_by_its_service_at_the_rate(
    service: int, rate: float, arrival: float, gap: float
) -> None:
    """Under ``fair`` (no aging), a program with service S that arrived at t ranks before a
    fresh program arriving after t + S / rate and after one arriving before it."""
    params = PolicyParams(ProgramPolicy.FAIR, aging_rate=0.0, las_tokens_per_s=rate)
    old = program_term(params, arrival=arrival, service_tokens=service, enqueued_at=0.0)
    due = arrival + service / rate
    later = program_term(params, arrival=due + gap + 1e-3 * (1 + due), service_tokens=0,
                         enqueued_at=0.0)  # fmt: skip
    assert old < later
    if service > 0:
        sooner = max(due - gap - 1e-3 * (1 + due), 0.0)
        assert program_term(params, arrival=sooner, service_tokens=0, enqueued_at=0.0) < old


async def test_fair_a_chain_goes_before_new_programs_once_past_its_share() -> None:
    """An eager chain that has computed S tokens: its next step goes behind a program that
    arrived within S / rate of the chain's start (las: behind it too; fifo: before it), and
    before one that arrived later (las: behind it)."""
    rate = 10.0
    cases = {
        "fair": ["soon", "chain-2", "late"],
        "las": ["soon", "late", "chain-2"],
        "fifo": ["chain-2", "soon", "late"],
    }
    for policy, expected in cases.items():
        engine, clock = ScriptedEngine(), FakeClock()
        config = {"program_policy": policy, "aging_rate": 0.0, "las_tokens_per_s": rate}
        sched = make_scheduler(engine, clock, max_inflight=1, program_gap_s=1e9, **config)
        chain = sched.open_app("chain")
        await run_alone(sched, chain, calls=[call("chain-1", "a")], gets=[{"var": "a"}])
        share = chain.service / rate  # seconds its service is worth
        engine.pause()
        submit(sched, sched.open_app("blocker"), calls=[call("block", "z")], gets=[{"var": "z"}])
        clock.now += share / 2
        submit(sched, sched.open_app("soon"), calls=[call("soon", "c")], gets=[{"var": "c"}])
        clock.now += share
        submit(sched, sched.open_app("late"), calls=[call("late", "d")], gets=[{"var": "d"}])
        submit(sched, chain, calls=[call("chain-2", "b")], gets=[{"var": "b"}])
        engine.release()
        await drain(sched)
        assert order(sched)[2:] == expected, policy


async def test_a_sessions_next_program_starts_from_no_service() -> None:
    """After a pause longer than the program gap, a session's next call is a new program
    (its arrival is now) and its attained service starts again from none."""
    engine, clock = ScriptedEngine(), FakeClock()
    sched = make_scheduler(engine, clock, program_policy="fair", program_gap_s=1.0)
    chat = sched.open_app("chat")
    await run_alone(sched, chat, calls=[call("turn-1", "a")], gets=[{"var": "a"}])
    assert chat.service > 0
    clock.now += 0.5
    await run_alone(sched, chat, calls=[call("turn-2", "b")], gets=[{"var": "b"}])
    assert chat.graph.nodes["turn-2"].service_key > 0  # the same program, going on
    clock.now += 5.0
    submit(sched, chat, calls=[call("turn-3", "c")], gets=[{"var": "c"}])
    assert chat.graph.nodes["turn-3"].service_key == 0
    assert chat.program_arrival == clock.now
    await drain(sched)


async def test_deadline_policy_ranks_latency_work_by_an_implicit_deadline() -> None:
    """Under ``deadline``, a latency program's calls are due ``latency_deadline_s`` after
    its arrival, so a deadline program due sooner goes first; under app-FIFO latency work
    always goes before deadline work."""
    for policy, expected in (("deadline", ["d", "l"]), ("fifo", ["l", "d"])):
        engine, clock = ScriptedEngine(hold=True), FakeClock()
        config = {"program_policy": policy, "latency_deadline_s": 5.0, "aging_rate": 0.0}
        sched = blocked(engine, clock, **config)
        submit(sched, sched.open_app("lat"), calls=[call("l", "a")], gets=[{"var": "a"}])
        clock.now += 1
        due = [{"var": "b", "criteria": "deadline", "deadline_ms": 1000}]  # due at 2 s
        submit(sched, sched.open_app("due"), calls=[call("d", "b")], gets=due)
        engine.release()
        await drain(sched)
        assert order(sched)[1:] == expected, policy


def test_a_session_continues_its_program_while_busy_or_within_the_gap() -> None:
    params = PolicyParams(program_gap_s=1.0)
    fresh = program_arrival(params, now=5.0, current=None, last_active=0.0, busy=False)
    assert fresh == 5.0  # the session's first program
    assert program_arrival(params, now=5.0, current=2.0, last_active=4.5, busy=False) == 2.0
    assert program_arrival(params, now=5.0, current=2.0, last_active=3.0, busy=True) == 2.0
    assert program_arrival(params, now=5.0, current=2.0, last_active=3.0, busy=False) == 5.0


async def test_fifo_an_eager_programs_next_turn_ranks_by_the_programs_arrival() -> None:
    """An eager agent (one call per submit, a client round trip between) goes before a
    program that arrived after its first turn; after a pause longer than the gap, its next
    call is a new program and goes after it."""
    for pause, expected in ((0.5, ["agent-2", "newer"]), (5.0, ["newer", "agent-2"])):
        engine, clock = ScriptedEngine(), FakeClock()
        sched = make_scheduler(engine, clock, max_inflight=1, aging_rate=0, program_gap_s=1.0)
        agent = sched.open_app("agent")
        await run_alone(sched, agent, calls=[call("agent-1", "a")], gets=[{"var": "a"}])
        engine.pause()
        submit(sched, sched.open_app("blocker"), calls=[call("block", "z")], gets=[{"var": "z"}])
        clock.now += pause / 2
        submit(sched, sched.open_app("newer"), calls=[call("newer", "c")], gets=[{"var": "c"}])
        clock.now += pause / 2
        submit(sched, agent, calls=[call("agent-2", "b")], gets=[{"var": "b"}])
        engine.release()
        await drain(sched)
        assert order(sched)[2:] == expected, pause


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("program_policy", "lifo", "'lifo' is not a valid ProgramPolicy"),
        ("admission", "maybe", "admission must be 'engine' or 'off'"),
        ("las_tokens_per_s", 0.0, "las_tokens_per_s must be > 0"),
        ("latency_deadline_s", -1.0, "latency_deadline_s must be > 0"),
        ("program_gap_s", float("nan"), "program_gap_s must be >= 0"),
        ("max_engine_seqs", 0, "max_engine_seqs must be >= 1"),
        ("kv_admit_fraction", 1.5, r"kv_admit_fraction must be in \(0, 1\]"),
    ],
)
def test_a_bad_scheduling_setting_is_refused_naming_it(
    field: str, value: object, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        ServerConfig(**{field: value})  # type: ignore[arg-type]


def test_the_policy_knobs_have_one_home() -> None:
    """ServerConfig's policy fields default to PolicyParams's, and its policy_params is
    PolicyParams's default: the contract is written once (policies.py)."""
    assert ServerConfig().policy_params == PolicyParams()


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"aging_rate": -0.1}, "aging_rate must be >= 0"),
        ({"aging_rate": float("nan")}, "aging_rate must be >= 0 and finite"),
        ({"las_tokens_per_s": float("inf")}, "las_tokens_per_s must be > 0 and finite"),
        ({"latency_deadline_s": 0.0}, "latency_deadline_s must be > 0"),
    ],
)
def test_policy_params_check_their_own_ranges(knobs: dict[str, float], message: str) -> None:
    """PolicyParams refuses a knob out of range itself, for ServerConfig and any other
    maker alike; a policy given as a string is refused, not taken for fifo."""
    with pytest.raises(ValueError, match=message):
        PolicyParams(**knobs)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="policy must be a ProgramPolicy"):
        PolicyParams("las")  # type: ignore[arg-type]
