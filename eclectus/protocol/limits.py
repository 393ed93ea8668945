"""The limits a server announces in its welcome, and the caps the protocol itself fixes."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

MAX_RELEASE_IDS = 10_000  # variable ids in one ``release`` frame
MAX_SWITCH_CASES = 64  # literals one switch (SwitchSpec) routes on
MAX_SWITCH_DEPTH = 8  # switches nested in a switch's branches, the outermost counted
MAX_SWITCH_PATH = 16  # object keys of a switch's ``path`` into a JSON reply
MAX_MAP_STEPS = 16  # calls one map (MapSpec) chains per element: ``call`` plus ``then``


class Limits(BaseModel):
    """What one session may send. ``max_prompt_tokens``: the largest prompt one call may
    resolve to (variables included), leaving room for at least one output token in the
    model's context window and the engine's KV pool. ``max_pending_gets_per_session``: gets
    waiting on unfinished variables at once. ``max_map_items`` / ``max_map_element_bytes``:
    one map op's fan-out and the size of one element."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    max_frame_bytes: int
    max_prompt_tokens: int
    max_vars_per_session: int
    max_calls_per_session: int
    max_pending_gets_per_session: int
    max_map_items: int
    max_map_element_bytes: int
