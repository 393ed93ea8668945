"""Constants and helpers shared by the LlamaIndex adapter tests (a uniquely named module, so
that importing it never collides with another suite's conftest)."""

from __future__ import annotations

from llama_index.core.tools import FunctionTool

from eclectus.server.front.app import EclectusServer
from eclectus.server.front.metrics import parse_prometheus

# Small enough that LlamaIndex's PromptHelper splits a few paragraphs into several chunks,
# so trees get more than one level and refine chains more than one step.
TEST_CONTEXT_WINDOW = 400
TEST_MAX_TOKENS = 12


def metric(server: EclectusServer, name: str) -> float:
    """The current value of one of the server's Prometheus counters."""
    return parse_prometheus(server.metrics_text()).get(name, 0.0)


def client_frames(server: EclectusServer) -> float:
    """Frames the server has received from all clients so far."""
    return metric(server, "eclectus_client_frames_total")


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def weather(city: str) -> str:
    """The weather of a city."""
    return f"sunny in {city}"


# the tools the agent and tool-calling tests offer, and each one's JSON Schema by name
TOOLS = [FunctionTool.from_defaults(add), FunctionTool.from_defaults(weather)]
SCHEMAS = {t.metadata.name: t.metadata.get_parameters_dict() for t in TOOLS}
QUESTION = "What is 2 plus 3?"
