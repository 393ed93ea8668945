"""Model directories and their tokenizer: what the built-in engine, the remote pool and the
server's front all read, owned by none of them.

    presets.py         the built-in models (``tiny``, ``small``) written once as real HF
                       directories, and ``resolve_model_dir`` (a preset name or a directory)
    tokenizer.py       a directory's ``tokenizer.json`` as a stock server uses it: flat
                       encoding with seam offsets, decoding, the chat template
    tiny_chat.py       the presets' chat format (special tokens, Jinja template)
    tiny_tokenizer.py  the presets' BPE tokenizer (trained once, shipped in ``tiny/``)

A leaf: it imports nothing of ``eclectus.server`` and no torch at import time (``presets``
imports torch only to draw the random weights of ``small``), so the remote backend and the
server's front load it without the engine.
"""
