"""The served model's chat template on every path that renders chat messages: ``chat()``,
the ``messages_to_prompt`` hook itself, and the chat prompt templates (ChatPromptTemplate,
a chat RichPromptTemplate, a SelectorPromptTemplate over one) that LlamaIndex formats with
the hook in ``LLM._get_prompt`` when ``predict``/``stream`` get one.

The server serves tiny's weights and tokenizer with a ChatML-like template in its
``tokenizer_config.json``, so a prompt in tiny's built-in template would be caught.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from engine_probe import engine_prompts
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.prompts import (
    BasePromptTemplate,
    ChatPromptTemplate,
    RichPromptTemplate,
    SelectorPromptTemplate,
)
from llamaindex_support import TEST_MAX_TOKENS

from eclectus.adapters.llamaindex import Eclectus
from eclectus.adapters.llamaindex.prompts import ServedChatTemplate
from eclectus.models.presets import export_model
from eclectus.server.config import ServerConfig
from eclectus.server.front.app import EclectusServer, serve_in_thread

CHATML = (
    "{{ bos_token }}{% for m in messages %}"
    "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SYSTEM = "Be brief."
QUESTION = "What is rain?"
MESSAGES = [
    ChatMessage(role=MessageRole.SYSTEM, content=SYSTEM),
    ChatMessage(role=MessageRole.USER, content=f"Q: {QUESTION}"),
]
CHAT_TEMPLATE = ChatPromptTemplate.from_messages([("system", SYSTEM), ("user", "Q: {question}")])
TEMPLATES: dict[str, BasePromptTemplate] = {
    "chat": CHAT_TEMPLATE,
    "rich": RichPromptTemplate(
        f"{{% chat role='system' %}}{SYSTEM}{{% endchat %}}"
        "{% chat role='user' %}Q: {{ question }}{% endchat %}"
    ),
    "selector": SelectorPromptTemplate(default_template=CHAT_TEMPLATE),
}


@pytest.fixture(scope="module")
def chatml_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EclectusServer]:
    """tiny's weights and tokenizer, with CHATML as the directory's chat template."""
    model_dir = export_model("tiny", tmp_path_factory.mktemp("chatml"))
    config_file = model_dir / "tokenizer_config.json"
    config_file.write_text(
        json.dumps(json.loads(config_file.read_text()) | {"chat_template": CHATML})
    )
    with serve_in_thread(ServerConfig(port=0, model=str(Path(model_dir)))) as server:
        yield server


@pytest.fixture
def chatml_llm(chatml_server: EclectusServer) -> Iterator[Eclectus]:
    model = Eclectus(url=chatml_server.url, max_tokens=TEST_MAX_TOKENS)
    yield model
    model.close()


def server_render(server: EclectusServer, messages: list[ChatMessage]) -> str:
    """The prompt the server's own tokenizer renders for ``messages``."""
    dicts = [{"role": m.role.value, "content": m.content or ""} for m in messages]
    return server.ctx.front.tokenizer.apply_chat_template(dicts)


def test_hook_renders_the_served_template(
    chatml_server: EclectusServer, chatml_llm: Eclectus
) -> None:
    """``llm.messages_to_prompt``, called the way LlamaIndex calls it (messages only), is
    the server's render of the served template, BOS text included."""
    expected = server_render(chatml_server, MESSAGES)
    assert expected.startswith("<s><|im_start|>system\nBe brief.<|im_end|>\n")
    assert isinstance(chatml_llm.messages_to_prompt, ServedChatTemplate)
    assert chatml_llm.messages_to_prompt(MESSAGES) == expected


def test_hook_renders_the_builtin_template_of_tiny(server: EclectusServer, llm: Eclectus) -> None:
    """With the built-in model the hook is the server's render too (its default template)."""
    assert llm.messages_to_prompt(MESSAGES) == server_render(server, MESSAGES)


@pytest.mark.parametrize("kind", sorted(TEMPLATES))
def test_chat_prompt_templates_render_the_served_template(
    chatml_server: EclectusServer, chatml_llm: Eclectus, kind: str
) -> None:
    """LlamaIndex's own formatting of a chat prompt template for this LLM (``_get_prompt``,
    which passes the hook) gives the server's render, and ``predict`` sends exactly that,
    with the variable's value its own segment."""
    template = TEMPLATES[kind]
    expected = server_render(chatml_server, MESSAGES)
    assert chatml_llm._get_prompt(template, question=QUESTION) == expected
    with engine_prompts(chatml_server) as seen:
        answer = chatml_llm.predict(template, question=QUESTION)
    (segments,) = seen
    assert "".join(segments) == expected
    assert QUESTION in segments
    assert seen.add_special_tokens == [False]
    assert answer == stock_chat(chatml_server, MESSAGES)


def stock_chat(server: EclectusServer, messages: list[ChatMessage]) -> str:
    """The greedy answer the stock ``openai`` client gets from /v1/chat/completions on the
    same server (the server renders the template and adds no special token): what the
    LlamaIndex chat path must answer too."""
    client = openai.OpenAI(base_url=server.openai_url, api_key="x")
    reply = client.chat.completions.create(
        model=server.model.name,
        messages=[{"role": m.role.value, "content": m.content or ""} for m in messages],
        max_tokens=TEST_MAX_TOKENS,
        temperature=0,
    )
    return reply.choices[0].message.content or ""


async def test_streaming_and_async_predict_use_it_too(
    chatml_server: EclectusServer, chatml_llm: Eclectus
) -> None:
    """``apredict``, ``stream`` and ``astream`` render a chat template the same way."""
    expected = server_render(chatml_server, MESSAGES)
    with engine_prompts(chatml_server) as seen:
        await chatml_llm.apredict(CHAT_TEMPLATE, question=QUESTION)
        "".join(chatml_llm.stream(CHAT_TEMPLATE, question=QUESTION))
        _ = [t async for t in await chatml_llm.astream(CHAT_TEMPLATE, question=QUESTION)]
    assert ["".join(segments) for segments in seen] == [expected] * 3


def test_chat_and_the_hook_agree(chatml_server: EclectusServer, chatml_llm: Eclectus) -> None:
    """``chat()`` sends the hook's string (cut at message boundaries) and answers as
    completing it does."""
    expected = chatml_llm.messages_to_prompt(MESSAGES)
    with engine_prompts(chatml_server) as seen:
        answer = chatml_llm.chat(MESSAGES).message.content
    (segments,) = seen
    assert "".join(segments) == expected
    assert SYSTEM in segments and f"Q: {QUESTION}" in segments
    assert seen.add_special_tokens == [False]
    assert answer == stock_chat(chatml_server, MESSAGES)


def test_a_custom_hook_is_kept(chatml_server: EclectusServer) -> None:
    """A ``messages_to_prompt`` the user passes renders every path, as one text segment."""

    def shout(messages: list[ChatMessage]) -> str:
        return "".join(f"{m.role.value.upper()}: {m.content}\n" for m in messages) + "BOT:"

    custom = Eclectus(url=chatml_server.url, max_tokens=2, messages_to_prompt=shout)
    try:
        assert custom.messages_to_prompt is shout
        with engine_prompts(chatml_server) as seen:
            custom.chat(MESSAGES)
            custom.predict(CHAT_TEMPLATE, question=QUESTION)
        assert seen[0] == (shout(MESSAGES),)
        assert "".join(seen[1]) == shout(MESSAGES)
    finally:
        custom.close()
