"""Model callbacks of compiled runs: a real BaseCallbackHandler counts chat-model starts,
ends and their token usage; the compiled LangGraph graph and the compiled LCEL chain report
exactly what their eager runs report."""

from __future__ import annotations

from typing import Any

import lg_graphs
import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.outputs import LLMResult

from eclectus.adapters.langchain import ChatEclectus
from eclectus.adapters.langchain import compile as compile_chain
from eclectus.adapters.langgraph import compile
from eclectus.server.front.app import EclectusServer


class Counter(BaseCallbackHandler):
    """Counts model events and sums output tokens (what a cost callback sees)."""

    def __init__(self) -> None:
        self.starts: list[str] = []
        self.ends = 0
        self.output_tokens = 0
        self.errors = 0

    def on_chat_model_start(self, serialized: Any, messages: Any, **kwargs: Any) -> None:
        self.starts.append(messages[0][-1].content)

    def on_llm_end(self, response: LLMResult, **kwargs: Any) -> None:
        self.ends += 1
        for generations in response.generations:
            for generation in generations:
                usage = generation.message.usage_metadata  # type: ignore[attr-defined]
                self.output_tokens += usage["output_tokens"] if usage else 0

    def on_llm_error(self, error: BaseException, **kwargs: Any) -> None:
        self.errors += 1


@pytest.fixture
def chat(eclectus_server: EclectusServer) -> ChatEclectus:
    return ChatEclectus(max_tokens=4, temperature=0, model_kwargs={"ignore_eos": True})


def counted(run: Any) -> Counter:
    counter = Counter()
    run({"callbacks": [counter]})
    return counter


@pytest.mark.parametrize("shape", ["sequential", "python_in_the_middle", "map_reduce"])
def test_graph_callbacks_match_eager(chat: ChatEclectus, shape: str) -> None:
    """Every model call of a compiled graph reaches the handler, usage included."""
    app, value = getattr(lg_graphs, shape)(chat)
    eager = counted(lambda config: app.invoke(value, config))
    compiled = counted(lambda config: compile(app).invoke(value, config))
    assert eager.ends >= 2 and eager.output_tokens > 0
    assert (compiled.ends, compiled.output_tokens) == (eager.ends, eager.output_tokens)
    assert sorted(compiled.starts) == sorted(eager.starts)


async def test_async_graph_callbacks_match_eager(chat: ChatEclectus) -> None:
    """The async run fires them too."""
    app, value = lg_graphs.plan_execute(chat)
    eager, compiled = Counter(), Counter()
    await app.ainvoke(value, {"callbacks": [eager]})
    await compile(app).ainvoke(value, {"callbacks": [compiled]})
    assert (compiled.ends, compiled.output_tokens) == (eager.ends, eager.output_tokens)


def test_lcel_compile_reports_every_call(chat: ChatEclectus) -> None:
    """A compiled LCEL chain used to report 0 model calls; now it reports each one."""
    chain = lg_graphs.text(chat, "Q: {q}\nA:")
    chain = {"a": chain, "b": lg_graphs.text(chat, "Other: {q}")} | lg_graphs.text(
        chat, "{a} and {b}:"
    )
    eager = counted(lambda config: chain.invoke({"q": "why"}, config))
    compiled = counted(lambda config: compile_chain(chain).invoke({"q": "why"}, config))
    assert eager.ends == 3
    assert (compiled.ends, compiled.output_tokens) == (eager.ends, eager.output_tokens)
    assert sorted(compiled.starts) == sorted(eager.starts)


def test_no_handler_no_extra_frames(chat: ChatEclectus) -> None:
    """Without a handler the intermediate values stay on the server."""
    app, value = lg_graphs.map_reduce(chat)
    compiled = compile(app)
    compiled.invoke(value)
    assert compiled.last_frames == 1
    compiled.invoke(value, {"callbacks": [Counter()]})
    assert compiled.last_frames == 1


def test_a_failed_call_fires_on_llm_error() -> None:
    """A call refused by the server (its prompt over max_prompt_tokens once its generated
    input is known) reaches the handler as on_llm_error, eager and compiled alike."""
    from eclectus.server.config import ServerConfig
    from eclectus.server.front.app import serve_in_thread

    # the first prompt is ~10 of tiny's tokens, the second holds 40 generated ones
    with serve_in_thread(ServerConfig(port=0, model="tiny", max_prompt_tokens=32)) as server:
        long = ChatEclectus(
            base_url=server.url, max_tokens=40, temperature=0, model_kwargs={"ignore_eos": True}
        )
        chain = lg_graphs.text(long, "Go: {q}") | lg_graphs.text(long, "Again: {q}")
        counts = []
        for runner in (chain, compile_chain(chain)):
            counter = Counter()
            with pytest.raises(Exception, match=r"max_prompt_tokens|limit"):
                runner.invoke({"q": "x"}, {"callbacks": [counter]})
            counts.append((len(counter.starts), counter.ends, counter.errors))
    assert counts[0] == counts[1] == (2, 1, 1)
