"""eclectus.protocol.chat_template: transformers-equal rendering, pieces spliced at markers."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from eclectus.protocol.chat_template import (
    DEFAULT_CHAT_TEMPLATE,
    ChatTemplateError,
    render_chat,
    render_chat_pieces,
    template_tool_call,
)

# Llama-3-shaped: BOS from template vars, headers, content trimmed
LLAMA3 = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' "
    "+ message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)
# ChatML / Qwen-shaped, with a default system message when none is given
CHATML = (
    "{% if messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are helpful.<|im_end|>\n' }}{% endif %}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
VARS = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}


@dataclass(frozen=True)
class Var:
    """An opaque variable piece; ``text`` None: known only on the server."""

    text: str | None


def text_of(piece: Var) -> str | None:
    return piece.text


def joined(pieces: list[str | Var]) -> str:
    return "".join(p if isinstance(p, str) else p.text or "" for p in pieces)


def as_dicts(messages: list[tuple[str, list[str | Var]]]) -> list[dict[str, str]]:
    return [{"role": r, "content": joined(p)} for r, p in messages]


@pytest.mark.parametrize("template", [LLAMA3, CHATML, DEFAULT_CHAT_TEMPLATE])
def test_pieces_splice_into_the_exact_render(template: str) -> None:
    """Every piece is kept as given, in order, and the pieces join to the flat render."""
    doc = Var("the document")
    messages: list[tuple[str, list[str | Var]]] = [
        ("system", ["Answer briefly."]),
        ("user", ["Summarize: ", doc, " now"]),
    ]
    out = render_chat_pieces(template, messages, text_of=text_of, template_vars=VARS)
    assert joined(out) == render_chat(template, as_dicts(messages), template_vars=VARS)
    assert [p for p in out if isinstance(p, Var)] == [doc]
    index = out.index(doc)
    assert out[index - 1] == "Summarize: " and out[index + 1] == " now"
    assert "Answer briefly." in out


def test_llama3_render_starts_with_bos_and_ends_with_the_header() -> None:
    text = render_chat(LLAMA3, [{"role": "user", "content": " hi "}], template_vars=VARS)
    assert text == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert not render_chat(
        LLAMA3, [{"role": "user", "content": "hi"}], template_vars=VARS, add_generation_prompt=False
    ).endswith("\n\n")


def test_default_template_gives_the_role_blocks() -> None:
    out = render_chat_pieces(None, [("user", ["a", Var("b")])], text_of=text_of)
    assert out[0] == "<|user|>\n" and out[1:3] == ["a", Var("b")]
    assert joined(out) == "<|user|>\nab\n<|assistant|>\n"


def test_a_transformed_message_falls_back_alone() -> None:
    """``| trim`` changes content with surrounding whitespace: that message becomes plain
    text, the other keeps its pieces, and the text is still the exact render."""
    v = Var("kept")
    messages: list[tuple[str, list[str | Var]]] = [
        ("system", ["  padded  ", Var("x")]),
        ("user", [v]),
    ]
    out = render_chat_pieces(LLAMA3, messages, text_of=text_of, template_vars=VARS)
    assert joined(out) == render_chat(LLAMA3, as_dicts(messages), template_vars=VARS)
    assert Var("x") not in out and "  padded  " not in out
    assert v in out


def test_a_template_that_repeats_content_falls_back_to_one_piece() -> None:
    template = "{% for m in messages %}{{ m['content'] }}|{{ m['content'] }}{% endfor %}"
    messages: list[tuple[str, list[str | Var]]] = [("user", ["a", Var("b")])]
    assert render_chat_pieces(template, messages, text_of=text_of) == ["ab|ab"]


def test_unknown_values_need_a_verbatim_template() -> None:
    """A server-side value cannot pass through a transforming template; a verbatim one
    splices it."""
    unknown = Var(None)
    messages: list[tuple[str, list[str | Var]]] = [("user", ["Q: ", unknown])]
    with pytest.raises(ChatTemplateError):
        render_chat_pieces(LLAMA3, messages, text_of=text_of, template_vars=VARS)
    out = render_chat_pieces(CHATML, messages, text_of=text_of)
    assert unknown in out
    assert out[0].endswith("<|im_start|>user\n") and out[1] == "Q: "  # type: ignore[union-attr]


def test_tojson_and_raise_exception_behave_like_transformers() -> None:
    template = (
        "{% if messages | length > 1 %}{{ raise_exception('one only') }}{% endif %}"
        "{{ messages[0]['content'] | tojson }}"
    )
    assert render_chat(template, [{"role": "user", "content": "<é>"}]) == '"<é>"'
    with pytest.raises(Exception, match="one only"):
        render_chat(template, [{"role": "user", "content": "a"}] * 2)


# Writes an assistant turn's tool_calls and a tool turn's tool_call_id, as tool templates do
WITH_CALLS = (
    "{% for message in messages %}{{ message['role'] + ':' + message['content'] }}"
    "{% for call in message.tool_calls or [] %}"
    "{{ '[' + call.id + ' ' + call.function.name + call.function.arguments | tojson + ']' }}"
    "{% endfor %}{% if message.tool_call_id %}{{ '(' + message.tool_call_id + ')' }}{% endif %}"
    "{{ '\n' }}{% endfor %}"
)


def test_message_fields_reach_the_template_beside_the_pieces() -> None:
    """A third item's tool_calls / tool_call_id reach the template as apply_chat_template
    passes them; the content pieces stay pieces (an unknown one included)."""
    call = template_tool_call("c1", "add", {"a": 1})
    assert call == {
        "id": "c1",
        "type": "function",
        "function": {"name": "add", "arguments": {"a": 1}},
    }
    messages = [
        ("user", ["add ", Var("1")]),
        ("assistant", ["sure"], {"tool_calls": [call]}),
        ("tool", [Var(None)], {"tool_call_id": "c1"}),
    ]
    pieces = render_chat_pieces(WITH_CALLS, messages, text_of=lambda v: v.text)
    assert Var("1") in pieces and Var(None) in pieces
    flat = "".join(p if isinstance(p, str) else (p.text or "3") for p in pieces)
    assert flat == 'user:add 1\nassistant:sure[c1 add{"a": 1}]\ntool:3(c1)\n'
    plain = [{"role": r, "content": "".join(str(x) for x in c)} for r, c, *_ in messages[:2]]
    assert "[c1" not in render_chat(WITH_CALLS, plain)  # without the fields, no calls
