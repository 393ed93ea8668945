"""The ReAct step format as a constraint: every step a ReActAgent reads parses.

LlamaIndex's ReActAgent asks the model (in its prompt) for one of::

    Thought: <one line>
    Action: <tool name>
    Action Input: <JSON arguments>

    Thought: <one line>
    Answer: <the answer>

and re-prompts when a reply does not parse. :func:`react_constraint` holds the output to
exactly that shape (an xgrammar structural tag, ``SamplingParams.structured_outputs``): the
action is one of the tools and its input is valid against that tool's parameter schema.
Give it to the agent's LLM as a sampling default::

    llm = Eclectus(additional_kwargs={"structured_outputs": react_constraint(tools)})
    agent = ReActAgent(tools=tools, llm=llm)

Which branch a step takes (act or answer) stays the model's choice.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llama_index.core.tools.types import BaseTool

from eclectus.protocol.structured import StructuredOutputs

# A thought is one line, as the ReAct parser reads it (it stops at "Action:"/"Answer:").
MAX_THOUGHT_CHARS = 400


def _const(text: str) -> dict[str, Any]:
    return {"type": "const_string", "value": text}


def _action(tool: BaseTool) -> dict[str, Any]:
    function = tool.metadata.to_openai_tool()["function"]
    return {
        "type": "sequence",
        "elements": [
            _const(f"Action: {function['name']}\nAction Input: "),
            {"type": "json_schema", "json_schema": function["parameters"]},
        ],
    }


def react_constraint(
    tools: Sequence[BaseTool], max_thought_chars: int = MAX_THOUGHT_CHARS
) -> StructuredOutputs:
    """The constraint of one ReAct step over ``tools`` (pure): a one-line thought of at most
    ``max_thought_chars``, then an action on one of the tools with schema-valid input, or an
    answer (free text). Leave ``max_tokens`` room for the thought and the action."""
    if max_thought_chars < 1:
        raise ValueError(f"max_thought_chars must be at least 1, not {max_thought_chars}")
    answer = {"type": "sequence", "elements": [_const("Answer: "), {"type": "any_text"}]}
    thought = {"type": "regex", "pattern": f"[^\\n]{{1,{max_thought_chars}}}\\n"}
    step = {
        "type": "sequence",
        "elements": [
            _const("Thought: "),
            thought,
            {"type": "or", "elements": [*(_action(t) for t in tools), answer]},
        ],
    }
    return StructuredOutputs(structural_tag={"type": "structural_tag", "format": step})
