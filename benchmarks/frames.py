"""``python -m eclectus.benchmarks.frames``: what validating one client frame costs.

A session turns each text frame into a model with ``json.loads`` then
``CLIENT_FRAME.validate_python`` (server/front/session.py), on the event loop. This bench builds
realistic ``submit`` frames (N calls of 4-6 segments mixing text, inputs and outputs with
sampling specs, as the SDK sends them) and times that parse, best of ``--repeats``, against
the baseline in the same process: the same frame models with the pre-discriminator segment
union (``TextSegment | VarSegment | GenSegment``, which pydantic tries member by member).
Runs alternate baseline and current so machine noise hits both. It also times
``CLIENT_FRAME.validate_json`` on the same text, the one-step alternative to the session's
two steps, and checks that every parser yields the same frame. A second table times lists of
one segment kind (text, input, output) with each union.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import time
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import BaseModel, Field, TypeAdapter

from eclectus.protocol import (
    CLIENT_FRAME,
    CallSpec,
    Cancel,
    Close,
    GenSegment,
    Get,
    Hello,
    Release,
    Segment,
    Set,
    Submit,
    TextSegment,
    Tokenize,
    VarSegment,
)

# -- the baseline: protocol v1's frame models as they were before the discriminator ----------

BaselineSegment = TextSegment | VarSegment | GenSegment


class BaselineCallSpec(CallSpec):
    """CallSpec whose segments use the old, undiscriminated union."""

    segments: list[BaselineSegment] | None = None


class BaselineSubmit(Submit):
    """Submit made of BaselineCallSpecs."""

    calls: list[BaselineCallSpec] = Field(default_factory=list)


BASELINE_CLIENT_FRAME: TypeAdapter[BaseModel] = TypeAdapter(
    Annotated[
        Hello | BaselineSubmit | Get | Set | Cancel | Release | Tokenize | Close,
        Field(discriminator="type"),
    ]
)

# -- frames ----------------------------------------------------------------------------------


def submit_frame(num_calls: int, seed: int = 0) -> str:
    """The JSON text of a submit with ``num_calls`` calls of 4-6 segments each, shaped like
    the SDK's frames: constants inlined as text, defaults left out (pure)."""
    rng = random.Random(seed)
    docs = [{"id": f"doc{i}", "value": f"Document {i}: " + "lorem ipsum " * 20} for i in range(8)]
    calls: list[dict[str, Any]] = []
    for i in range(num_calls):
        segments: list[dict[str, Any]] = [{"text": f"You are step {i} of a pipeline.\n"}]
        segments.append({"var": rng.choice(docs)["id"] if i < 2 else f"out{rng.randrange(i)}"})
        segments.append({"text": "\nThink, then answer:"})
        if rng.random() < 0.5:
            segments.append({"gen": f"think{i}", "sampling": {"max_tokens": 32, "stop": ["\n"]}})
            segments.append({"text": "\nAnswer:"})
        sampling = {"max_tokens": rng.choice((16, 48, 64)), "temperature": 0.7, "seed": i}
        segments.append({"gen": f"out{i}", "sampling": sampling})
        calls.append({"id": f"call{i}", "segments": segments})
    gets = [{"var": f"out{num_calls - 1}", "criteria": "latency", "stream": True}]
    frame = {"type": "submit", "id": f"s{seed}", "vars": docs, "calls": calls, "gets": gets}
    return json.dumps(frame, separators=(",", ":"))


# -- parsers ---------------------------------------------------------------------------------

Parser = Callable[[str], BaseModel]


def baseline(text: str) -> BaseModel:
    """The session's two steps with the old segment union."""
    return BASELINE_CLIENT_FRAME.validate_python(json.loads(text))


def current(text: str) -> BaseModel:
    """The session's two steps (server/front/session.py: ``_decode`` then ``validate_python``)."""
    return CLIENT_FRAME.validate_python(json.loads(text))


