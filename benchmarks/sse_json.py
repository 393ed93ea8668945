"""The JSON of a /v1 stream through Eclectus, with ``json`` and with msgspec: one vLLM stream
chunk decoded (what ``server/remote/client.py`` reads per token), one SSE payload encoded
(what ``openai_schema.sse`` writes per token), and one engine request's body encoded, its
prompt as 2,048 ids (what the client sends per request). A benchmark, not a test: it prints
one line per round, the two libraries alternating within each round.

    python -m eclectus.benchmarks.sse_json [--rounds 3] [--number 20000]
"""

from __future__ import annotations

import argparse
import json
import timeit
from collections.abc import Callable
from typing import Any

import msgspec

from eclectus.server.front.openai_schema import sse_chunk

# one generated token as vLLM streams it with return_token_ids
_CHUNK = json.dumps(
    {
        "id": "cmpl-0123456789abcdef",
        "object": "text_completion",
        "created": 1764640000,
        "model": "tiny",
        "choices": [
            {
                "index": 0,
                "text": " the",
                "logprobs": None,
                "finish_reason": None,
                "stop_reason": None,
                "token_ids": [1234],
                "prompt_token_ids": None,
            }
        ],
        "usage": None,
    }
).encode()


def _payload() -> dict[str, Any]:
    """One token's SSE payload, as the front sends it with return_token_ids."""
    payload = sse_chunk("cmpl-0123456789abcdef", "text_completion", "tiny", 1764640000, " the")
    payload["choices"][0]["token_ids"] = [1234]
    return payload


# one engine request as the remote backend sends it: the prompt as ids
_REQUEST = {
    "model": "tiny",
    "prompt": list(range(1000, 3048)),
    "max_tokens": 64,
    "temperature": 0.0,
    "stream": True,
    "stream_options": {"include_usage": True},
    "return_token_ids": True,
    "ignore_eos": True,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--number", type=int, default=20_000, help="calls per timing")
    args = parser.parse_args()
    payload = _payload()
    decoder, encoder = msgspec.json.Decoder(), msgspec.json.Encoder()
    # the same JSON values either way, or the timing compares different work
    assert decoder.decode(_CHUNK) == json.loads(_CHUNK)
    assert json.loads(encoder.encode(payload)) == payload
    assert json.loads(encoder.encode(_REQUEST)) == _REQUEST
    cases: dict[str, Callable[[], object]] = {
        "decode json": lambda: json.loads(_CHUNK),
        "decode msgspec": lambda: decoder.decode(_CHUNK),
        "encode json": lambda: json.dumps(payload).encode(),
        "encode msgspec": lambda: encoder.encode(payload),
        "request json": lambda: json.dumps(_REQUEST).encode(),
        "request msgspec": lambda: encoder.encode(_REQUEST),
    }
    for r in range(args.rounds):
        us = {
            name: min(timeit.repeat(fn, number=args.number, repeat=3)) / args.number * 1e6
            for name, fn in cases.items()
        }
        ratios = f"decode {us['decode json'] / us['decode msgspec']:.1f}x"
        ratios += f", encode {us['encode json'] / us['encode msgspec']:.1f}x"
        ratios += f", request {us['request json'] / us['request msgspec']:.1f}x"
        times = ", ".join(f"{name} {t:.2f} us" for name, t in us.items())
        print(f"round {r + 1}: {times} ({ratios})")


if __name__ == "__main__":
    main()
