"""``get_response_synthesizer``: LlamaIndex's factory, with the graph synthesizers swapped in.

Same arguments as ``llama_index.core.get_response_synthesizer``. The modes that make several
dependent model calls (``refine``, ``compact``, ``tree_summarize``) return the Eclectus
classes, which submit the whole chain or tree to the server as one graph; every other mode
returns the stock synthesizer unchanged.
"""

from __future__ import annotations

import inspect
from typing import Any

from llama_index.core.response_synthesizers import ResponseMode
from llama_index.core.response_synthesizers import (
    get_response_synthesizer as stock_get_response_synthesizer,
)
from llama_index.core.response_synthesizers.base import BaseSynthesizer

from eclectus.adapters.llamaindex.refine import EclectusCompactAndRefine, EclectusRefine
from eclectus.adapters.llamaindex.tree_summarize import EclectusTreeSummarize

GRAPH_SYNTHESIZERS: dict[ResponseMode, type[BaseSynthesizer]] = {
    ResponseMode.REFINE: EclectusRefine,
    ResponseMode.COMPACT: EclectusCompactAndRefine,
    ResponseMode.TREE_SUMMARIZE: EclectusTreeSummarize,
}


def get_response_synthesizer(
    response_mode: ResponseMode | str = ResponseMode.COMPACT, **kwargs: Any
) -> BaseSynthesizer:
    """A response synthesizer for ``response_mode`` (pure: builds a new object). Arguments a
    mode does not use are ignored, as in the stock factory; the constructors fill in the
    same defaults the stock factory does (Settings' LLM, prompt helper and callbacks)."""
    mode = ResponseMode(response_mode)
    cls = GRAPH_SYNTHESIZERS.get(mode)
    if cls is None:
        return stock_get_response_synthesizer(response_mode=mode, **kwargs)
    accepted = inspect.signature(cls.__init__).parameters
    return cls(**{name: value for name, value in kwargs.items() if name in accepted})
