"""An engine that answers at once, to measure the front alone (benchmarks and tests only;
nothing at run time imports it).

``python -m eclectus.benchmarks.instant_engine --port 8100`` serves what the remote pool's
handshake and requests need, as vLLM's API server does: ``GET /v1/models``, ``POST
/tokenize`` (with the ``tiny`` tokenizer, so the front's tokenizer check passes), ``POST
/v1/completions`` (plain or streamed as vLLM's SSE chunks, one per token, then a usage chunk
and ``[DONE]``; a ``structured_outputs.choice`` is answered with its first choice, so the
dialect probe finds vLLM's). Every generated token is the same one, produced without any
model, so all the CPU a request costs is the front's (and this server's HTTP, kept small:
raw asyncio, no framework). ``--token-delay S`` spaces the streamed tokens, for tests that
need requests in flight (and the chunked body's end after ``[DONE]`` as well).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from eclectus.models.presets import resolve_model_dir
from eclectus.models.tokenizer import Tokenizer

MODEL = "tiny"
CONTEXT_WINDOW = 4096


class InstantEngine:
    """The HTTP side: one asyncio server, keep-alive connections, chunked streams."""

    def __init__(self, token_delay_s: float = 0.0) -> None:
        self.tokenizer = Tokenizer.from_dir(resolve_model_dir(MODEL))
        (self.token_id,) = self.tokenizer.encode(" a", add_special_tokens=False)[-1:]
        self.token_text = self.tokenizer.decode([self.token_id])
        self.token_delay_s = token_delay_s
        self.num_completions = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Requests on one connection until it closes (mutates: counts)."""
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                method, path, headers = _parse_head(head)
                length = int(headers.get("content-length", "0"))
                body = json.loads(await reader.readexactly(length)) if length else {}
                await self._answer(writer, method, path, body)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _answer(
        self, writer: asyncio.StreamWriter, method: str, path: str, body: dict[str, Any]
    ) -> None:
        if method == "GET" and path == "/v1/models":
            card = {"id": MODEL, "object": "model", "max_model_len": CONTEXT_WINDOW}
            _send_json(writer, {"object": "list", "data": [card]})
        elif method == "POST" and path == "/tokenize":
            special = body.get("add_special_tokens", True)
            ids = self.tokenizer.encode(body.get("prompt", ""), special)
            _send_json(writer, {"tokens": ids, "count": len(ids)})
        elif method == "POST" and path == "/v1/completions":
            self.num_completions += 1
            await self._complete(writer, body)
        else:
            _send_json(writer, {"error": {"message": f"no route {path}"}}, status=404)
        await writer.drain()

    async def _complete(self, writer: asyncio.StreamWriter, body: dict[str, Any]) -> None:
        prompt = body.get("prompt", "")
        num_prompt = len(prompt) if isinstance(prompt, list) else len(prompt.split())
        choice = (body.get("structured_outputs") or {}).get("choice")
        num = int(body.get("max_tokens") or 16)
        usage = {"prompt_tokens": num_prompt, "completion_tokens": num}
        if not body.get("stream"):
            text = choice[0] if choice else self.token_text * num
            answer = {"choices": [{"index": 0, "text": text, "finish_reason": "length"}]}
            _send_json(writer, {**answer, "usage": usage})
            return
        tokens = [self.token_chunk(None)] * (num - 1) + [self.token_chunk("length")]
        end = [sse_chunk({"choices": [], "usage": usage}), _raw_chunk(b"data: [DONE]\n\n")]
        if not self.token_delay_s:  # all at once: one send, not one per token
            writer.write(b"".join([STREAM_HEAD, *tokens, *end, b"0\r\n\r\n"]))
            return
        writer.write(STREAM_HEAD)
        for token in tokens:
            writer.write(token)
            await writer.drain()
            await asyncio.sleep(self.token_delay_s)
        writer.write(b"".join(end))
        await writer.drain()  # the body's end in a write of its own, as Starlette's is
        await asyncio.sleep(self.token_delay_s)
        writer.write(b"0\r\n\r\n")

    def token_chunk(self, finish_reason: str | None) -> bytes:
        """One generated token as vLLM streams it, as one HTTP chunk (pure)."""
        piece = {"index": 0, "text": self.token_text, "token_ids": [self.token_id]}
        return sse_chunk({"choices": [{**piece, "finish_reason": finish_reason}]})


def _parse_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    return method, path.split("?", 1)[0], headers


def _send_json(writer: asyncio.StreamWriter, data: object, status: int = 200) -> None:
    payload = json.dumps(data).encode()
    reason = b"OK" if status == 200 else b"Not Found"
    head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\n" % (status, reason)
    writer.write(head + b"content-length: %d\r\n\r\n" % len(payload) + payload)


STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)


def sse_chunk(data: object) -> bytes:
    """One SSE event as one HTTP chunk (pure)."""
    return _raw_chunk(b"data: " + json.dumps(data).encode() + b"\n\n")


def _raw_chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def serve(port: int, token_delay_s: float) -> None:
    """Serve on 127.0.0.1:``port`` until killed (0: a free port; the line says which)."""
    engine = InstantEngine(token_delay_s)
    server = await asyncio.start_server(engine.serve, "127.0.0.1", port)
    bound = server.sockets[0].getsockname()[1]
    print(f"instant engine on http://127.0.0.1:{bound}/v1", file=sys.stderr, flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m eclectus.benchmarks.instant_engine")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--token-delay", type=float, default=0.0, metavar="S")
    args = parser.parse_args(argv)
    asyncio.run(serve(args.port, args.token_delay))


if __name__ == "__main__":
    main()
