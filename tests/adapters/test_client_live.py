"""The SDK against the REAL server and built-in engine (tiny model, greedy sampling).

The tiny model's text is deterministic under temperature 0, so each test
checks a server-side graph against the same work done step by step from the client.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from client_live import LiveServer, serve_live

from eclectus.adapters.client import (
    AuthError,
    Gen,
    SemanticVariable,
    ServerError,
    VariableFailed,
    connect,
    connect_sync,
)
from eclectus.benchmarks.client import as_graph, documents, step_by_step
from eclectus.models.presets import resolve_model_dir
from eclectus.models.tokenizer import Tokenizer

pytestmark = pytest.mark.slow

SUMMARIZE = "Summarize:\n{{doc}}\nSummary:{{summary}}"
COMBINE = "Combine:\n{{a}}\n{{b}}\nFinal:{{final}}"


def one(result: SemanticVariable | tuple[SemanticVariable, ...]) -> SemanticVariable:
    assert isinstance(result, SemanticVariable)
    return result


async def test_issue_example_end_to_end(live_server: LiveServer) -> None:
    """map-reduce in one frame equals the same calls made one by one with plain strings."""
    async with connect(live_server.url, token=live_server.token) as app:
        summarize = app.function(SUMMARIZE, summary=dict(max_tokens=8))
        combine = app.function(COMBINE, final=dict(max_tokens=8))
        s1, s2 = one(summarize(doc="the first text")), one(summarize(doc="the second text"))
        final = one(combine(a=s1, b=s2))
        graph_value = await final.aget(criteria="latency")
        assert app.num_frames_sent == 1  # ONE submit after the hello (this session's own
        # count: the server-wide one may still see a close from an earlier test's session)
    assert final.finish_reason in ("stop", "length") and final.usage is not None
    assert final.usage.completion_tokens >= 1
    async with connect(live_server.url, token=live_server.token) as app:
        summarize = app.function(SUMMARIZE, summary=dict(max_tokens=8))
        combine = app.function(COMBINE, final=dict(max_tokens=8))
        a = await one(summarize(doc="the first text")).aget()
        b = await one(summarize(doc="the second text")).aget()
        assert await one(combine(a=a, b=b)).aget() == graph_value


async def test_stream_concatenates_to_value(live_server: LiveServer) -> None:
    """Deltas of a streamed output join to exactly the text a plain get returns."""
    async with connect(live_server.url, token=live_server.token) as app:
        (streamed,) = app.call(["Once upon a time", Gen(max_tokens=12, ignore_eos=True)])
        deltas = [d async for d in streamed.astream()]
        (plain,) = app.call(["Once upon a time", Gen(max_tokens=12, ignore_eos=True)])
        assert len(deltas) >= 2
        assert "".join(deltas) == streamed.value == await plain.aget()


async def test_multi_output_template(live_server: LiveServer) -> None:
    """Two outputs of one template come back as a tuple, both with text."""
    async with connect(live_server.url, token=live_server.token) as app:
        f = app.function("Topic: {{t}}\nTitle:{{title}}\nBody:{{body}}", title={}, body={})
        title, body = f(t="rain")
        texts = await app.aget_many([title, body])
        assert texts == [title.value, body.value]
        assert title.usage is not None and body.usage is not None


def test_sync_twin(live_server: LiveServer) -> None:
    """connect_sync: get() and stream() from plain code give the async API's results."""
    with connect_sync(live_server.url, token=live_server.token) as app:
        summarize = app.function(SUMMARIZE, summary=dict(max_tokens=6))
        out = one(summarize(doc="sync doc"))
        text = out.get(timeout=60)
        again = one(summarize(doc="sync doc"))
        assert "".join(again.stream(timeout=60)) == text
        tiny = Tokenizer.from_dir(resolve_model_dir("tiny"))  # the live server's model
        assert app.tokenize("abc") == tiny.encode("abc", add_special_tokens=False)
        assert app.count_tokens("abc") == len(tiny.encode("abc", add_special_tokens=False))


async def test_client_set_variable_feeds_the_graph(live_server: LiveServer) -> None:
    """A placeholder set mid-graph by the client behaves like the same constant input."""
    async with connect(live_server.url, token=live_server.token) as app:
        ask = app.function("Tool said: {{tool}}\nAnswer:{{answer}}", answer=dict(max_tokens=6))
        slot = app.variable(name="tool")
        via_set = one(ask(tool=slot))
        waiting = asyncio.create_task(via_set.aget())
        await asyncio.sleep(0.05)
        assert not waiting.done()  # blocked on the client-set input
        await slot.aset("sunny, 21 degrees")
        assert await waiting == await one(ask(tool="sunny, 21 degrees")).aget()


async def test_join_and_repr_list_ops(live_server: LiveServer) -> None:
    """Server-side ops compute exactly what Python computes on the client."""
    async with connect(live_server.url, token=live_server.token) as app:
        (gen,) = app.call(["Say:", Gen(max_tokens=4)])
        joined = app.join([gen, "tail"], sep=" | ", prefix="<", suffix=">")
        listed = app.repr_list([gen, "it's"])
        value, joined_text, listed_text = await app.aget_many([gen, joined, listed])
        assert joined_text == f"<{value} | tail>"
        assert listed_text == repr([value, "it's"])


