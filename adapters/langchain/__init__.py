"""LangChain adapter: drop-in model classes and a chain compiler.

- :class:`ChatEclectus` / :class:`EclectusLLM`: swap the import of ``ChatOpenAI`` /
  ``OpenAI`` / ``VLLMOpenAI``; constructor arguments keep their names.
- Constructing a model registers a LangChain configure hook (tracing.py), once per process,
  so an eager chain's model calls send their prompt template's boundaries as segments;
  importing this package changes nothing global.
- :func:`compile`: run a whole chain as one graph on the server.
"""

from eclectus.adapters.langchain.chat_models import ChatEclectus
from eclectus.adapters.langchain.compiler import CompiledRunnable, compile
from eclectus.adapters.langchain.llms import EclectusLLM

__all__ = ["ChatEclectus", "CompiledRunnable", "EclectusLLM", "compile"]
