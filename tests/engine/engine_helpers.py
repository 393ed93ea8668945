"""What the built-in engines' tests share: one config, request builder, collector, idle wait."""

from __future__ import annotations

import asyncio

from eclectus.models.presets import resolve_model_dir
from eclectus.models.tokenizer import Tokenizer
from eclectus.server.backend import EngineOutput, EngineRequest
from eclectus.server.engine import AsyncEngine, EngineConfig, ProcessEngine, SamplingParams

CONFIG = EngineConfig(model="tiny", num_kv_blocks=256)
TOKENIZER = Tokenizer.from_dir(resolve_model_dir("tiny"))
Engine = AsyncEngine | ProcessEngine


def prompt_request(
    request_id: str, segments: tuple[str, ...], sampling: SamplingParams, **fields: object
) -> EngineRequest:
    """A request for the flat text of ``segments``, as the server's front tokenizes it (BOS
    first); ``pin_segments=n`` pins the ids lying wholly before the n-th segment's end."""
    ids, ends = TOKENIZER.encode_pieces(segments)
    pin = fields.pop("pin_segments", 0)
    pinned = ends[pin - 1] if isinstance(pin, int) and pin > 0 else 0
    return EngineRequest(
        request_id,
        tuple(ids),
        sampling,
        prefix_ends=tuple(ends),
        pin_prefix_tokens=pinned,
        **fields,  # type: ignore[arg-type]
    )


def request(request_id: str, *segments: str, **sampling: object) -> EngineRequest:
    sampling_params = SamplingParams(**{"max_tokens": 8, **sampling})
    return prompt_request(request_id, segments or ("Hello there. ",), sampling_params)


async def collect(engine: Engine, req: EngineRequest) -> list[EngineOutput]:
    return [out async for out in engine.generate(req)]


async def wait_until_idle(engine: Engine, num_pinned: int = 0) -> None:
    """Until nothing runs or waits, ``num_pinned`` prefixes are pinned and (with none pinned)
    every block is free again, as the engine's stats say."""
    for _ in range(300):
        stats = engine.stats()
        if (
            stats.num_running == 0
            and stats.num_waiting == 0
            and stats.extra["num_pinned"] == num_pinned
            and (num_pinned or stats.num_free_blocks == stats.num_total_blocks)
        ):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"engine did not go idle: {engine.stats()}")
