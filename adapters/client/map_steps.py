"""MapSteps: the per-element pipeline of a server-side map, built call by call (no I/O).

``session.map_steps(element)`` starts a builder; each ``steps.call(pieces)`` adds one step
(one call with exactly one :class:`Gen`) and returns its output as a *local* variable: it
stands for that step's reply of the current element, like ``element`` stands for the
element, so only later steps of the same builder may read it. ``session.map`` or
``session.map_pipeline`` then declare one MapSpec: the first step as ``call``, the others
as ``then`` (docs/protocol.md, Maps).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from eclectus.adapters.client.functions import Piece, call_spec
from eclectus.adapters.client.variables import SemanticVariable
from eclectus.protocol import MAX_MAP_STEPS, CallSpec

if TYPE_CHECKING:
    from eclectus.adapters.client.session import Session


class MapSteps:
    """The steps of one map, in order. ``call`` mutates the builder (and the session's id
    counter and registry of local variables), never the pending fragment; one builder may
    serve several maps. Not thread-safe: build it on one thread."""

    def __init__(self, session: Session, element: SemanticVariable) -> None:
        session.check_owned(element)
        self._session = session
        self._element = element
        self._id = session.new_id("p")  # names the builder in errors and in local marks
        self._calls: list[CallSpec] = []

    @property
    def element(self) -> SemanticVariable:
        """The variable standing for the element (never declared)."""
        return self._element

    @property
    def builder_id(self) -> str:
        """The builder's session-unique id (``p12``), as errors name it."""
        return self._id

    @property
    def num_steps(self) -> int:
        return len(self._calls)

    @property
    def calls(self) -> tuple[CallSpec, ...]:
        """The steps' CallSpecs so far, first step first (pure)."""
        return tuple(self._calls)

    def call(
        self,
        pieces: Sequence[Piece],
        *,
        model: str | None = None,
        add_special_tokens: bool = True,
    ) -> SemanticVariable:
        """Adds a step: one call of ``pieces`` (``str`` constants, the element, outer
        variables of the session, outputs of earlier steps of this builder, and exactly one
        :class:`Gen`). Returns the step's local output (mutates the builder). ValueError for
        no or several Gens, a local of another builder, or more than MAX_MAP_STEPS steps.
        ``add_special_tokens`` as :meth:`Session.call`."""
        if len(self._calls) >= MAX_MAP_STEPS:
            raise ValueError(f"a map has at most {MAX_MAP_STEPS} steps (MAX_MAP_STEPS)")
        spec, outputs = call_spec(
            self._session, pieces, model, builder=self._id, add_special_tokens=add_special_tokens
        )
        if len(outputs) != 1:
            raise ValueError(f"a map step needs exactly one Gen output, not {len(outputs)}")
        self._session.mark_local(outputs[0], self._id)
        self._calls.append(spec)
        return outputs[0]

    def __repr__(self) -> str:
        return f"MapSteps({self._id!r}, element={self._element.id!r}, steps={len(self._calls)})"
