"""One app's graph in the scheduler, as both front ends drive it: submit, watch, get, close.

A WebSocket session (session.py) holds one handle for its whole life; a ``/v1`` request
(openai_api.py) holds one for the request. Either submits staged fragments, watches the
variables it will answer with (a callback when final, another per streamed piece), gets
them (activates their upstream with an objective) and closes the app when it ends, which
aborts whatever of it still runs. The handle holds no state of its own beyond the app.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from eclectus.server.graph.fragment import Staged
from eclectus.server.graph.graph import Graph, Variable, VarState
from eclectus.server.graph.objectives import Objective
from eclectus.server.graph.scheduler import AppState, GraphScheduler


@dataclass(slots=True, eq=False)
class AppHandle:
    """The scheduler's ``app``, driven through ``scheduler``. Event loop only; every method
    but the properties mutates."""

    scheduler: GraphScheduler
    app: AppState

    @classmethod
    def open(cls, scheduler: GraphScheduler, session_id: str, tenant: str | None) -> AppHandle:
        """Register a new app (its graph empty) with the scheduler."""
        return cls(scheduler, scheduler.open_app(session_id, tenant))

    @property
    def graph(self) -> Graph:
        return self.app.graph

    @property
    def session_id(self) -> str:
        return self.app.session_id

    @property
    def tenant(self) -> str | None:
        return self.app.tenant

    def submit(self, staged: Staged) -> None:
        """Add a staged fragment (fragment.py has checked it) to the graph; nothing runs
        until a get asks for it."""
        self.app.graph.add(staged.variables, staged.nodes)

    def watch(
        self,
        var_id: str,
        on_final: Callable[[Variable], None],
        on_text: Callable[[str], None] | None = None,
    ) -> bool:
        """Call ``on_final`` once ``var_id`` is final (READY or FAILED), and ``on_text`` with
        each piece of text its call generates until then. False, and nothing registered,
        when the variable is final already (the caller answers at once)."""
        variable = self.app.graph.vars[var_id]
        if variable.state is not VarState.PENDING:
            return False
        if on_text is not None:
            variable.streamers.append(on_text)
        variable.watchers.append(on_final)
        return True

    def get(self, var_id: str, objective: Objective) -> None:
        """Run what ``var_id`` needs, ranked by ``objective`` (merged into any earlier get's
        on the same calls)."""
        self.scheduler.activate(self.app, var_id, objective)

    def set_value(self, var_id: str, text: str) -> None:
        """The client sets a variable, which may make calls ready (GraphError if it may
        not)."""
        self.scheduler.set_value(self.app, var_id, text)

    def cancel(self, var_id: str) -> None:
        """Cancel the producer of ``var_id`` and everything downstream of it."""
        self.scheduler.cancel(self.app, var_id)

    async def close(self, message: str) -> None:
        """Cancel the app's queued and running calls (aborting their engine requests) and
        fail its pending variables with ``message``; idempotent."""
        await self.scheduler.close_app(self.app, message)

    def forget(self) -> None:
        """Unregister an app none of whose work was submitted (a refused request)."""
        self.scheduler.forget_app(self.app)
