"""Adapters: the Python SDK and drop-in classes for LangChain and LlamaIndex."""
