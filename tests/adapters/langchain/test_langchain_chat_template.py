"""A served model with its own chat template: ChatEclectus renders the welcome's template on
the client, the engine's segments join to exactly the server tokenizer's render, message
contents stay their own segments, and the template's BOS is not doubled."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_probe import engine_prompts
from langchain_core.messages import HumanMessage, SystemMessage

from eclectus.adapters.client import connect_sync
from eclectus.adapters.langchain import ChatEclectus
from eclectus.models.presets import export_model
from eclectus.models.tiny_chat import BOS_ID
from eclectus.server.config import ServerConfig
from eclectus.server.front.app import EclectusServer, serve_in_thread

TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def chatml_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EclectusServer]:
    """tiny's weights and tokenizer, with TEMPLATE as the directory's chat template."""
    model_dir = export_model("tiny", tmp_path_factory.mktemp("chatml"))
    config_file = model_dir / "tokenizer_config.json"
    config = json.loads(config_file.read_text()) | {"chat_template": TEMPLATE}
    config_file.write_text(json.dumps(config))
    with serve_in_thread(ServerConfig(port=0, model=str(Path(model_dir)))) as server:
        yield server


def test_welcome_carries_the_template(chatml_server: EclectusServer) -> None:
    """The engine's card and the welcome a client receives both announce it."""
    card = chatml_server.model
    assert card.chat_template == TEMPLATE
    assert card.template_vars["bos_token"] == "<s>"
    session = connect_sync(chatml_server.url)
    try:
        (info,) = session.models
        assert info.chat_template == TEMPLATE
        assert info.template_vars["bos_token"] == "<s>" and info.template_vars["eos_token"]
    finally:
        session.close()


def test_chat_renders_the_served_template(chatml_server: EclectusServer) -> None:
    with engine_prompts(chatml_server) as seen:
        model = ChatEclectus(base_url=chatml_server.url, max_tokens=2, temperature=0)
        model.invoke([SystemMessage("Be brief."), HumanMessage("What is rain?")])
    (segments,) = seen
    tokenizer = chatml_server.ctx.front.tokenizer
    dicts = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is rain?"},
    ]
    expected = tokenizer.apply_chat_template(dicts)
    assert "".join(segments) == expected
    assert expected.startswith("<s><|im_start|>system\n")
    assert "Be brief." in segments and "What is rain?" in segments
    assert seen.add_special_tokens == [False]  # a chat prompt: the template's BOS only
    ids = chatml_server.ctx.front.encode(segments, add_special_tokens=False).token_ids
    assert ids.count(BOS_ID) == 1 and ids[0] == BOS_ID
