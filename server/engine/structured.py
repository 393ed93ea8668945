"""Grammar-constrained decoding with xgrammar: what an output with ``structured_outputs`` may
say, token by token.

Per engine, one :class:`GrammarBackend`: the xgrammar ``TokenizerInfo`` built once from the
engine's tokenizer (vocabulary, its encoding as the tokenizer's decoder says, EOS), one
compiler, and the compiled grammars cached by constraint (``StructuredOutputs.key``). Per
constrained request, one :class:`GrammarState`: a matcher that has accepted exactly the
request's output tokens so far. Preemption recomputes KV for tokens already in
``token_ids`` and never samples them again, so the matcher is never fed a token twice.

Each step the engine asks the backend for a bitmask of the batch (all ones on free rows) and
the sampler masks the logits with it, greedy rows included, so constrained and free
requests share one batch and one sampling call.

Beyond the peers, each opt-in (``EngineConfig``; off by default, as each changes what a greedy
request answers, and so it is no longer what stock vLLM answers):

* **Jump-forward.** When the grammar admits exactly one continuation, its tokens are
  appended without sampling (xgrammar's ``find_jump_forward_tokens``); the scheduler then
  computes them as one prefill-like chunk, so ``{"name": "`` costs one forward, not eight.
* **Budget guarantee.** A *closing path* is what a fixed policy writes to finish the
  structure from a state (the forced continuation, else the first allowed token of a list
  that closes strings, objects and arrays before opening anything; for line formats such as
  ReAct's ``Thought: [^\n]+\n``, where that list never ends a line, the same with the
  newline first, whichever is shorter). At admission a request
  whose ``max_tokens`` is below the closing path of the empty output is refused (no valid
  output fits). While generating, once the budget left is near the last closing length
  measured (plus the empty output's, which one token opening another tool call or
  top-level item can add at once), each sampled token is kept only if the closing path
  after it still fits the budget; otherwise the policy's token is taken instead. So the
  output is complete when ``max_tokens`` runs out, whenever a closing path exists (a grammar
  where the policy finds none within :data:`MAX_CLOSING_TOKENS`, such as ``a*b`` read
  greedily, gets no guarantee) and no single token adds more than the window foresees.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from dataclasses import dataclass

import torch
import xgrammar as xgr
from torch import Tensor

from eclectus.models.tokenizer import Tokenizer
from eclectus.protocol.structured import StructuredOutputs
from eclectus.server.engine.engine_config import JsonWhitespace
from eclectus.server.engine.json_layout import json_schema_grammar

MAX_CACHED_GRAMMARS = 256
MAX_CLOSING_TOKENS = 256  # longest closing path searched for
# The budget check runs when the tokens left are at most twice the last closing length
# measured (or that plus the empty output's, whichever is larger: a token that opens another
# tool call or top-level item adds about a whole output's) plus this margin: one token
# rarely adds more than that to the closing path.
CLOSING_MARGIN = 32
# The closing policy's preference among single-character tokens: close a string, an object,
# an array; end a number with a separator; else the shortest values, then openers (closed
# at once), digits and letters (keys, enums). Whitespace is never in the list, so the policy
# never idles, and a separator comes before a digit, so a number never grows.
_CLOSING_ORDER = (
    '"}])>,:0tfn[{-' + "123456789" + "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ" + "._/"
)

# The character class xgrammar gives a string with minLength/maxLength, and JSON's own
_LOOSE_STRING_CHAR = r"[^\"\\\r\n]"
_JSON_STRING_CHAR = r"[^\0-\x1f\"\\]"


# xgrammar's messages open with a time and its C++ source location: "[19:57:14]
# /project/cpp/regex_converter.cc:94: "; the client needs only what follows
_XGRAMMAR_PREFIX = re.compile(r"^\[[\d:]+\]\s+\S+:\d+:\s*")


class GrammarError(ValueError):
    """A constraint that xgrammar cannot compile (bad EBNF, unsupported schema feature)."""


def _tokenizer_info(tokenizer: Tokenizer, vocab_size: int) -> xgr.TokenizerInfo:
    """xgrammar's view of ``tokenizer`` over the model's ``vocab_size`` logits (pure).

    Exactly as ``TokenizerInfo.from_huggingface`` builds it for a fast tokenizer, which is
    what vLLM's xgrammar backend uses: the vocabulary strings by id (added and special tokens
    as their text, so a JSON string may hold ``<|user|>`` where vLLM's may; the detokenizer
    then skips it, as vLLM's does), the encoding read from ``tokenizer.json``'s decoder. The
    ids past the tokenizer's vocabulary that pad the embedding table are empty strings, which
    xgrammar never allows. A different view (special tokens refused, as an earlier version
    had it) changes greedy constrained outputs wherever the model prefers one.
    """
    backend = tokenizer.backend
    meta = xgr.TokenizerInfo._detect_metadata_from_hf(backend.to_str())
    encoded = [""] * vocab_size
    for token, token_id in backend.get_vocab(with_added_tokens=True).items():
        if token_id < vocab_size:
            encoded[token_id] = token
    return xgr.TokenizerInfo(
        encoded,
        meta["vocab_type"],
        vocab_size=vocab_size,
        stop_token_ids=list(tokenizer.eos_token_ids) or None,
        add_prefix_space=meta["add_prefix_space"],
    )


class GrammarBackend:
    """Compiles constraints (cached, LRU) and builds the per-step bitmask. Mutates only its
    cache, under a lock: the async engine compiles on worker threads while the step thread
    reads cached grammars."""

    def __init__(
        self, tokenizer: Tokenizer, vocab_size: int, json_whitespace: JsonWhitespace = "bounded"
    ) -> None:
        self.vocab_size = vocab_size
        self.json_whitespace = json_whitespace  # the layout of every JSON constraint
        self.info = _tokenizer_info(tokenizer, vocab_size)
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=1)
        self._cache: OrderedDict[tuple[str, str, str], xgr.CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()  # guards _cache; compiling runs outside it
        # the JSON-first order, then the same with a newline first (line formats close there)
        self.closing_orders = tuple(
            _closing_token_ids(tokenizer, vocab_size, order)
            for order in (_CLOSING_ORDER, "\n" + _CLOSING_ORDER)
        )
        self.stop_token_ids = frozenset(self.info.stop_token_ids)

    def compile(self, constraint: StructuredOutputs) -> xgr.CompiledGrammar:
        """The compiled grammar of ``constraint``, from the cache when seen before (mutates
        the cache). Raises GrammarError naming what xgrammar refused."""
        key = (*constraint.key, self._whitespace(constraint))
        with self._lock:
            compiled = self._cache.get(key)
            if compiled is not None:
                self._cache.move_to_end(key)
                return compiled
        try:  # two threads may compile one key at once: both results are the same grammar
            compiled = self._compile(constraint)
        except (RuntimeError, ValueError) as exc:
            message = _XGRAMMAR_PREFIX.sub("", str(exc)).strip()
            raise GrammarError(f"structured_outputs.{constraint.kind}: {message}") from None
        with self._lock:
            self._cache[key] = compiled
            if len(self._cache) > MAX_CACHED_GRAMMARS:
                self._cache.popitem(last=False)
        return compiled

    def _whitespace(self, constraint: StructuredOutputs) -> JsonWhitespace:
        """The layout of ``constraint``'s JSON: compact when the request asks (pure)."""
        return "compact" if constraint.disable_any_whitespace else self.json_whitespace

    def _compile(self, constraint: StructuredOutputs) -> xgr.CompiledGrammar:
        kind = constraint.kind
        if kind in ("json", "json_object"):
            schema = constraint.json_schema if kind == "json" else '{"type": "object"}'
            assert schema is not None
            grammar = json_schema_grammar(schema, self._whitespace(constraint))
            return self._compile_json(grammar)
        if kind == "structural_tag":
            return self._compile_json(xgr.Grammar.from_structural_tag(constraint.structural_tag))
        if kind == "regex":
            return self.compiler.compile_regex(constraint.regex)
        if kind == "choice":
            choices = " | ".join(_ebnf_literal(c) for c in constraint.choice or ())
            return self.compiler.compile_grammar(f"root ::= {choices}")
        return self.compiler.compile_grammar(constraint.grammar)

    def _compile_json(self, grammar: xgr.Grammar) -> xgr.CompiledGrammar:
        """Compile a grammar that holds JSON Schemas. xgrammar 0.2.9 lets a length-bounded
        string hold raw control characters, which JSON forbids: that character class is
        narrowed to JSON's first."""
        text = str(grammar).replace(_LOOSE_STRING_CHAR, _JSON_STRING_CHAR)
        return self.compiler.compile_grammar(xgr.Grammar.from_ebnf(text))

    def new_state(self, constraint: StructuredOutputs, max_tokens: int | None) -> GrammarState:
        """A fresh matcher for one request. Raises GrammarError when the constraint does not
        compile, or when ``max_tokens`` cannot hold the shortest output the closing policy
        finds (no valid output would fit)."""
        state = GrammarState(self, xgr.GrammarMatcher(self.compile(constraint)), max_tokens)
        if max_tokens is not None:
            needed = state.closing_length(state.matcher)
            if needed is not None and needed > max_tokens:
                raise GrammarError(
                    f"max_tokens={max_tokens} cannot hold a valid output for this "
                    f"structured_outputs.{constraint.kind}: the shortest one found takes "
                    f"{needed} tokens"
                )
            state.last_closing_length = needed
            state.first_closing_length = needed or 0
        return state

    def bitmask(self, states: list[GrammarState | None]) -> Tensor | None:
        """The allowed tokens of a batch, int32 [B, ceil(V/32)] (xgrammar's packed bits; free
        rows allow everything), or None when no row is constrained (pure)."""
        if all(s is None for s in states):
            return None
        mask = xgr.allocate_token_bitmask(len(states), self.vocab_size)
        for row, state in enumerate(states):
            if state is not None:
                state.matcher.fill_next_token_bitmask(mask, row)
        return mask


