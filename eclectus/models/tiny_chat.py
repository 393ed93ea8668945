"""The chat format of the built-in models: special tokens and a Jinja template with tools.

Messages render as ``<|role|>\\ncontent\\n``, except that an assistant turn ends with the EOS
token (``<|assistant|>\\ncontent</s>\\n``), which is where a trained model stops. A prompt
asks for a reply with ``<|assistant|>\\n``. Without tools and assistant turns this is exactly
:data:`~eclectus.protocol.chat_template.DEFAULT_CHAT_TEMPLATE`.

Tools follow the Hermes/Qwen convention: ``tools`` (JSON schemas, as transformers'
``apply_chat_template(..., tools=...)`` passes them) are listed in a system turn inside
``<tools></tools>``, one JSON object a line; an assistant calls one with
``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``; a result comes back as a
``tool`` message. ``<tool_call>`` and ``</tool_call>`` are added tokens that are *not*
special, so decoded text keeps them for a tool-call parser.

The template copies each message's content verbatim, once, so the server's segment-keeping
renderer (``render_chat_pieces``) keeps message boundaries.
"""

from __future__ import annotations

BOS, EOS, PAD = "<s>", "</s>", "<pad>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|tool|>")
SPECIAL_TOKENS = (PAD, BOS, EOS, *ROLE_TOKENS)  # ids 0.. in this order
TOOL_CALL_TOKENS = ("<tool_call>", "</tool_call>")  # added, not special: decode keeps them
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2

TOOLS_INTRO = (
    "You can call these functions. Each is described by a JSON schema inside <tools></tools>:"
)
TOOLS_OUTRO = (
    "To call a function, reply with its name and arguments as a JSON object inside "
    '<tool_call></tool_call>:\n<tool_call>\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\n</tool_call>"
)

# trim_blocks/lstrip_blocks are on in transformers' environment and ours; every block tag
# uses "-" so that the layout of this source never reaches the output.
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|system|>\\n' }}"
    "{%- if messages and messages[0]['role'] == 'system' %}"
    "{{- messages[0]['content'] + '\\n\\n' }}"
    "{%- endif %}"
    "{{- '" + TOOLS_INTRO + "\\n<tools>\\n' }}"
    "{%- for tool in tools %}{{- tool | tojson }}{{- '\\n' }}{%- endfor %}"
    "{{- '</tools>\\n' }}"
    "{{- '" + TOOLS_OUTRO.replace("\n", "\\n") + "\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (tools and loop.first and message['role'] == 'system') %}"
    "{{- '<|' + message['role'] + '|>\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}{%- endif %}"
    "{%- if message['role'] == 'assistant' %}"
    "{%- for call in message.get('tool_calls') or [] %}"
    "{%- set fn = call['function'] if call['function'] is defined else call %}"
    "{%- if not loop.first or message['content'] %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": \"' + fn['name'] + '\", \"arguments\": ' }}"
    "{%- if fn['arguments'] is string %}{{- fn['arguments'] }}"
    "{%- else %}{{- fn['arguments'] | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- eos_token + '\\n' }}"
    "{%- else %}"
    "{{- '\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|assistant|>\\n' }}{%- endif %}"
)
