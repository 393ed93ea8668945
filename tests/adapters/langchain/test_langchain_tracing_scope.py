"""The tracing hook remembers a template's boundaries only within the run tree that rendered
it: a later run, another application, or a run going on at the same time on another thread
or asyncio task never sees them (the same text there is a variable value, not template text).

Real LangChain runs with the process-wide hook (installed explicitly here: these chains hold
no Eclectus model, whose construction would install it); a lambda after the prompt looks up
what a model at that place would see."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from langchain_core.prompt_values import PromptValue
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableConfig, RunnableLambda

from eclectus.adapters.langchain import tracing
from eclectus.adapters.langchain.pieces import Piece
from eclectus.adapters.langchain.tracing import TRACER, config_run_id

BRIEF = ChatPromptTemplate.from_messages([("system", "Be brief."), ("human", "{q}")])
TEMPLATE_PIECES: list[Piece] = ["Be brief."]  # constant template text: no value piece


@pytest.fixture(autouse=True)
def _hook_installed() -> None:
    tracing.install()


def test_importing_installs_no_hook_and_a_model_installs_one() -> None:
    """Importing the adapters (LangChain, its compiler, LangGraph's) leaves LangChain's
    configure hooks as they were; the first model constructed adds the tracer's, once."""
    code = (
        "import json, langchain_core.tracers.context as c\n"
        "before = len(c._configure_hooks)\n"
        "import eclectus.adapters.langchain as lc, eclectus.adapters.langchain.tracing\n"
        "import eclectus.adapters.langgraph\n"
        "imported = len(c._configure_hooks)\n"
        "lc.ChatEclectus(base_url='ws://127.0.0.1:9'); lc.EclectusLLM(base_url='ws://127.0.0.1:9')\n"
        "names = [v.name for v, *_ in c._configure_hooks]\n"
        "print(json.dumps([before, imported, names.count('eclectus_prompt_tracer')]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    before, imported, tracers = json.loads(done.stdout.splitlines()[-1])
    assert imported == before and tracers == 1


def lookup(config: RunnableConfig) -> list[Piece] | None:
    return TRACER.pieces_for("Be brief.", config_run_id(config))


def test_a_template_is_forgotten_when_its_run_ends() -> None:
    """Within the chain the model sees the template's text as template text; a later chain
    that merely contains the same text as a message does not."""
    seen = (BRIEF | RunnableLambda(lambda _, config: lookup(config))).invoke({"q": "rain?"})
    assert seen == TEMPLATE_PIECES
    later = RunnableLambda(lambda _, config: lookup(config)).invoke("anything")
    assert later is None
    assert TRACER.pieces_for("Be brief.", None) is None


def test_concurrent_threads_do_not_share_templates() -> None:
    """Two chains at once on two threads: while the first holds its rendered template
    (its run still live), the second's lookup finds nothing."""
    rendered, looked = threading.Event(), threading.Event()

    def first(value: PromptValue, config: RunnableConfig) -> list[Piece] | None:
        rendered.set()
        assert looked.wait(30)
        return lookup(config)

    def second(_: Any, config: RunnableConfig) -> list[Piece] | None:
        assert rendered.wait(30)
        try:
            return lookup(config)
        finally:
            looked.set()

    with ThreadPoolExecutor(2) as pool:
        a = pool.submit((BRIEF | RunnableLambda(first)).invoke, {"q": "rain?"})
        b = pool.submit(RunnableLambda(second).invoke, "x")
        assert (a.result(60), b.result(60)) == (TEMPLATE_PIECES, None)


def test_concurrent_tasks_do_not_share_templates() -> None:
    """The same with two asyncio tasks on one loop."""

    async def main() -> tuple[Any, Any]:
        rendered, looked = asyncio.Event(), asyncio.Event()

        async def first(value: PromptValue, config: RunnableConfig) -> list[Piece] | None:
            rendered.set()
            await looked.wait()
            return lookup(config)

        async def second(_: Any, config: RunnableConfig) -> list[Piece] | None:
            await rendered.wait()
            try:
                return lookup(config)
            finally:
                looked.set()

        a = (BRIEF | RunnableLambda(first)).ainvoke({"q": "rain?"})
        b = RunnableLambda(second).ainvoke("x")
        return tuple(await asyncio.wait_for(asyncio.gather(a, b), 30))

    assert asyncio.run(main()) == (TEMPLATE_PIECES, None)


def test_parallel_branches_of_one_run_share_its_templates() -> None:
    """Branches of one chain (RunnableParallel runs them on threads) are one run tree: a
    prompt rendered before the fork is known in every branch."""
    look = RunnableLambda(lambda _, config: lookup(config))
    both = (BRIEF | {"a": look, "b": look}).invoke({"q": "rain?"})
    assert both == {"a": TEMPLATE_PIECES, "b": TEMPLATE_PIECES}
