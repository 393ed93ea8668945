"""Prompt pieces, the chat format and the constructor fields (no server needed)."""

from __future__ import annotations

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder, PromptTemplate

from eclectus.adapters.connection import ws_url
from eclectus.adapters.langchain import ChatEclectus, EclectusLLM
from eclectus.adapters.langchain.chat_format import render_chat, render_messages
from eclectus.adapters.langchain.errors import NotLowerable
from eclectus.adapters.langchain.pieces import Ref, Value, concrete_text, normalize
from eclectus.adapters.langchain.prompts import chat_prompt_messages, string_prompt_pieces
from eclectus.protocol import SamplingParams
from eclectus.protocol.chat_template import DEFAULT_CHAT_TEMPLATE


def test_fstring_pieces_split_at_variables_and_match_format() -> None:
    """f-string pieces keep constant text and values apart and join to format()'s text."""
    prompt = PromptTemplate.from_template("Doc: {doc}\n{{literal}} {n:03d} {items}")
    inputs = {"doc": "alpha", "n": 7, "items": ["a", "b"]}
    pieces = string_prompt_pieces(prompt, inputs)
    assert pieces[:3] == ["Doc: ", Value("alpha"), "\n{literal} "]
    assert concrete_text(pieces) == prompt.format(**inputs)


def test_fstring_symbolic_list_goes_through_repr_list() -> None:
    """A list holding server values renders via the list renderer (str(list) on the server)."""
    ref = Ref("v1")
    seen: list[list[object]] = []

    def render(items: list[object]) -> Ref:
        seen.append(items)
        return Ref("joined")

    prompt = PromptTemplate.from_template("S: {xs}")
    pieces = string_prompt_pieces(prompt, {"xs": [ref, "c"]}, render)
    assert seen == [[ref, "c"]]
    assert pieces[0] == "S: " and isinstance(pieces[1], Ref) and pieces[1].var == "joined"


def test_fstring_format_spec_on_server_value_is_not_lowerable() -> None:
    """A format spec over a value not known yet cannot be applied exactly on the server."""
    with pytest.raises(NotLowerable):
        string_prompt_pieces(PromptTemplate.from_template("{x!r}"), {"x": Ref("v")})


def test_mustache_escapes_concrete_values_and_refuses_escaped_refs() -> None:
    """{{x}} HTML-escapes like LangChain; {{{x}}} takes a server value verbatim."""
    prompt = PromptTemplate.from_template("A {{x}} B {{{y}}}", template_format="mustache")
    inputs = {"x": "<i>", "y": "&"}
    assert concrete_text(string_prompt_pieces(prompt, inputs)) == prompt.format(**inputs)
    ref = Ref("v")
    assert string_prompt_pieces(prompt, {"x": "1", "y": ref})[-1] is ref
    with pytest.raises(NotLowerable):
        string_prompt_pieces(prompt, {"x": ref, "y": "2"})


def test_mustache_sections_fall_back_to_langchain_formatting() -> None:
    """Sections render through LangChain when inputs are concrete (one constant piece)."""
    prompt = PromptTemplate.from_template("{{#xs}}<{{.}}>{{/xs}}", template_format="mustache")
    assert string_prompt_pieces(prompt, {"xs": ["a", "b"]}) == ["<a><b>"]


def test_jinja2_pieces_and_fallback() -> None:
    """Plain {{ name }} outputs split; loops fall back to jinja2 itself."""
    prompt = PromptTemplate.from_template("Q: {{ q }}!\n", template_format="jinja2")
    ref = Ref("v")
    assert string_prompt_pieces(prompt, {"q": ref}) == ["Q: ", ref, "!"]
    loop = PromptTemplate.from_template(
        "{% for x in xs %}{{ x }};{% endfor %}", template_format="jinja2"
    )
    assert string_prompt_pieces(loop, {"xs": ["a", "b"]}) == ["a;b;"]
    with pytest.raises(NotLowerable):
        string_prompt_pieces(loop, {"xs": [ref]})