@dataclass(slots=True, eq=False)
class GrammarState:
    """One request's matcher and budget bookkeeping. Mutated by :meth:`accept`."""

    backend: GrammarBackend
    matcher: xgr.GrammarMatcher
    max_tokens: int | None
    num_accepted: int = 0
    last_closing_length: int | None = None
    # the empty output's closing length: one token that opens another unit of a repeated
    # top-level structure (a tool call after a call) can add about this much at once
    first_closing_length: int = 0

    def accept(self, token_id: int) -> None:
        """Advance past one output token (mutates). The token came from a mask this matcher
        filled, so a refusal is a broken invariant."""
        if not self.matcher.accept_token(token_id):
            raise RuntimeError(f"the grammar refused token {token_id} it had allowed")
        self.num_accepted += 1

    @property
    def is_terminated(self) -> bool:
        return self.matcher.is_terminated()

    def forced_stop(self) -> int | None:
        """The stop token, when the output is complete and the grammar allows that one token
        only (pure): any sampler picks it, so it is appended without a step, and the output's
        ids end with it as vLLM's do."""
        if not self.matcher.is_completed():
            return None
        mask = xgr.allocate_token_bitmask(1, self.backend.vocab_size)
        self.matcher.fill_next_token_bitmask(mask)
        sole = _sole_allowed(mask[0], self.backend.vocab_size)
        return sole if sole in self.backend.stop_token_ids else None

    def jump_forward(self, budget: int) -> list[int]:
        """The forced continuation's tokens, at most ``budget`` of them, accepted (mutates)."""
        token_ids = self.matcher.find_jump_forward_tokens()[: max(budget, 0)]
        for token_id in token_ids:
            self.accept(token_id)
        return token_ids

    def check_budget(self, token_id: int, num_left: int) -> int:
        """``token_id`` if the structure can still close within ``num_left - 1`` tokens after
        it, else the closing policy's next token (pure). ``num_left`` counts this token."""
        last = self.last_closing_length
        if self.max_tokens is None or last is None:
            return token_id
        if num_left > max(2 * last, last + self.first_closing_length) + CLOSING_MARGIN:
            return token_id
        trial = self.matcher.fork()
        if trial.accept_token(token_id):
            after = self.closing_length(trial)
            if after is not None and after <= num_left - 1:
                self.last_closing_length = after
                return token_id
        path = self.closing_path(self.matcher.fork())
        assert path is not None, "the budget invariant guarantees a closing path here"
        if not path:  # complete already, and the token would open more than fits: end here
            self.last_closing_length = 0
            return min(self.backend.stop_token_ids, default=token_id)
        self.last_closing_length = len(path) - 1
        return path[0]

    def closing_length(self, matcher: xgr.GrammarMatcher) -> int | None:
        """Tokens the closing policy needs from ``matcher``'s state (pure: works on a fork)."""
        path = self.closing_path(matcher.fork())
        return None if path is None else len(path)

    def closing_path(self, trial: xgr.GrammarMatcher) -> list[int] | None:
        """The shortest of the closing policies' token paths from ``trial``'s state until
        the output is complete, or None when none ends within MAX_CLOSING_TOKENS. Mutates
        ``trial`` (pass a fork)."""
        best: list[int] | None = None
        for order in self.backend.closing_orders:
            # a later policy only searches as far as the best path so far: where a newline
            # is whitespace (JSON), the newline-first policy idles and gives up early
            limit = MAX_CLOSING_TOKENS if best is None else len(best) - 1
            path = self._closing_path(trial.fork(), order, limit)
            if path is not None and (best is None or len(path) < len(best)):
                best = path
        return best

    def _closing_path(
        self, trial: xgr.GrammarMatcher, order: list[int], limit: int
    ) -> list[int] | None:
        """One policy's path (``order``: its preferred tokens), or None past ``limit``
        tokens. Mutates ``trial``."""
        path: list[int] = []
        mask = xgr.allocate_token_bitmask(1, self.backend.vocab_size)
        while not trial.is_completed():
            if len(path) >= limit:
                return None
            forced = trial.find_jump_forward_tokens()
            if forced:
                step = forced
            else:
                trial.fill_next_token_bitmask(mask)
                choice = self._policy(mask[0], order)
                if choice is None:
                    return None
                step = [choice]
            for token_id in step:
                if not trial.accept_token(token_id):
                    return None
            path += step
        return path

    def _policy(self, bits: Tensor, order: list[int]) -> int | None:
        """The first allowed token of ``order``, else the first allowed non-whitespace
        ordinary token (pure)."""
        words = bits.tolist()  # plain ints: one conversion, then cheap bit tests
        for token_id in order:
            if words[token_id // 32] >> (token_id % 32) & 1:
                return token_id
        stops = self.backend.stop_token_ids
        return next((t for t in _allowed(bits, self.backend.vocab_size) if t not in stops), None)


def _allowed(bits: Tensor, vocab_size: int) -> list[int]:
    """Token ids set in one packed bitmask row (pure)."""
    shifts = torch.arange(32, dtype=torch.int32)
    unpacked = (bits[:, None] >> shifts) & 1
    return unpacked.flatten()[:vocab_size].nonzero().flatten().tolist()


def _sole_allowed(bits: Tensor, vocab_size: int) -> int | None:
    """The one token id a packed bitmask row allows, None when it allows none or several
    (pure). Why not ``_allowed``: this runs after every token of a request whose grammar may
    end, often with most of the vocabulary allowed, and reading the set words costs O(V/32)
    where listing every allowed id costs milliseconds on a 128k vocabulary."""
    num_words = (vocab_size + 31) // 32
    row = bits[:num_words]
    if vocab_size % 32:  # the last word's bits past the vocabulary do not count
        row = row.clone()
        row[-1] &= (1 << (vocab_size % 32)) - 1
    words = row.nonzero()
    if words.numel() != 1:
        return None
    index = int(words[0, 0])
    word = int(row[index]) & 0xFFFFFFFF  # int32: bit 31 reads as the sign
    if word & (word - 1):  # more than one bit set
        return None
    return index * 32 + word.bit_length() - 1


def _closing_token_ids(tokenizer: Tokenizer, vocab_size: int, order: str) -> list[int]:
    """The ids of ``order``'s characters that are one token each (pure)."""
    ids: list[int] = []
    for char in order:
        encoded = tokenizer.encode(char, add_special_tokens=False)
        if len(encoded) == 1 and encoded[0] < vocab_size and encoded[0] not in ids:
            ids.append(encoded[0])
    return ids


def _ebnf_literal(text: str) -> str:
    """``text`` as an EBNF string literal (pure)."""
    escaped = text.encode("unicode_escape").decode("ascii").replace('"', '\\"')
    return f'"{escaped}"'
