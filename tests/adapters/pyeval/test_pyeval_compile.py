"""``compile(fn)`` on a real server (built-in engine, ``tiny``, greedy): a plain app
function's results equal the eager function's; its model calls, the Python around them
that the table covers, and only a fetch per decision on model output are frames; side
effects happen as often and in the same order; ``explain()`` names every break."""

# App code written the ways apps write it (%-formatting, str.format, if/else blocks):
# ruff: noqa: UP031, UP032, SIM108, SIM300

from __future__ import annotations

import asyncio
import json
from typing import Any, TypedDict

import pytest
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate, PromptTemplate
from langchain_core.tools import tool
from pydantic import BaseModel, Field

from eclectus.adapters.langchain import ChatEclectus, EclectusLLM, compile
from eclectus.server.front.app import EclectusServer

LOG: list[Any] = []


@pytest.fixture
def llm(eclectus_server: EclectusServer) -> ChatEclectus:
    return ChatEclectus(max_tokens=6, temperature=0, model_kwargs={"ignore_eos": True})


def server_frames(server: EclectusServer) -> int:
    return server.ctx.metrics.client_frames


# -- map-reduce: abatch, a Python join, ainvoke -------------------------------------------


def map_reduce_app(llm: ChatEclectus) -> Any:
    summarize = (
        ChatPromptTemplate.from_template("Summarize this part of a report:\n{chunk}")
        | llm
        | StrOutputParser()
    )
    combine = (
        PromptTemplate.from_template("Combine these summaries:\n{summaries}")
        | llm
        | StrOutputParser()
    )

    async def summarize_all(chunks: list[str]) -> str:
        summaries = await summarize.abatch([{"chunk": c} for c in chunks])
        joined = "\n\n".join(summaries)
        return await combine.ainvoke({"summaries": joined})

    return summarize_all


@pytest.mark.parametrize("width", [2, 6])
def test_a_map_reduce_app_function_is_one_frame(llm: ChatEclectus, width: int) -> None:
    app = map_reduce_app(llm)
    chunks = [f"Part {i}: the harbor reopened." for i in range(width)]
    eager = asyncio.run(app(chunks))
    fast = compile(app)
    assert asyncio.run(fast(chunks)) == eager
    assert fast.last_frames == 1, fast.explain()
    trace = fast.last_graph
    assert trace is not None and trace.num_calls == width + 1 and not trace.breaks


def test_last_frames_is_what_the_server_counted(
    llm: ChatEclectus, eclectus_server: EclectusServer
) -> None:
    """The frames a compiled call reports are the frames the server received."""
    fast = compile(map_reduce_app(llm))
    asyncio.run(fast(["warm the session up"]))
    for chunks in (["a", "b"], ["c", "d", "e"]):
        before = server_frames(eclectus_server)
        asyncio.run(fast(chunks))
        assert server_frames(eclectus_server) - before == fast.last_frames == 1


# -- text on the server ---------------------------------------------------------------------


def text_ops_app(llm: ChatEclectus) -> Any:
    def shaped(topic: str) -> dict[str, Any]:
        reply = llm.invoke(f"Write about {topic}:\n").content
        other = llm.invoke([("system", "Be brief."), ("human", f"Name a {topic}.")]).content
        cut = reply[2:9]
        return {
            "plain": reply,
            "stripped": reply.strip(),
            "loud": f"[{reply.upper()}]",
            "low": other.lower().rstrip(" .")[::-1],
            "replaced": reply.replace(" ", "_", 3),
            "cut": cut,
            "spec": f"{cut:*^12}|{cut!r}",
            "percent": "%s and %r" % (reply, other),
            "format": "{0} / {w}".format(reply, w=other),
            "joined": " + ".join([reply, topic, other]),
            "listed": str([reply, other]),
            "concat": reply + "|" + other,
            "is_str": isinstance(reply, str),
        }

    return shaped


