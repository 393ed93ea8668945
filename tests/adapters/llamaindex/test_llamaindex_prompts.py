"""Prompt capture: templates split into constant text and variable slots (no server)."""

from __future__ import annotations

from typing import Any

from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.llms.mock import MockLLM
from llama_index.core.prompts import PromptTemplate, RichPromptTemplate
from llama_index.core.prompts.default_prompt_selectors import (
    DEFAULT_REFINE_PROMPT_SEL,
    DEFAULT_TREE_SUMMARIZE_PROMPT_SEL,
)

from eclectus.adapters.llamaindex.prompts import (
    Slot,
    chat_pieces,
    check_pieces,
    join_pieces,
    messages_to_prompt,
    template_pieces,
    template_values,
)


def _render(llm: MockLLM) -> Any:
    return llm._get_prompt


def test_plain_template_splits_at_variables() -> None:
    """Constant text and variables alternate, in template order."""
    prompt = PromptTemplate("Q: {question}\nContext: {context}\nA:")
    pieces = template_pieces(_render(MockLLM()), prompt, {"question": "why", "context": "c"})
    assert pieces == ["Q: ", Slot("question"), "\nContext: ", Slot("context"), "\nA:"]


def test_partial_variables_become_slots_too() -> None:
    """A partially formatted variable is still a variable, and the template is not mutated."""
    prompt = PromptTemplate("{a} and {b}").partial_format(a="first")
    pieces = template_pieces(_render(MockLLM()), prompt, {"b": "second"})
    assert pieces == [Slot("a"), " and ", Slot("b")]
    assert prompt.kwargs == {"a": "first"}
    assert template_values(prompt, {"b": "second"}) == {"a": "first", "b": "second"}


def test_repeated_variable_gets_a_slot_each_time() -> None:
    prompt = PromptTemplate("{x}-{x}")
    assert template_pieces(_render(MockLLM()), prompt, {"x": "v"}) == [Slot("x"), "-", Slot("x")]


def test_system_prompt_and_wrapper_are_constant_text() -> None:
    """The LLM's own additions (system prompt, query wrapper) surround the slots as text."""
    llm = MockLLM(system_prompt="SYS")
    llm.query_wrapper_prompt = PromptTemplate("[INST]{query_str}[/INST]")
    pieces = template_pieces(llm._get_prompt, PromptTemplate("say {w}"), {"w": "hi"})
    assert pieces == ["[INST]SYS\n\nsay ", Slot("w"), "[/INST]"]


def test_stock_prompts_round_trip_exactly() -> None:
    """Filled with the real values, the pieces are byte-identical to LlamaIndex's string."""
    llm = MockLLM()
    cases = [
        (DEFAULT_TREE_SUMMARIZE_PROMPT_SEL.partial_format(query_str="q?"), {"context_str": "c"}),
        (
            DEFAULT_REFINE_PROMPT_SEL.partial_format(query_str="q?", existing_answer="old"),
            {"context_msg": "new {braces}"},
        ),
    ]
    for prompt, args in cases:
        pieces = template_pieces(llm._get_prompt, prompt, args)
        values = template_values(prompt, args)
        expected = llm._get_prompt(prompt, **args)
        assert check_pieces(pieces, values, expected)
        assert {p.name for p in pieces if isinstance(p, Slot)} == set(values)


def test_function_mapping_that_rewrites_a_value_fails_the_check() -> None:
    """A template whose mapping transforms a value cannot be sent as slots."""
    prompt = PromptTemplate("{x}", function_mappings={"x": lambda **kw: str(kw["x"]).upper()})
    llm = MockLLM()
    pieces = template_pieces(llm._get_prompt, prompt, {"x": "low"})
    assert not check_pieces(pieces, {"x": "low"}, llm._get_prompt(prompt, x="low"))


def test_a_value_that_a_template_strips_still_splits() -> None:
    """A chat RichPromptTemplate strips each message's content (so would a chat template's
    ``| trim``): the sentinels survive it, and the check holds for values without
    surrounding whitespace."""
    prompt = RichPromptTemplate("{% chat role='user' %}Q: {{ q }}{% endchat %}")
    llm = MockLLM()
    pieces = template_pieces(llm._get_prompt, prompt, {"q": "why"})
    assert pieces == ["user: Q: ", Slot("q"), "\nassistant: "]
    assert check_pieces(pieces, {"q": "why"}, llm._get_prompt(prompt, q="why"))
    assert not check_pieces(pieces, {"q": "why "}, llm._get_prompt(prompt, q="why "))


def test_chat_pieces_follow_the_model_chat_template() -> None:
    """One piece per message in "<|role|>\\ncontent\\n" form, then the assistant header."""
    messages = [
        ChatMessage(role=MessageRole.SYSTEM, content="be brief"),
        ChatMessage(role=MessageRole.USER, content="hi"),
    ]
    assert chat_pieces(messages) == ["<|system|>\nbe brief\n", "<|user|>\nhi\n", "<|assistant|>\n"]
    assert messages_to_prompt(messages) == "".join(chat_pieces(messages))
    assert join_pieces(chat_pieces(messages), {}) == messages_to_prompt(messages)
