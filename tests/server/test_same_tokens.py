"""The same prompt a stock server sees: on every path a prompt's ids are the model
tokenizer's ids of the flat text, so greedy answers are transformers' greedy ``generate`` on
that text (tests/stock_reference.py), whatever the template's seams.

Three paths, each a real server over a real socket with the embedded ``tiny`` model: the
built-in engine stepped in the server's process, in its own process (``--engine-process
on``), and a remote Eclectus engine behind a front (``eclectus serve --engine-url`` at the
other's ``/v1``). The cases are seam-adversarial: a constant ending in a space, a colon, a
newline or a letter; a value starting with a space, a letter, a digit or a multi-byte
character; a seam inside a word; an output mid-template; two outputs in one template; an
output fed to a later call; a chat prompt with system and human turns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass

import pytest
import stock_reference as stock
from langchain_core.messages import HumanMessage, SystemMessage

from eclectus.adapters.client import SyncSession, connect_sync
from eclectus.adapters.langchain import ChatEclectus
from eclectus.server.backend import Backend
from eclectus.server.config import ServerConfig
from eclectus.server.front.app import EclectusServer, serve_in_thread

pytestmark = pytest.mark.slow

MAX_TOKENS = 12
SAMPLING = {"max_tokens": MAX_TOKENS, "temperature": 0}


@dataclass(frozen=True)
class Case:
    """One template, its inputs, and the flat prompt text before each output."""

    template: str
    inputs: dict[str, str]
    outputs: tuple[str, ...]


CASES = {
    "constant ends in a space, value starts with a letter": Case(
        "Q: {{q}}\nA:{{a}}", {"q": "what is two plus two"}, ("a",)
    ),
    "constant ends in a colon, value starts with a space": Case(
        "Question:{{q}}\nAnswer:{{a}}", {"q": " where is the harbor"}, ("a",)
    ),
    "constant ends in a newline": Case("Notes\n{{q}}\nSummary:{{a}}", {"q": "the ferry"}, ("a",)),
    "a seam inside a word": Case("The word is un{{q}}. Say:{{a}}", {"q": "believable"}, ("a",)),
    "value starts with a digit": Case("Count: {{q}}\nTotal:{{a}}", {"q": "42 boats"}, ("a",)),
    "value starts with a multi-byte character": Case(
        "Word:{{q}}\nMeaning:{{a}}", {"q": "é🙂 café"}, ("a",)
    ),
    "an output mid-template, then two outputs": Case(
        "Q: {{q}}\nA1:{{x}}\nA2:{{y}}", {"q": "what is two plus two"}, ("x", "y")
    ),
}


def expected_outputs(case: Case) -> dict[str, str]:
    """What a client calling a stock server once per output would get: each output's
    prompt is the flat text before it, earlier outputs entering as text."""
    answers: dict[str, str] = {}
    for name in case.outputs:
        answers[name] = stock.complete(_prompt_before(case, name, answers), MAX_TOKENS)
    return answers


def _prompt_before(case: Case, output: str, answers: dict[str, str]) -> str:
    """The flat text of ``case``'s template before ``output``: inputs and the earlier
    outputs' answers substituted (pure)."""
    head = case.template.split("{{" + output + "}}")[0]
    for name, value in {**case.inputs, **answers}.items():
        head = head.replace("{{" + name + "}}", value)
    return head


ServerMaker = Callable[[ExitStack], EclectusServer]


def builtin_engine() -> Backend:
    from eclectus.server.engine import AsyncEngine

    return AsyncEngine.from_config(model="tiny", num_kv_blocks=512)


def process_engine() -> Backend:
    from eclectus.server.engine import EngineConfig, ProcessEngine

    return ProcessEngine(EngineConfig(model="tiny", num_kv_blocks=512))


def in_process(stack: ExitStack) -> EclectusServer:
    return stack.enter_context(serve_in_thread(ServerConfig(port=0), builtin_engine))


def engine_process(stack: ExitStack) -> EclectusServer:
    return stack.enter_context(serve_in_thread(ServerConfig(port=0), process_engine))


def remote(stack: ExitStack) -> EclectusServer:
    """A front whose engine is another Eclectus, reached at its /v1 (token-id prompts)."""
    from eclectus.server.remote import RemoteConfig, build_remote_backend

    engine = stack.enter_context(serve_in_thread(ServerConfig(port=0), builtin_engine))
    config = RemoteConfig(model="tiny", engine_urls=(engine.openai_url,))
    return stack.enter_context(
        serve_in_thread(ServerConfig(port=0), lambda: build_remote_backend(config))
    )


PATHS: dict[str, ServerMaker] = {
    "in-process": in_process,
    "engine-process": engine_process,
    "remote": remote,
}


@pytest.fixture(scope="module", params=list(PATHS))
def server(request: pytest.FixtureRequest) -> Iterator[EclectusServer]:
    with ExitStack() as stack:
        yield PATHS[request.param](stack)


@pytest.fixture(scope="module")
def app(server: EclectusServer) -> Iterator[SyncSession]:
    with connect_sync(server.url) as session:
        yield session


@pytest.mark.parametrize("name", list(CASES))
def test_sdk_templates_answer_as_transformers(app: SyncSession, name: str) -> None:
    case = CASES[name]
    function = app.function(case.template, **{o: SAMPLING for o in case.outputs})
    outputs = function(**case.inputs)
    futures = outputs if isinstance(outputs, tuple) else (outputs,)
    got = {o: future.get() for o, future in zip(case.outputs, futures, strict=True)}
    assert got == expected_outputs(case)


def test_an_output_fed_to_a_later_call_enters_as_text(app: SyncSession) -> None:
    """The second call's prompt is its text with the first output's text in it, tokenized
    together, as a client re-sending the text would."""
    first = app.function("Q: {{q}}\nA:{{a}}", a=SAMPLING)
    second = app.function("Earlier:{{a}} Again, briefly:{{b}}", b=SAMPLING)
    a = first(q="where is the harbor")
    b = second(a=a)
    a_text = stock.complete("Q: where is the harbor\nA:", MAX_TOKENS)
    assert a.get() == a_text
    assert b.get() == stock.complete(f"Earlier:{a_text} Again, briefly:", MAX_TOKENS)


def test_chat_prompts_answer_as_transformers_apply_chat_template(server: EclectusServer) -> None:
    """ChatEclectus renders the chat template and the server adds no BOS: the ids are
    transformers' apply_chat_template, and so is the greedy answer."""
    model = ChatEclectus(base_url=server.url, temperature=0, max_tokens=MAX_TOKENS)
    for system, user in [
        ("You answer in one short line.", "Q: say hello"),
        ("Be brief.", "What is rain?"),
        ("You are a helpful assistant.", "Name a color"),
    ]:
        reply = model.invoke([SystemMessage(system), HumanMessage(user)])
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        assert reply.content == stock.chat(messages, MAX_TOKENS)