def test_string_operations_run_on_the_server(llm: ChatEclectus) -> None:
    """Every operation of the table on model text gives Python's string; none fetches."""
    app = text_ops_app(llm)
    eager = app("owls")
    fast = compile(app)
    assert fast("owls") == eager
    trace = fast.last_graph
    assert trace is not None and not trace.breaks and fast.last_frames == 1, fast.explain()
    rendered = trace.render()
    for op in ("strip", "upper", "replace", "slice", "format", "repr", "repr_list"):
        assert op in rendered


# -- decisions: graph breaks ------------------------------------------------------------------


def deciding_app(llm: ChatEclectus) -> Any:
    def decide(topic: str) -> list[Any]:
        first = llm.invoke(f"Write about {topic}:\n").content
        second = llm.invoke(f"Now about {topic}s:\n").content  # declared before the fetch
        words = first.split()  # not in the table: a break
        if len(second) > 10:  # a decision on the other reply: a second break
            tail = llm.invoke(f"Continue:\n{second}").content
        else:
            tail = "short"
        return [len(words), tail.strip()]

    return decide


def test_each_decision_is_a_break_named_by_explain(llm: ChatEclectus) -> None:
    app = deciding_app(llm)
    eager = app("rain")
    fast = compile(app)
    assert fast("rain") == eager
    trace = fast.last_graph
    assert trace is not None and len(trace.breaks) == 2
    wheres = [where for where, _ in trace.breaks]
    assert all(where.startswith("deciding_app.<locals>.decide line ") for where in wheres)
    text = fast.explain()
    assert "str.split of a server value" in text and "len() of a server value" in text
    assert fast.last_frames == 3  # two breaks and the final fetch


# -- structured output ----------------------------------------------------------------------


class Plan(BaseModel):
    title: str = Field(max_length=16)
    steps: list[str] = Field(min_length=2, max_length=2)
    pick: int = Field(ge=0, le=1)


class Loose(TypedDict):
    note: str


def structured_app(llm: ChatEclectus) -> Any:
    planner = llm.model_copy(update={"max_tokens": 64}).with_structured_output(Plan)
    loose = llm.model_copy(update={"max_tokens": 24}).with_structured_output(Loose)

    def plan(goal: str) -> dict[str, Any]:
        result = planner.invoke(f"Plan for {goal}:")
        steps = result.steps
        chosen = steps[result.pick]  # a bounded index: an op
        note = loose.invoke(f"A note on {goal}:")["note"]  # a dict's key: a field op
        return {
            "title": result.title.strip(),
            "count": len(steps),  # the schema fixes it
            "first": f"1. {steps[0]}",
            "chosen": chosen,
            "note": note.upper(),
            "pick": result.pick,  # an int: parsed on the client
            "model": isinstance(result, Plan),
        }

    return plan


def test_fields_of_a_structured_output_stay_on_the_server(llm: ChatEclectus) -> None:
    app = structured_app(llm)
    eager = app("a shed")
    fast = compile(app)
    assert fast("a shed") == eager
    trace = fast.last_graph
    assert trace is not None and not trace.breaks and fast.last_frames == 1, fast.explain()
    assert "json_field ['steps']" not in trace.render()  # the list itself is never read
    assert "index into 2 item(s)" in trace.render()


def test_reading_a_structured_output_the_wrong_way_raises_as_python(llm: ChatEclectus) -> None:
    """Attribute access on a dict parse: fetched, then Python raises AttributeError."""
    loose = llm.model_copy(update={"max_tokens": 24}).with_structured_output(Loose)

    def wrong(goal: str) -> str:
        return loose.invoke(f"A note on {goal}:").note

    with pytest.raises(AttributeError) as eager:
        wrong("x")
    with pytest.raises(AttributeError) as compiled:
        compile(wrong)("x")
    assert str(compiled.value) == str(eager.value)


class Titled(BaseModel):
    title: str = Field(max_length=12)


def titled_app(llm: ChatEclectus) -> Any:
    titler = llm.model_copy(update={"max_tokens": 32}).with_structured_output(Titled)

    def title(topic: str) -> dict[str, Any]:
        reply = titler.invoke(f"A title for {topic}:")
        heading = f"# {reply.title}"  # a string field in an f-string: a json_field op
        size = "long" if len(heading) > 8 else "short"  # a decision on it: a break
        return {"heading": heading, "size": size, "reply": reply}

    return title


