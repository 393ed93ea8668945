"""The critical-path lower bound: the engine's time for a run's longest chain of dependent
calls, each sent alone, one after the other, straight to the server (no added delay).

The chain is rebuilt from the recipe's own prompts and sizes — for map-reduce one map (the
longest chunk), each collapse level and the reduce; for chain-summary every step; for
multi-agent (and its graph and JSON forms) the architect, the file list, one file's draft
and its review/revise rounds; for shared-prompt one chat; for plan-execute the plan, one
step and the answer. Outputs an earlier call would have produced are stood in for by text
of its output length in bytes
(exact in tokens with a byte-level tokenizer, as every call generates exactly
``max_tokens``; shorter with a BPE such as ``tiny``'s, which keeps it a lower bound).
No system can finish the run faster than this chain runs on its engine alone.
"""

from __future__ import annotations

import dataclasses
import json
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import BaseMessage

from eclectus.recipes import (
    chain_summary,
    map_reduce,
    multi_agent,
    multi_agent_json,
    plan_execute,
    shared_prompt,
)
from eclectus.recipes.text import split_chunks

ROLES = {"system": "system", "human": "user", "ai": "assistant"}


@dataclass(frozen=True, slots=True)
class ChainCall:
    """One call of the chain: a completion ``prompt`` or chat ``messages``. A ``prime`` call
    runs first, untimed, to warm the prefix cache the timed calls would find warm in a run."""

    max_tokens: int
    prompt: str | None = None
    messages: tuple[dict[str, str], ...] | None = None
    prime: bool = False


