"""A compiled run cancelled mid-flight (Ctrl-C under ``asyncio.run``) stops at once and
stops its calls on the server, as closing an eager call's HTTP request aborts it; its model
callbacks are not replayed, since replaying them would first wait for those calls."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from lc_helpers import metric

from eclectus.adapters.langchain import ChatEclectus, compile
from eclectus.server.front.app import EclectusServer


class Recorder(BaseCallbackHandler):
    """The model events a handler sees, by name."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def on_chat_model_start(self, *args: Any, **kwargs: Any) -> None:
        self.events.append("start")

    def on_llm_end(self, *args: Any, **kwargs: Any) -> None:
        self.events.append("end")

    def on_llm_error(self, *args: Any, **kwargs: Any) -> None:
        self.events.append("error")


async def test_cancelled_compiled_run_stops_its_calls_without_waiting(
    eclectus_server: EclectusServer,
) -> None:
    # ~1,000 decode steps: seconds of work the cancelled run must not wait for
    model = ChatEclectus(max_tokens=1000, temperature=0, model_kwargs={"ignore_eos": True})
    chain = ChatPromptTemplate.from_messages([("human", "Tell a story about {x}.")]) | model
    recorder = Recorder()
    compiled = compile(chain | StrOutputParser())
    task = asyncio.create_task(compiled.ainvoke({"x": "a fox"}, {"callbacks": [recorder]}))
    finished = metric(eclectus_server, "eclectus_calls_finished_total")
    await asyncio.sleep(0.5)  # the graph is on the server, its call decoding
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert recorder.events == []  # nothing replayed: replaying meant waiting for the call
    # the run ended before its call did: cancelling did not wait for the call to finish
    assert metric(eclectus_server, "eclectus_calls_finished_total") == finished
    for _ in range(20):  # the cancel frame was acknowledged; the engine drops the request
        if metric(eclectus_server, "eclectus_engine_running") == 0:
            break
        await asyncio.sleep(0.05)
    assert metric(eclectus_server, "eclectus_engine_running") == 0