def test_a_break_on_a_field_fetches_its_reply_in_the_same_frame(
    llm: ChatEclectus, eclectus_server: EclectusServer
) -> None:
    """The break reads the field's server op and the result holds the whole reply: one
    frame gets both, so the final fetch sends none (the server counted one frame too)."""
    app = titled_app(llm)
    eager = app("a shed")
    fast = compile(app)
    fast("a warm-up")  # the session's first frames (its hello) are not the run's
    before = server_frames(eclectus_server)
    assert fast("a shed") == eager
    assert server_frames(eclectus_server) - before == fast.last_frames == 1, fast.explain()
    trace = fast.last_graph
    assert trace is not None and len(trace.breaks) == 1
    assert "json_field ['title']" in trace.render()
    assert "titled_app.<locals>.title line " in fast.explain()
    assert "len() of a server value" in fast.explain()


# -- side effects ---------------------------------------------------------------------------


@tool
def word_count(text: str) -> int:
    """How many words a text has."""
    LOG.append(("tool", text))
    return len(text.split())


def effects_app(llm: ChatEclectus) -> Any:
    def effects(topic: str) -> dict[str, Any]:
        LOG.append("start")
        reply = llm.invoke(f"Write about {topic}:\n").content
        seen = []
        seen.append(reply)  # a list the function made: no fetch
        print("reply:", reply)  # a break: print reads it
        LOG.append(("after print", len(seen)))
        count = word_count.invoke({"text": reply})  # a client tool call
        LOG.append(reply)  # the app's own list: gets the text
        return {"seen": seen, "count": count}

    return effects


def test_side_effects_run_once_in_order(llm: ChatEclectus, capsys: pytest.CaptureFixture) -> None:
    app = effects_app(llm)
    LOG.clear()
    eager = app("bees")
    eager_log, eager_out = list(LOG), capsys.readouterr().out
    LOG.clear()
    fast = compile(app)
    assert fast("bees") == eager
    assert LOG == eager_log and capsys.readouterr().out == eager_out
    assert all(isinstance(item, str | tuple) for item in LOG)  # nothing symbolic leaked
    assert fast.last_frames == 1  # the print's fetch; the rest was known by then


# -- what runs as Python --------------------------------------------------------------------


def guarded(llm: ChatEclectus, text: str) -> str:
    LOG.append("guarded")
    try:
        return json.loads(text)["x"]
    except ValueError:
        return llm.invoke(f"Fix:\n{text}").content


def unsupported_app(llm: ChatEclectus) -> Any:
    def caller(topic: str) -> str:
        reply = llm.invoke(f"Write about {topic}:\n").content
        fixed = guarded(llm, reply)  # a helper with a try: Python, its argument fetched
        return fixed.strip()

    return caller


def test_a_helper_the_evaluator_does_not_implement_runs_as_python(llm: ChatEclectus) -> None:
    """Its argument is fetched (a break), it runs once, its own eager model call is a
    frame of the run too."""
    app = unsupported_app(llm)
    LOG.clear()
    eager = app("ink")
    fast = compile(app)
    LOG.clear()
    assert fast(text := "ink") == eager and LOG == ["guarded"]
    assert text == "ink"
    trace = fast.last_graph
    assert trace is not None and len(trace.breaks) == 1
    assert "a try statement" in trace.render()
    assert fast.last_frames >= 2  # the break, and the helper's own call


def whole_try(llm: ChatEclectus) -> Any:
    def app(topic: str) -> str:
        LOG.append("ran")
        try:
            return llm.invoke(f"Write about {topic}:\n").content
        finally:
            LOG.append("done")

    return app


def test_a_function_with_a_try_runs_as_python_whole(llm: ChatEclectus) -> None:
    app = whole_try(llm)
    LOG.clear()
    eager = app("moss")
    LOG.clear()
    fast = compile(app)
    assert fast("moss") == eager and LOG == ["ran", "done"]
    assert "runs as Python (line" in fast.explain() and "a try statement" in fast.explain()
    assert fast.last_frames == 1  # its own eager call, counted