async def test_auth(live_server: LiveServer) -> None:
    """A wrong or missing token is an AuthError; the right one connects."""
    with pytest.raises(AuthError):
        await connect(live_server.url, token="wrong")
    with pytest.raises(AuthError):
        await connect(live_server.url, token="")
    async with connect(live_server.url, token=live_server.token, app="auth-test") as app:
        assert app.session_id and [m.name for m in app.models] == ["tiny"]


async def test_server_error_lands_on_the_right_variable(live_server: LiveServer) -> None:
    """An over-long client-set input fails its consumer (limit_exceeded); a sibling succeeds,
    and a refused set is a ServerError that does not fail the variable."""
    async with connect(live_server.url, token=live_server.token) as app:
        f = app.function("In: {{x}}\nOut:{{y}}", y=dict(max_tokens=4))
        huge = app.variable(name="huge")
        bad, good = one(f(x=huge)), one(f(x="short"))
        await huge.aset("z" * 3000)  # over the fixture's max_prompt_tokens (2048)
        with pytest.raises(VariableFailed) as caught:
            await bad.aget()
        assert caught.value.code == "limit_exceeded" and caught.value.var == bad.id
        assert await good.aget() == good.value
        with pytest.raises(ServerError):
            await good.aset("not allowed: it has a producer")
        assert good.value is not None and good.error is None


async def test_two_sessions_concurrently(live_server: LiveServer) -> None:
    """Two sessions running fan-outs at once each get their own, correct results."""

    async def fan_out(docs: list[str]) -> list[str]:
        async with connect(live_server.url, token=live_server.token) as app:
            summarize = app.function(SUMMARIZE, summary=dict(max_tokens=5))
            return await app.aget_many([one(summarize(doc=d)) for d in docs])

    docs_a, docs_b = ["alpha", "beta", "gamma"], ["delta", "epsilon"]
    both = await asyncio.gather(fan_out(docs_a), fan_out(docs_b))
    assert both == [await fan_out(docs_a), await fan_out(docs_b)]


def test_sync_session_serves_other_event_loops(live_server: LiveServer) -> None:
    """One connect_sync session answers aget from an unrelated loop and get from a thread."""
    with connect_sync(live_server.url, token=live_server.token) as app:
        f = app.function(SUMMARIZE, summary=dict(max_tokens=4))
        out = one(f(doc="shared"))
        from_loop = asyncio.run(out.aget())
        assert from_loop == one(f(doc="shared")).get(timeout=60)


async def test_cancel_fails_the_waiting_get(live_server: LiveServer) -> None:
    """Cancelling a long generation makes its waiting get raise VariableFailed(cancelled)."""
    async with connect(live_server.url, token=live_server.token) as app:
        (long,) = app.call(["Go on:", Gen(max_tokens=3000, ignore_eos=True)])
        waiting = asyncio.create_task(long.aget())
        await asyncio.sleep(0.2)
        await long.acancel()
        with pytest.raises(VariableFailed) as caught:
            await asyncio.wait_for(waiting, 30)
        assert caught.value.code == "cancelled" and caught.value.var == long.id


async def test_bench_graph_equals_step_by_step(live_server: LiveServer) -> None:
    """The bench's two modes agree; the graph takes one frame, step by step one per call."""
    docs = documents(3)
    url, token = live_server.url, live_server.token
    graph = await as_graph(url, token, docs, max_tokens=4)
    steps = await step_by_step(url, token, docs, max_tokens=4)
    assert graph.final == steps.final
    assert (graph.num_frames, steps.num_frames) == (1, 4)


def test_long_session_stays_under_limits_by_releasing() -> None:
    """Dropped variables are released, so one session makes more calls than the server's
    per-session limits hold at once."""
    limits = dict(max_calls_per_session=16, max_vars_per_session=40)
    with serve_live(**limits) as small, connect_sync(small.url, token=small.token) as app:
        f = app.function("Item {{i}}:{{out}}", out=dict(max_tokens=2))
        texts = [one(f(i=str(i))).get(timeout=60) for i in range(48)]
        assert len(texts) == 48
        assert app.num_frames_sent > 48  # the submits and some release frames


PLAN = {
    "type": "object",
    "properties": {
        "steps": {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 2}
    },
    "required": ["steps"],
}


async def test_a_map_fans_out_a_constrained_plan_in_one_frame(live_server: LiveServer) -> None:
    """map over a JSON plan the server generated: one submit, and each instance's output is
    what the same call gives made on its own from the client."""
    async with connect(live_server.url, token=live_server.token) as app:
        plan = app.call(["Plan as JSON:", Gen(max_tokens=48, json_schema=PLAN)])[0]
        step = app.new_variable()
        done = app.map(
            plan, step, ["Do: ", step, "\nResult:", Gen(max_tokens=6)], items_path=["steps"]
        )
        listed = app.spread_repr_list(done)
        plan_text, done_text, listed_text = await app.aget_many([plan, done, listed])
        assert app.num_frames_sent == 1  # ONE submit after the hello
    steps = json.loads(plan_text)["steps"]
    results = json.loads(done_text)
    assert len(results) == 2 and listed_text == repr(results)
    async with connect(live_server.url, token=live_server.token) as app:
        alone = [app.call(["Do: ", s, "\nResult:", Gen(max_tokens=6)])[0] for s in steps]
        assert await app.aget_many(alone) == results


