"""Run one dispatched call: one engine request per output, in order.

A template may hold several outputs. The prompt up to the first output goes to the engine;
its text is appended and the prompt continues to the next output, and so on. Every output's
text becomes its variable's value the moment it is final, so consumers of an early output do
not wait for the later ones.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from eclectus.protocol import GenSegment, TextSegment, Usage
from eclectus.server.backend import EngineError, EngineRequest
from eclectus.server.errors import LimitError
from eclectus.server.graph.graph import Graph, Node

if TYPE_CHECKING:
    from eclectus.server.graph.scheduler import AppState, GraphScheduler


def prompt_segments(
    graph: Graph, node: Node, index: int, generated: dict[str, str]
) -> tuple[tuple[str, ...], GenSegment]:
    """The texts before output ``index`` and that output's segment (pure): constant text,
    each input's text and each earlier output's text, in order. The prompt is their
    concatenation, tokenized once (server/front/prompt.py); each seam is a possible pin point."""
    texts: list[str] = []
    seen = 0
    for segment in node.segments:
        if isinstance(segment, GenSegment):
            if seen == index:
                return tuple(texts), segment
            texts.append(generated[segment.gen])
            seen += 1
        elif isinstance(segment, TextSegment):
            texts.append(segment.text)
        else:
            texts.append(graph.vars[segment.var].value or "")
    raise AssertionError(f"call {node.node_id!r} has no output {index}")


async def run_call(
    scheduler: GraphScheduler,
    app: AppState,
    node: Node,
    priority: float,
    *,
    background: bool = False,
) -> None:
    """Generate every output of ``node`` (mutates the graph as outputs complete). Raises
    EngineError or LimitError on failure; the scheduler fails the call and its downstream.
    ``background``: throughput work (the engine holds it back while latency work runs)."""
    generated: dict[str, str] = {}
    for index, var_id in enumerate(node.outputs):
        segments, gen = prompt_segments(app.graph, node, index, generated)
        # the flat text tokenized once, here (off the event loop when long:
        # prompt_tokenizer.py): the engine takes the ids as they are; a call whose prompt is
        # already tokenized (/v1: ids, or text tokenized on arrival) sends those ids instead
        prompt = app.token_prompts.get(node.node_id) if index == 0 else None
        if prompt is None:
            tokenize = scheduler.prompt_tokenizer.tokenize_prompt
            prompt = await tokenize(segments, node.add_special_tokens)
        if len(prompt) > scheduler.config.max_prompt_tokens:
            raise LimitError(
                f"prompt for {var_id!r} has {len(prompt)} tokens, limit "
                f"{scheduler.config.max_prompt_tokens}",
                var=var_id,
            )
        # the most KV the request can come to hold: its prompt and every token it may write
        most = gen.sampling.max_tokens
        if most is None:
            most = max(scheduler.backend.max_model_len - len(prompt), 0)
        async with scheduler.admission.kv(prompt.token_ids, most, priority, app.tenant):
            request = scheduler.request(
                app,
                node,
                index,
                prompt,
                sampling=gen.sampling,
                priority=priority,
                background=background,
                group=node.group,
            )
            text, usage, finish_reason = await _generate(scheduler, app, request, var_id)
        generated[var_id] = text
        scheduler.complete(app, node, var_id, text, usage, finish_reason)


async def _generate(
    scheduler: GraphScheduler, app: AppState, request: EngineRequest, var_id: str
) -> tuple[str, Usage, str | None]:
    """Stream one request; returns its text, usage and finish reason (mutates: streams
    deltas to the variable's watchers). Cancellation aborts the request in the engine."""
    scheduler.metrics.calls_submitted += 1
    chunks: list[str] = []
    last = None
    num_output_tokens = 0
    decode = None  # where its decode began, for the batch knee (admission.py)
    stream = scheduler.backend.generate(request)
    try:
        async for output in stream:
            if app.on_output is not None:
                app.on_output(var_id, output)
            if output.text:
                chunks.append(output.text)
                app.graph.stream(var_id, output.text)
            num_output_tokens += len(output.token_ids)
            if decode is None and num_output_tokens:
                prefilled = max(len(request.prompt_token_ids) - output.num_cached_tokens, 0)
                decode = scheduler.admission.decode_mark(num_output_tokens, prefilled)
            last = output
    except GeneratorExit:
        raise  # the loop is discarding this task: nothing may be awaited any more
    except BaseException:  # cancelled (client left, cancel frame) or the engine failed
        await _abandon(scheduler, stream, request.request_id)
        raise
    if last is None or not last.finished or last.finish_reason == "abort":
        await _abandon(scheduler, stream, request.request_id)
        raise EngineError(f"engine request {request.request_id} ended without finishing")
    scheduler.metrics.calls_finished += 1
    scheduler.admission.decode_done(decode, num_output_tokens)
    usage = Usage(
        prompt_tokens=last.num_prompt_tokens,
        completion_tokens=max(last.num_output_tokens, num_output_tokens),
        cached_tokens=last.num_cached_tokens,
    )
    return "".join(chunks), usage, last.finish_reason


async def _abandon(scheduler: GraphScheduler, stream: object, request_id: str) -> None:
    """Close the engine's stream early and abort the request, freeing what it holds."""
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        with contextlib.suppress(RuntimeError):  # already closed or mid-step
            await aclose()
    await scheduler.backend.abort(request_id)