def helper_text(llm: ChatEclectus, topic: str, depth: int) -> str:
    if depth == 0:
        return llm.invoke(f"Write about {topic}:\n").content
    return helper_text(llm, topic, depth - 1).strip() + "!"


@pytest.mark.parametrize("depth", [2, 12])
def test_helpers_are_evaluated_within_a_depth_limit(llm: ChatEclectus, depth: int) -> None:
    """A recursive helper of the app is evaluated (no frame but the final one) down to the
    limit; deeper, it runs as Python, exactly."""

    def app(topic: str) -> str:
        return helper_text(llm, topic, depth)

    eager = app("fog")
    fast = compile(app)
    assert fast("fog") == eager
    assert fast.last_frames == 1


def test_a_call_that_does_not_bind_raises_pythons_error(llm: ChatEclectus) -> None:
    app = text_ops_app(llm)
    with pytest.raises(TypeError) as eager:
        app()  # type: ignore[call-arg]
    with pytest.raises(TypeError) as compiled:
        compile(app)()
    assert str(compiled.value) == str(eager.value)


def test_a_completion_model_and_a_sync_batch(eclectus_server: EclectusServer) -> None:
    llm = EclectusLLM(max_tokens=6, temperature=0, model_kwargs={"ignore_eos": True})

    def app(words: list[str]) -> str:
        outs = llm.batch([f"Say {w}:\n" for w in words])
        return "/".join(o.strip() for o in outs)

    eager = app(["yes", "no", "maybe"])
    fast = compile(app)
    assert fast(["yes", "no", "maybe"]) == eager and fast.last_frames == 1


def test_compile_needs_a_model() -> None:
    def no_model(x: str) -> str:
        return x

    with pytest.raises(ValueError, match="needs a ChatEclectus or EclectusLLM"):
        compile(no_model)


def test_asyncio_inside_an_async_function(llm: ChatEclectus) -> None:
    """create_task and get_running_loop reach the run's loop; a coroutine the evaluator
    holds is awaited once, as Python's."""

    async def app(topic: str) -> list[Any]:
        loop = asyncio.get_running_loop()
        task = asyncio.create_task(asyncio.sleep(0, result="slept"))
        reply = llm.ainvoke(f"Write about {topic}:\n")
        text = (await reply).content
        return [await task, text.strip(), loop is asyncio.get_running_loop()]

    eager = asyncio.run(app("moths"))
    assert asyncio.run(compile(app)("moths")) == eager

    async def twice(topic: str) -> Any:
        reply = llm.ainvoke(topic)
        await reply
        return await reply

    with pytest.raises(RuntimeError, match="cannot reuse already awaited coroutine"):
        asyncio.run(twice("x"))
    with pytest.raises(RuntimeError, match="cannot reuse already awaited coroutine"):
        asyncio.run(compile(twice)("x"))


def test_prompt_templates_over_model_output(llm: ChatEclectus) -> None:
    """A template's format / format_messages / format_prompt / invoke with a reply in it
    are prompt pieces: the next calls read it on the server."""
    text = PromptTemplate.from_template("Rewrite this:\n{draft}")
    chat = ChatPromptTemplate.from_messages([("system", "Be brief."), ("human", "Fix:\n{draft}")])

    def app(topic: str) -> list[str]:
        draft = llm.invoke(f"Write about {topic}:\n").content
        outs = [
            llm.invoke(text.format(draft=draft)).content,
            llm.invoke(text.format_prompt(draft=draft)).content,
            llm.invoke(chat.format_messages(draft=draft)).content,
            llm.invoke(chat.invoke({"draft": draft})).content,
        ]
        return [o.strip() for o in outs]

    eager = app("gulls")
    fast = compile(app)
    assert fast("gulls") == eager
    assert fast.last_frames == 1 and not fast.last_graph.breaks, fast.explain()  # type: ignore[union-attr]
