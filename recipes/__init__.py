"""The paper's applications as ordinary LangChain apps (``eclectus run NAME``).

Programmatic API (docs/recipes.md)::

    from eclectus.recipes import run_recipe, MapReduceParams
    result = run_recipe("map-reduce", MapReduceParams(num_chunks=4))   # embedded server
"""

from eclectus.recipes.chain_summary import ChainSummaryParams
from eclectus.recipes.embedded import Embedded, embedded_server
from eclectus.recipes.map_reduce import MapReduceParams
from eclectus.recipes.multi_agent import MultiAgentParams
from eclectus.recipes.plan_execute import PlanExecuteParams
from eclectus.recipes.plan_execute_json import PlanExecuteJsonParams
from eclectus.recipes.result import RecipeResult, format_report
from eclectus.recipes.runner import RECIPES, run_recipe
from eclectus.recipes.shared_prompt import SharedPromptParams
from eclectus.recipes.target import ModelFactory, Target
from eclectus.recipes.tool_agent import ToolAgentParams

__all__ = [
    "RECIPES",
    "ChainSummaryParams",
    "Embedded",
    "MapReduceParams",
    "ModelFactory",
    "MultiAgentParams",
    "PlanExecuteJsonParams",
    "PlanExecuteParams",
    "RecipeResult",
    "SharedPromptParams",
    "Target",
    "ToolAgentParams",
    "embedded_server",
    "format_report",
    "run_recipe",
]