def from_json(text: str) -> BaseModel:
    """One step: pydantic parses and validates the JSON text itself."""
    return CLIENT_FRAME.validate_json(text)


PARSERS: dict[str, Parser] = {"baseline": baseline, "current": current, "validate_json": from_json}


def best_seconds(
    parsers: dict[str, Callable[[Any], object]], value: object, repeats: int, loops: int
) -> dict[str, float]:
    """Best-of-``repeats`` CPU seconds per parse of ``value`` for each parser, the parsers
    interleaved.

    CPU time of this thread, not wall time: on a shared machine the wall clock also counts
    the time other processes hold the core, which is noise here, while the CPU time is what
    the server's event loop would spend. Each run starts from a collected heap."""
    best = dict.fromkeys(parsers, float("inf"))
    for _ in range(repeats):
        for name, parse in parsers.items():
            gc.collect()
            start = time.thread_time()
            for _ in range(loops):
                parse(value)
            best[name] = min(best[name], (time.thread_time() - start) / loops)
    return best


def check_same_frames(text: str) -> None:
    """Every parser yields the same frame; raises AssertionError otherwise."""
    dumps = {name: parse(text).model_dump() for name, parse in PARSERS.items()}
    if len({json.dumps(d, sort_keys=True) for d in dumps.values()}) != 1:
        raise AssertionError("the parsers disagree on the frame")


SEGMENT_KINDS: dict[str, dict[str, Any]] = {
    "text": {"text": "You are step 3 of a pipeline.\n"},
    "var": {"var": "doc3"},
    "gen": {"gen": "out3", "sampling": {"max_tokens": 48, "temperature": 0.7, "seed": 3}},
}


def segment_table(repeats: int, num_segments: int = 200) -> None:
    """Prints µs per segment of each kind, old union against the discriminated Segment."""
    adapters: dict[str, TypeAdapter[Any]] = {
        "baseline": TypeAdapter(list[BaselineSegment]),
        "current": TypeAdapter(list[Segment]),
    }
    print(f"\none segment kind, {num_segments} a list: CPU µs per segment")
    print(f"{'kind':>6} {'baseline':>9} {'current':>9} {'base/cur':>9}")
    for kind, segment in SEGMENT_KINDS.items():
        segments = [segment] * num_segments
        parsers = {name: adapter.validate_python for name, adapter in adapters.items()}
        best = best_seconds(parsers, segments, repeats, loops=10)
        old, new = (best[name] * 1e6 / num_segments for name in adapters)
        print(f"{kind:>6} {old:9.2f} {new:9.2f} {old / new:8.2f}x")


def main(args: argparse.Namespace) -> None:
    print(
        f"submit frames, best of {args.repeats}, parsers interleaved; CPU µs per frame (per call)"
    )
    print(
        f"{'calls':>6} {'bytes':>8} {'baseline':>16} {'current':>16} {'validate_json':>16}"
        f" {'base/cur':>9} {'cur/json':>9}"
    )
    for num_calls in args.calls:
        text = submit_frame(num_calls)
        check_same_frames(text)
        loops = max(1, args.budget_calls // num_calls)
        best = best_seconds(PARSERS, text, args.repeats, loops)
        cells = [f"{best[n] * 1e6:8.1f} ({best[n] * 1e6 / num_calls:5.2f})" for n in PARSERS]
        print(
            f"{num_calls:>6} {len(text):>8} {cells[0]:>16} {cells[1]:>16} {cells[2]:>16}"
            f" {best['baseline'] / best['current']:8.2f}x"
            f" {best['current'] / best['validate_json']:8.2f}x"
        )
    segment_table(args.repeats)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, nargs="+", default=[1, 64, 512])
    parser.add_argument("--repeats", type=int, default=20, help="best of this many runs")
    parser.add_argument(
        "--budget-calls", type=int, default=1024, help="calls parsed per timed run (loops)"
    )
    main(parser.parse_args())
