"""A generated corpus: small app functions drawn from a grammar of what the evaluator
supports (model calls, f-strings, ``+``, ``%``, ``format``, ``join``, strip/upper/replace,
slices, ``str``/``repr``, appends to a list of its own) mixed with what must break (a
comparison, ``in``, ``len``, a truth test, ``split``, an unknown call, a note into the
app's own list) and with constructs that make the whole function Python (``try``).

Compiled and eager give the same result, the same side effects in the same order, the
same prompts to the model (seen by a callback), and the compiled run sends at most one
frame per break plus one. Each call site's model is held to one literal (a ``choice`` of
one), so outputs do not depend on how a prompt tokenizes: the prompts are checked by the
callback instead.
"""

from __future__ import annotations

import builtins
import json
import linecache
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.runnables.config import var_child_runnable_config

from eclectus.adapters.langchain import ChatEclectus, compile
from eclectus.server.front.app import EclectusServer

LITERALS = ['  Tide\'s "high"? ', "Moon\nrise!", "ok", "e.e. cummings"]
EFFECTS: list[Any] = []


def note(value: Any) -> None:
    EFFECTS.append(value)


class Prompts(BaseCallbackHandler):
    """The text of every message each model call received."""

    def __init__(self) -> None:
        self.seen: list[list[str]] = []

    def on_chat_model_start(self, serialized: Any, messages: Any, **kwargs: Any) -> None:
        self.seen += [[str(m.content) for m in batch] for batch in messages]


@pytest.fixture(scope="module")
def models(eclectus_server: EclectusServer) -> dict[str, Any]:
    llm = ChatEclectus(max_tokens=16, temperature=0)
    asks = {
        f"ask{i}": llm.bind(extra_body={"structured_outputs": {"choice": [text]}})
        for i, text in enumerate(LITERALS)
    }
    return {**asks, "note": note, "json": json}


NAMES = ["topic", "a", "b", "c"]


@st.composite
def text(draw: st.DrawFn, depth: int = 2) -> str:
    """A str expression over the names (each holding a str)."""
    leaf = st.sampled_from([*NAMES, "'x'", "'Q: '", "'\\n'"])
    if depth == 0:
        return draw(leaf)
    inner = text(depth=depth - 1)
    kinds = [
        leaf,
        st.builds(lambda x: f'f"<{{{x}}}>\\n"', st.sampled_from(NAMES)),  # 3.11: names only
        st.builds(lambda x, y: f"({x} + {y})", inner, inner),
        st.builds(lambda x: f"{x}.strip()", inner),
        st.builds(lambda x: f"{x}.upper()", inner),
        st.builds(lambda x: f"{x}.replace('e', 'E')", inner),
        st.builds(lambda x: f"{x}[1:4]", inner),
        st.builds(lambda x, y: f"'-'.join([{x}, {y}])", inner, inner),
        st.builds(lambda x: f"str({x})", inner),
        st.builds(lambda x: f"repr({x})", inner),
        st.builds(lambda x: f'f"{{{x}!r:>6}}"', st.sampled_from(NAMES)),
        st.builds(lambda x, y: f"'%s/%r' % ({x}, {y})", inner, inner),
        st.builds(lambda x, y: f"'{{}}|{{}}'.format({x}, {y})", inner, inner),
        st.builds(lambda x, y: f"({x} or {y})", inner, inner),  # a truth test: a break
    ]
    return draw(st.one_of(kinds))


CONDITIONS = st.one_of(
    st.builds(lambda x: f"'e' in {x}", text(depth=1)),
    st.builds(lambda x: f"{x} == 'ok'", text(depth=1)),
    st.builds(lambda x: f"len({x}) > 6", text(depth=1)),
)


def statement(target: str) -> st.SearchStrategy[str]:
    call = st.builds(
        lambda k, p: f"{target} = ask{k}.invoke({p}).content", st.integers(0, 3), text()
    )
    return st.one_of(
        call,
        call,
        st.builds(lambda x: f"{target} = {x}", text()),
        st.builds(lambda x: f"log.append({x})", text()),
        st.builds(lambda x: f"note({x})", text(depth=1)),
        st.builds(lambda c: f"if {c}:\n    note('then')\nelse:\n    note('else')", CONDITIONS),
        st.builds(lambda x: f"for w in {x}.split():\n    note(w)", text(depth=1)),
        st.builds(lambda x: f"{target} = json.dumps({x})", text(depth=1)),
    )


@st.composite
def programs(draw: st.DrawFn) -> list[str]:
    body = ["a = b = c = topic", "log = []"]
    for _ in range(draw(st.integers(1, 6))):
        body.append(draw(statement(draw(st.sampled_from(["a", "b", "c"])))))
    return body


_NUM = 0


def define(body: list[str], namespace: dict[str, Any]) -> Any:
    """``program(topic)`` of ``body``, its source readable by the evaluator (linecache)."""
    global _NUM
    _NUM += 1
    filename = f"<pyeval-symbolic-corpus-{_NUM}>.py"
    lines = ["def program(topic):", *(textwrap.indent(s, "    ") for s in body)]
    lines += ["    return {'a': a, 'b': b, 'c': c, 'log': log}", ""]
    source = "\n".join(lines)
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    scope = {**namespace, "__name__": "pyeval_symbolic_corpus"}
    exec(compile_source(source, filename), scope)
    return scope["program"]


def compile_source(source: str, filename: str) -> Any:
    return builtins.compile(source, filename, "exec")


def outcome(run: Any) -> Iterator[Any]:
    """The run's result (or exception), its side effects and the prompts it sent."""
    prompts = Prompts()
    EFFECTS.clear()
    token = var_child_runnable_config.set({"callbacks": [prompts]})
    try:
        yield ("value", run())
    except Exception as exc:
        yield ("raised", type(exc).__name__, str(exc))
    finally:
        var_child_runnable_config.reset(token)
    yield list(EFFECTS)
    yield sorted(prompts.seen)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(programs(), st.booleans())
def test_generated_programs_compile_to_their_eager_results(
    models: dict[str, Any], body: list[str], wrapped: bool
) -> None:
    if wrapped:  # a try around it all: the whole function runs as Python
        body = ["try:", *(textwrap.indent(s, "    ") for s in body), "finally:", "    pass"]
    program = define(body, models)
    eager = list(outcome(lambda: program("tides")))
    fast = compile(program, model=models["ask0"].bound)
    compiled = list(outcome(lambda: fast("tides")))
    assert compiled == eager, "\n".join(body)
    trace = fast.last_graph
    assert trace is not None
    if wrapped:
        assert not trace.breaks and "a try statement" in fast.explain()
    else:
        assert fast.last_frames <= len(trace.breaks) + 1, fast.explain()