def test_chat_prompt_messages_roles_placeholder_and_partials() -> None:
    """System/human/AI templates, a placeholder and partial variables become role pieces."""
    prompt = ChatPromptTemplate.from_messages(
        [("system", "Be {tone}"), MessagesPlaceholder("history"), ("human", "{q}"), ("ai", "ok")]
    ).partial(tone="brief")
    history = [HumanMessage("hi"), AIMessage("hello")]
    messages = chat_prompt_messages(prompt, {"history": history, "q": "why?"})
    assert [(cls, role) for cls, role, _ in messages] == [
        (SystemMessage, "system"),
        (HumanMessage, "user"),
        (AIMessage, "assistant"),
        (HumanMessage, "user"),
        (AIMessage, "assistant"),
    ]
    rendered = prompt.format_messages(history=history, q="why?")
    assert [concrete_text(p) for _, _, p in messages] == [m.content for m in rendered]


def test_render_chat_matches_the_server_default_template() -> None:
    """Client-side rendering equals the tiny model's own chat template, byte for byte."""
    messages = [SystemMessage("sys"), HumanMessage("q1"), AIMessage("a1"), HumanMessage("q2")]
    template = ImmutableSandboxedEnvironment().from_string(DEFAULT_CHAT_TEMPLATE)
    roles = {"system": "system", "human": "user", "ai": "assistant"}
    expected = template.render(
        messages=[{"role": roles[m.type], "content": m.content} for m in messages],
        add_generation_prompt=True,
    )
    assert concrete_text(render_messages(messages)) == expected


def test_render_chat_keeps_value_boundaries() -> None:
    """Values stay separate pieces; constant text around them merges."""
    pieces = render_chat([("user", ["Doc: ", Value("x"), "!"])])
    assert pieces == ["<|user|>\nDoc: ", Value("x"), "!\n<|assistant|>\n"]
    assert normalize(["a", "", "b", Value(""), Value("c")]) == ["ab", Value("c")]


def test_constructor_accepts_openai_names_and_aliases() -> None:
    """ChatOpenAI's argument names and aliases construct the same model."""
    model = ChatEclectus(
        model="tiny",
        api_key="tok",
        base_url="http://h:1/v1",
        timeout=3,
        stop_sequences=["x"],
        max_retries=1,
        seed=5,
        streaming=True,
        top_p=0.9,
        model_kwargs={"top_k": 4},
    )
    assert (model.model_name, model.token, model.eclectus_url) == ("tiny", "tok", "http://h:1/v1")
    assert model.request_timeout == 3 and model.stop == ["x"] and model.streaming
    by_name = EclectusLLM(model_name="tiny", openai_api_key="tok", openai_api_base="ws://h:2")
    assert (by_name.model_name, by_name.token, by_name.eclectus_url) == ("tiny", "tok", "ws://h:2")
    assert ws_url(model.eclectus_url) == "ws://h:1"
    assert ChatEclectus(max_completion_tokens=9).max_tokens == 9


def test_unknown_and_neutral_kwargs() -> None:
    """Unknown sampling keys land in model_kwargs; neutral OpenAI values are dropped; other
    unknown arguments fail at construction."""
    model = ChatEclectus(top_k=3, ignore_eos=True)
    assert model.top_k == 3 and model.model_kwargs == {"ignore_eos": True}
    with pytest.warns(UserWarning):
        assert ChatEclectus(presence_penalty=0).model_kwargs == {}
    with pytest.raises(ValueError, match="presence_penalty"):
        ChatEclectus(presence_penalty=0.5)


def test_sampling_payload_precedence() -> None:
    """Fields, then model_kwargs, then call kwargs (bind), then stop: later wins."""
    model = ChatEclectus(max_tokens=10, temperature=0.5, stop="a", model_kwargs={"top_k": 2})
    expected = SamplingParams(max_tokens=10, temperature=0.5, stop=("a",), top_k=2)
    assert model.sampling(None, {}) == expected
    payload = model.sampling(["z"], {"max_tokens": 3, "stop": ["b"], "model": "tiny"})
    assert payload.max_tokens == 3 and payload.stop == ("z",)
    with pytest.raises(ValueError, match="logit_bias"):
        model.sampling(None, {"logit_bias": {1: 2}})
