"""LlamaIndex integration: a drop-in LLM and response synthesizers that submit graphs.

    from llama_index.core import Settings
    from eclectus.adapters.llamaindex import Eclectus, get_response_synthesizer

    Settings.llm = Eclectus(url="ws://127.0.0.1:8765")
    engine = index.as_query_engine(
        response_synthesizer=get_response_synthesizer(response_mode="tree_summarize")
    )

See docs/llamaindex.md.
"""

from eclectus.adapters.llamaindex.llm import Eclectus
from eclectus.adapters.llamaindex.react import react_constraint
from eclectus.adapters.llamaindex.refine import EclectusCompactAndRefine, EclectusRefine
from eclectus.adapters.llamaindex.synthesizers import get_response_synthesizer
from eclectus.adapters.llamaindex.tree_summarize import EclectusTreeSummarize

__all__ = [
    "Eclectus",
    "EclectusCompactAndRefine",
    "EclectusRefine",
    "EclectusTreeSummarize",
    "get_response_synthesizer",
    "react_constraint",
]