def stand_in(num_tokens: int) -> str:
    """Text of ``num_tokens`` byte tokens standing in for an earlier call's output (pure)."""
    return ("lorem ipsum " * (num_tokens // 12 + 1))[:num_tokens]


def _chat(messages: list[BaseMessage], max_tokens: int, prime: bool = False) -> ChainCall:
    rendered = tuple({"role": ROLES[m.type], "content": str(m.content)} for m in messages)
    return ChainCall(max_tokens, messages=rendered, prime=prime)


def map_reduce_chain(params: map_reduce.MapReduceParams, text: str) -> list[ChainCall]:
    """The longest map, every collapse level, the reduce (pure)."""
    chunks = split_chunks(text, params.chunk_tokens, params.num_chunks)
    longest = max(chunks, key=len)
    calls = [ChainCall(params.map_tokens, map_reduce.MAP_PROMPT.format(text=longest))]
    per_group = map_reduce.group_size(params)
    width = len(chunks)
    for _ in map_reduce.collapse_levels(len(chunks), per_group):
        keys = [f"k{i}" for i in range(min(width, per_group))]
        prompt = map_reduce.list_prompt(map_reduce.COLLAPSE_HEAD, keys)
        calls.append(
            ChainCall(
                params.map_tokens, prompt.format(**{k: stand_in(params.map_tokens) for k in keys})
            )
        )
        width = -(-width // per_group)
    keys = [f"k{i}" for i in range(width)]
    prompt = map_reduce.list_prompt(map_reduce.REDUCE_HEAD, keys)
    reduce = prompt.format(**{k: stand_in(params.map_tokens) for k in keys})
    return [*calls, ChainCall(params.reduce_tokens, reduce)]


def chain_summary_chain(params: chain_summary.ChainSummaryParams, text: str) -> list[ChainCall]:
    """Every step: the first summary, then each refine (pure)."""
    chunks = split_chunks(text, params.chunk_tokens, params.num_chunks)
    summary = stand_in(params.summary_tokens)
    first = ChainCall(params.summary_tokens, chain_summary.INITIAL_PROMPT.format(text=chunks[0]))
    return [first] + [
        ChainCall(
            params.summary_tokens, chain_summary.REFINE_PROMPT.format(summary=summary, text=chunk)
        )
        for chunk in chunks[1:]
    ]


def multi_agent_chain(params: multi_agent.MultiAgentParams, text: str) -> list[ChainCall]:
    """Design, file list, one file's draft, then its review and revision per round (pure)."""
    requirements = multi_agent.requirements_of(params, text)
    design = stand_in(params.design_tokens)
    code, review, name = stand_in(params.code_tokens), stand_in(params.review_tokens), "main.py"
    calls = [
        _chat(
            multi_agent.architect_prompt.format_messages(requirements=requirements),
            params.design_tokens,
        ),
        _chat(
            multi_agent.list_prompt.format_messages(requirements=requirements, design=design),
            params.list_tokens,
        ),
        _chat(
            multi_agent.write_prompt.format_messages(design=design, filename=name),
            params.code_tokens,
        ),
    ]
    for _ in range(params.rounds):
        calls.append(
            _chat(
                multi_agent.review_prompt.format_messages(design=design, filename=name, code=code),
                params.review_tokens,
            )
        )
        calls.append(
            _chat(
                multi_agent.revise_prompt.format_messages(
                    design=design, filename=name, code=code, review=review
                ),
                params.code_tokens,
            )
        )
    return calls


def multi_agent_json_chain(params: multi_agent.MultiAgentParams, text: str) -> list[ChainCall]:
    """multi-agent's chain with the JSON file list's prompt. The list's length is the
    model's (constrained, it ends when the JSON does): stood in by 2 tokens a name and 2
    more, fewer than any compact ``{"files": [...]}`` of that many names takes (pure)."""
    calls = multi_agent_chain(params, text)
    requirements = multi_agent.requirements_of(params, text)
    messages = multi_agent_json.list_prompt.format_messages(
        requirements=requirements, design=stand_in(params.design_tokens)
    )
    calls[1] = _chat(messages, 2 * params.files + 2)
    return calls


def shared_prompt_chain(params: shared_prompt.SharedPromptParams, text: str) -> list[ChainCall]:
    """One chat request (the workload's metric is chat latency), after an untimed chat with
    another question has put the shared system prompt in the prefix cache: every chat but a
    run's first finds it there (pure)."""
    handbook, _ = shared_prompt.split_document(params, text)
    first, second = shared_prompt.questions(dataclasses.replace(params, requests=2), text)
    prime, timed = (
        shared_prompt.chat_prompt.format_messages(handbook=handbook, question=q)
        for q in (second + " (warm-up)", first)
    )
    return [_chat(prime, params.answer_tokens, prime=True), _chat(timed, params.answer_tokens)]


def plan_execute_chain(params: plan_execute.PlanExecuteParams, text: str) -> list[ChainCall]:
    """The plan, one step's execution, the answer over every step's result (pure)."""
    goal = split_chunks(text, params.goal_tokens, 1)[0]
    plan = plan_execute.plan_prompt.format_messages(goal=goal)
    step = plan_execute.step_prompt.format_messages(goal=goal, step=stand_in(params.plan_tokens))
    results = "\n\n".join(stand_in(params.step_tokens) for _ in range(params.steps))
    answer = plan_execute.answer_prompt.format_messages(goal=goal, results=results)
    return [
        _chat(plan, params.plan_tokens),
        _chat(step, params.step_tokens),
        _chat(answer, params.answer_tokens),
    ]


CHAINS: dict[str, Callable[[Any, str], list[ChainCall]]] = {
    "map-reduce": map_reduce_chain,
    "chain-summary": chain_summary_chain,
    "multi-agent": multi_agent_chain,
    "shared-prompt": shared_prompt_chain,
    "plan-execute": plan_execute_chain,
    "multi-agent-graph": multi_agent_chain,  # the same prompts and calls as a StateGraph
    "multi-agent-json": multi_agent_json_chain,
}
# the function-style forms (recipes/functions.py) make the same prompts and calls
CHAINS.update({f"{name}-fn": CHAINS[name] for name in ("map-reduce", "chain-summary")})
CHAINS.update({f"{name}-fn": CHAINS[name] for name in ("multi-agent", "plan-execute")})


def critical_chain(recipe: str, params: Any, text: str) -> list[ChainCall]:
    """The longest dependent chain of ``recipe``'s calls at ``params`` over ``text`` (pure)."""
    return CHAINS[recipe](params, text)


def measure_chain(
    openai_url: str, model: str, calls: list[ChainCall], timeout_s: float = 300.0
) -> float:
    """Seconds to run ``calls`` one after another on the server at ``openai_url``, greedy,
    each generating exactly its ``max_tokens``; ``prime`` calls run first, untimed
    (blocking I/O)."""
    for call in calls:
        if call.prime:
            _send(openai_url, model, call, timeout_s)
    started = time.perf_counter()
    for call in calls:
        if not call.prime:
            _send(openai_url, model, call, timeout_s)
    return time.perf_counter() - started


def _send(openai_url: str, model: str, call: ChainCall, timeout_s: float) -> None:
    """One non-streamed request for ``call`` (blocking I/O)."""
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": call.max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
    }
    if call.messages is not None:
        route, body["messages"] = "chat/completions", list(call.messages)
    else:
        route, body["prompt"] = "completions", call.prompt
    request = urllib.request.Request(
        f"{openai_url}/{route}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        response.read()