async def test_a_map_of_steps_equals_the_same_calls_made_plainly(
    live_server: LiveServer,
) -> None:
    """A 3-step map (draft, review, revise) over 2 elements in ONE submit: its result and
    step outputs equal the same calls declared one by one as plain calls (greedy)."""
    files = ["a festival", "parser.py"]
    async with connect(live_server.url, token=live_server.token) as app:
        items = app.variable(json.dumps({"files": files}))
        design = app.variable("Design: a tiny calculator.\n")
        element = app.new_variable(name="element")
        steps = app.map_steps(element)
        code = steps.call(["Write about ", element, ":\n", Gen(max_tokens=8)])
        review = steps.call(
            [design, "Review ", element, ":\n", code, "\nNotes:", Gen(max_tokens=6)]
        )
        steps.call([design, "Revise ", element, ":\n", code, "\n", review, Gen(max_tokens=8)])
        mapped, (codes, reviews) = app.map_pipeline(
            items, steps, items_path=["files"], step_outputs=True
        )
        texts = await app.aget_many([mapped, codes, reviews])
        assert app.num_frames_sent == 1  # ONE submit after the hello
    finals, drafts, notes = (json.loads(t) for t in texts)
    async with connect(live_server.url, token=live_server.token) as app:
        design = app.variable("Design: a tiny calculator.\n")
        plain = []
        for name in files:
            (c,) = app.call(["Write about ", name, ":\n", Gen(max_tokens=8)])
            (r,) = app.call([design, "Review ", name, ":\n", c, "\nNotes:", Gen(max_tokens=6)])
            (f,) = app.call([design, "Revise ", name, ":\n", c, "\n", r, Gen(max_tokens=8)])
            plain += [c, r, f]
        values = await app.aget_many(plain)
    assert drafts == values[0::3] and notes == values[1::3] and finals == values[2::3]
    assert drafts[0] != drafts[1]  # each element bound its own text


def test_a_sync_session_maps_steps_too(live_server: LiveServer) -> None:
    """connect_sync declares the same maps, pipelines included, as the async Session: the
    same texts as the async map of the same steps."""
    files = ["a festival", "parser.py"]

    def declare(app: Any) -> tuple[Any, Any]:
        items = app.variable(json.dumps(files))
        element = app.new_variable(name="element")
        steps = app.map_steps(element)
        code = steps.call(["Write about ", element, ":\n", Gen(max_tokens=6)])
        steps.call(["Review ", element, ":\n", code, "\nNotes:", Gen(max_tokens=4)])
        single = app.map(items, element, ["Name ", element, ":", Gen(max_tokens=3)])
        return app.map_pipeline(items, steps, step_outputs=True), single

    with connect_sync(live_server.url, token=live_server.token) as app:
        (mapped, (codes,)), single = declare(app)
        synced = app.get_many([mapped, codes, single])

    async def asynced() -> list[str]:
        async with connect(live_server.url, token=live_server.token) as app:
            (mapped, (codes,)), single = declare(app)
            return await app.aget_many([mapped, codes, single])

    assert synced == asyncio.run(asynced())
    assert len(json.loads(synced[0])) == len(json.loads(synced[2])) == 2


async def test_switch_runs_the_taken_branch_and_retract_takes_back(
    live_server: LiveServer,
) -> None:
    """Session.switch: the router's literal picks the branch, the other answers skipped,
    aget_settled returns both in one frame; retract takes back declarations not shipped."""
    async with connect(live_server.url, token=live_server.token) as app:
        choices = ["left", "right"]
        (route,) = app.call(
            ["Pick a side:", Gen(max_tokens=4, structured_outputs={"choice": choices})]
        )
        (left,) = app.call(["Go left with ", route, ":", Gen(max_tokens=4)])
        (right,) = app.call(["Go right with ", route, ":", Gen(max_tokens=4)])
        (dropped,) = app.call(["never shipped", Gen(max_tokens=4)])
        assert app.retract([dropped]) == 1
        app.switch(route, {"left": [left], "right": [right]})
        before = app.num_frames_sent
        texts = await app.aget_settled([route, left, right])
        assert app.num_frames_sent - before == 1
        taken, skipped = (1, 2) if texts[0] == "left" else (2, 1)
        assert texts[0] in choices and isinstance(texts[taken], str)
        failure = texts[skipped]
        assert isinstance(failure, VariableFailed) and failure.code == "skipped"
        with pytest.raises(ValueError, match="not the output"):
            app.switch(route, {"left": [app.variable("constant")]})
