"""Prefix pins: keep a shared prompt prefix's KV in the engine while the graph still needs it.

When a call is dispatched and other pending calls of the same session start with the same
segments (same constant text, same input variables), its request asks the engine to pin the
prompt's ids lying wholly before the end of the common leading segments (the prompt is
tokenized flat, so a token straddling that seam is left out: server/front/prompt.py;
EngineRequest.pin_prefix_tokens). The pin is released
(Backend.unpin) once the last of those other calls has been dispatched, failed, or the
session closed. Only the first request of a call takes part: it is the one whose prompt has
the shared leading segments.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from eclectus.protocol import GenSegment, Segment, TextSegment
from eclectus.server.graph.graph import FINAL_NODE_STATES, Graph, Node, NodeState

SegmentKey = tuple[str, str]  # ("t", text) or ("v", var id): equal keys give equal text


def leading_keys(segments: tuple[Segment, ...]) -> list[SegmentKey]:
    """The identities of a call's segments before its first output (pure)."""
    keys: list[SegmentKey] = []
    for segment in segments:
        if isinstance(segment, GenSegment):
            break
        keys.append(("t", segment.text) if isinstance(segment, TextSegment) else ("v", segment.var))
    return keys


def _common(a: list[SegmentKey], b: list[SegmentKey]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@dataclass(slots=True)
class Pin:
    request_id: str
    waiting: set[str] = field(default_factory=set)  # node ids still to be dispatched


@dataclass(slots=True)
class PinTable:
    """One session's pins, keyed by the first leading segment."""

    pins: dict[SegmentKey, Pin] = field(default_factory=dict)
    # calls by first leading segment, so finding sharers does not scan the whole graph;
    # a call leaves its bucket when dispatched, finished calls whenever a bucket is scanned
    by_first_key: dict[SegmentKey, dict[str, Node]] = field(default_factory=dict)

    def on_dispatch(self, graph: Graph, node: Node, request_id: str) -> tuple[int, list[str]]:
        """Account for ``node`` being dispatched as ``request_id`` (mutates). Returns how
        many leading segments its request should pin, and request ids to unpin now."""
        keys = leading_keys(node.segments)
        if not keys:
            return 0, []
        pin = self.pins.get(keys[0])
        if pin is not None:  # a sharer of a live pin: only that pin can empty now
            pin.waiting.discard(node.node_id)
            if pin.waiting:
                return 0, []
            del self.pins[keys[0]]
            return 0, [pin.request_id]
        bucket = self._bucket(graph, keys[0])  # prunes ``node`` too: it is running
        sharers: dict[str, int] = {}
        for other in bucket.values():
            if other.state in (NodeState.WAITING, NodeState.QUEUED):
                sharers[other.node_id] = _common(keys, leading_keys(other.segments))
        if not sharers:
            return 0, []
        self.pins[keys[0]] = Pin(request_id, set(sharers))
        return min(sharers.values()), []

    def _bucket(self, graph: Graph, first: SegmentKey) -> dict[str, Node]:
        """The calls whose prompt starts with ``first``, pruned of running and finished
        ones (mutates: indexes newly added nodes first)."""
        for other in graph.unindexed:
            other_keys = leading_keys(other.segments) if other.is_call else []
            if other_keys:
                self.by_first_key.setdefault(other_keys[0], {})[other.node_id] = other
        graph.unindexed.clear()
        bucket = self.by_first_key.get(first, {})
        gone = [
            i
            for i, n in bucket.items()
            if n.state in FINAL_NODE_STATES or n.state is NodeState.RUNNING
        ]
        for node_id in gone:
            del bucket[node_id]
        if not bucket:
            self.by_first_key.pop(first, None)
        return bucket

    def forget(self, node_ids: set[str]) -> list[str]:
        """Failed or cancelled nodes no longer need a prefix (mutates); returns request ids
        to unpin."""
        for pin in self.pins.values():
            pin.waiting -= node_ids
        return self._release_empty()

    def release_all(self) -> list[str]:
        """Session closing: every pin goes (mutates); returns request ids to unpin."""
        request_ids = [pin.request_id for pin in self.pins.values()]
        self.pins.clear()
        return request_ids

    def _release_empty(self) -> list[str]:
        done = [key for key, pin in self.pins.items() if not pin.waiting]
        return [self.pins.pop(key).request_id for key in done]
