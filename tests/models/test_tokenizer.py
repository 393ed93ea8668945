"""The presets' BPE tokenizer and the Tokenizer wrapper: parity with transformers, stream
decoding."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from eclectus.models.presets import PRESETS, write_preset_files
from eclectus.models.tiny_chat import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    ROLE_TOKENS,
    SPECIAL_TOKENS,
    TOOL_CALL_TOKENS,
)
from eclectus.models.tiny_tokenizer import VOCAB_SIZE
from eclectus.models.tokenizer import IncrementalDetokenizer, Tokenizer
from eclectus.protocol.chat_template import DEFAULT_CHAT_TEMPLATE, render_chat

SPECIAL_LITERALS = (*SPECIAL_TOKENS, *TOOL_CALL_TOKENS)
SAMPLES = [
    "",
    "hello",
    " leading space",
    "héllo wörld",
    "emoji 😀👍🏽",
    "tabs\tand\nnewlines",
    "中文字符",
    "<|user|>\nhi\n",
    "  two  spaces  ",
    '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
]
ENGLISH = (
    "The scheduler batches requests from many users to keep the processor busy. "
    "The capital of France is Paris."
)
FAST = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny_tok")
    write_preset_files(PRESETS["tiny"], out)
    return out


@pytest.fixture(scope="module")
def tok(tiny_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(tiny_dir)


@pytest.fixture(scope="module")
def hf_tok(tiny_dir: Path):
    return AutoTokenizer.from_pretrained(tiny_dir)


def plain_text() -> st.SearchStrategy[str]:
    """Unicode text without the literal spelling of a special token."""
    return st.text(max_size=40).filter(lambda t: not any(s in t for s in SPECIAL_LITERALS))


def test_vocabulary_layout(tok: Tokenizer) -> None:
    """Specials first (pad 0, BOS 1, EOS 2, roles, tool-call tags), then all 256 byte tokens;
    the model's whole (64-aligned) embedding table is covered."""
    assert tok.vocab_size == VOCAB_SIZE == PRESETS["tiny"].vocab_size and VOCAB_SIZE % 64 == 0
    assert (PAD_ID, BOS_ID, EOS_ID) == (0, 1, 2)
    assert tok.bos_token_id == BOS_ID and tok.eos_token_ids == (EOS_ID,)
    added = [*SPECIAL_TOKENS, *TOOL_CALL_TOKENS]
    assert [tok.backend.token_to_id(t) for t in added] == list(range(len(added)))
    for text in ("AZ\x00\xff", "<|user|>", "<tool_call>"):  # one id each where an added token
        assert tok.decode(tok.encode(text, add_special_tokens=False)) in (text, "")
    assert tok.encode("<|user|>", add_special_tokens=False) == [SPECIAL_TOKENS.index("<|user|>")]
    assert tok.encode("a") == [BOS_ID, tok.backend.token_to_id("a")]


def test_bpe_merges_english_into_words(tok: Tokenizer) -> None:
    """Trained merges: common words are one token, so English runs ~4 bytes a token (as real
    models' tokenizers do), and every byte string still encodes and decodes exactly."""
    assert len(tok.encode(" the", add_special_tokens=False)) == 1
    ids = tok.encode(ENGLISH, add_special_tokens=False)
    assert len(ENGLISH.encode()) / len(ids) > 3.5
    assert tok.decode(ids) == ENGLISH


def test_decode_keeps_tool_call_tags_and_skips_specials(tok: Tokenizer) -> None:
    """<tool_call> tags are added tokens but not special: decoded text keeps them for a
    tool-call parser; role markers, BOS and EOS are special and skipped."""
    ids = [
        BOS_ID,
        *tok.encode("<|assistant|>\n<tool_call>{}</tool_call>", add_special_tokens=False),
    ]
    assert tok.decode([*ids, EOS_ID]) == "\n<tool_call>{}</tool_call>"
    assert all(tok.backend.token_to_id(t) is not None for t in ROLE_TOKENS)


def test_the_detokenizer_keeps_specials_when_asked(tok: Tokenizer, hf_tok) -> None:
    """``skip_special_tokens=False`` (what vLLM's hermes parser sets for a chat with tools):
    a role marker's text stays in the streamed text, as transformers decodes it."""
    ids = tok.encode("a<|user|>b<|assistant|>", add_special_tokens=False)
    for skip in (True, False):
        detokenizer = IncrementalDetokenizer(tok, skip_special_tokens=skip)
        text = "".join(detokenizer.feed(i) for i in ids) + detokenizer.flush()
        assert text == hf_tok.decode(ids, skip_special_tokens=skip)
    assert "<|user|>" in text


def test_ids_match_transformers_autotokenizer(tok: Tokenizer, hf_tok) -> None:
    """AutoTokenizer on the directory gives our ids, BOS included, and decodes the same."""
    for text in SAMPLES:
        ids = tok.encode(text)
        assert hf_tok(text).input_ids == ids
        without_specials = text.replace("<|user|>", "")  # a special token: decode skips it
        assert hf_tok.decode(ids, skip_special_tokens=True) == tok.decode(ids) == without_specials


@FAST
@given(text=plain_text())
def test_ids_match_transformers_on_random_text(tok: Tokenizer, hf_tok, text: str) -> None:
    assert hf_tok(text).input_ids == tok.encode(text)


# seam-adversarial pieces: constants ending in a space, colon, newline or letter; values
# starting with a space, letter, digit or a multi-byte character; a word cut in two
SEAM_PIECES = ["Q: ", "A1:", "line\n", "un", " what", "believable", "42", "é", "😀x", " ", ""]


@FAST
@given(pieces=st.lists(st.one_of(st.sampled_from(SEAM_PIECES), plain_text()), max_size=6))
def test_pieces_encode_as_their_flat_text(tok: Tokenizer, hf_tok, pieces: list[str]) -> None:
    """A prompt given as pieces is the flat text's ids, exactly transformers' (merges cross
    the seams), with or without special tokens; each seam's count is the number of ids
    lying wholly before it (a straddling token counts for the piece after), BOS included."""
    whole = "".join(pieces)
    assume(not any(lit in whole for lit in SPECIAL_LITERALS))  # a literal may form at a seam
    for special in (True, False):
        ids, ends = tok.encode_pieces(pieces, special)
        assert (
            ids == tok.encode(whole, special) == hf_tok(whole, add_special_tokens=special).input_ids
        )
        assert len(ends) == len(pieces)
        seams = [len("".join(pieces[: k + 1])) for k in range(len(pieces))]
        for seam, end in zip(seams, ends, strict=True):
            assert end == expected_before(tok, ids, whole, seam, special)
        assert ends == sorted(ends) and (not ends or ends[-1] == len(ids))


def expected_before(tok: Tokenizer, ids: list[int], text: str, seam: int, special: bool) -> int:
    """Ids wholly before character ``seam``: re-encoding the flat text's prefix ids one at a
    time, the longest run whose decoded bytes stay within the text's first ``seam``
    characters' bytes (pure; byte-level BPE decodes each id to its own bytes)."""
    start = 1 if special and tok.bos_token_id is not None else 0
    head = text[:seam].encode()
    run = b""
    for n, i in enumerate(ids[start:]):
        run += token_bytes(tok, i)
        if not head.startswith(run):
            return start + n
    return len(ids)


def token_bytes(tok: Tokenizer, token_id: int) -> bytes:
    """The bytes one id of the byte-level BPE stands for (pure)."""
    byte_of = {ch: b for b, ch in enumerate(_byte_level_chars())}
    piece = tok.backend.id_to_token(token_id)
    if piece in SPECIAL_LITERALS:
        return piece.encode()
    return bytes(byte_of[ch] for ch in piece)


def _byte_level_chars() -> list[str]:
    """GPT-2's byte-to-character table, byte order (pure)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    chars, extra = [], 0
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def test_a_seam_inside_a_word_keeps_the_whole_words_token(tok: Tokenizer) -> None:
    """``" Par" + "is"`` is the one token of " Paris", as a stock server computes it; that
    token straddles the seam, so no id lies wholly before it (but for BOS)."""
    ids, ends = tok.encode_pieces([" Par", "is"])
    assert ids == tok.encode(" Paris") and len(ids) == 2
    assert ends == [1, 2]


def test_a_value_with_a_leading_space_leaves_the_constant_whole(tok: Tokenizer) -> None:
    """A constant ending in a word, a value starting with " what": the space belongs to the
    value's token, so every id of the constant lies before the seam."""
    _, ends = tok.encode_pieces(["Answer the question.", " what is it"])
    assert ends[0] == len(tok.encode("Answer the question."))


def stream(tok: Tokenizer, ids: list[int]) -> list[str]:
    detok = IncrementalDetokenizer(tok)
    return [detok.feed(i) for i in ids] + [detok.flush()]


@FAST
@given(ids=st.lists(st.integers(0, VOCAB_SIZE - 1), max_size=40))
def test_incremental_detok_concatenates_to_decode(tok: Tokenizer, ids: list[int]) -> None:
    """Any id stream (invalid UTF-8 and specials too) streams to exactly decode(ids)."""
    assert "".join(stream(tok, ids)) == tok.decode(ids)


@FAST
@given(text=plain_text())
def test_incremental_detok_never_emits_partial_characters(tok: Tokenizer, text: str) -> None:
    """Valid text streams out in whole characters: no piece contains U+FFFD."""
    assume("\ufffd" not in text)
    pieces = stream(tok, tok.encode(text))
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)


def test_incremental_detok_holds_back_a_split_character(tok: Tokenizer) -> None:
    """A 4-byte emoji appears only once its last byte arrives."""
    ids = tok.encode("a😀b", add_special_tokens=False)
    assert stream(tok, ids) == ["a", "", "", "", "😀", "b", ""]


def test_incremental_detok_flushes_a_truncated_character(tok: Tokenizer) -> None:
    ids = tok.encode("😀", add_special_tokens=False)[:2]
    pieces = stream(tok, ids)
    assert pieces[:-1] == ["", ""] and pieces[-1] == "\ufffd"


MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi 😀"}]


def test_chat_template_matches_transformers(tok: Tokenizer, hf_tok) -> None:
    """tiny's tokenizer_config template renders identically on both sides."""
    for add in (True, False):
        ours = tok.apply_chat_template(MESSAGES, add_generation_prompt=add)
        assert ours == hf_tok.apply_chat_template(
            MESSAGES, tokenize=False, add_generation_prompt=add
        )
    assert tok.apply_chat_template(MESSAGES) == (
        "<|system|>\nBe brief.\n<|user|>\nHi 😀\n<|assistant|>\n"
    )


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
TOOL_CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is the weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
            }
        ],
    },
    {"role": "tool", "content": '{"temperature": 18}'},
    {"role": "assistant", "content": "It is 18 degrees in Paris."},
]


@pytest.mark.parametrize("tools", [TOOLS, None])
def test_chat_template_with_tools_matches_transformers(tok: Tokenizer, hf_tok, tools) -> None:
    """apply_chat_template(..., tools=) in transformers and the server's renderer give the same
    prompt: tool schemas in <tools></tools>, calls in <tool_call></tool_call>, every
    assistant turn closed by EOS."""
    for add in (True, False):
        ours = render_chat(
            tok.effective_chat_template,
            TOOL_CHAT,
            add_generation_prompt=add,
            template_vars=tok.template_vars,
            tools=tools,
        )
        theirs = hf_tok.apply_chat_template(
            TOOL_CHAT, tools=tools, tokenize=False, add_generation_prompt=add
        )
        assert ours == theirs
    assert ('<tools>\n{"type": "function", "function": {"name": "get_weather"' in ours) == bool(
        tools
    )
    assert ours.endswith(
        '<|assistant|>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        '</tool_call></s>\n<|tool|>\n{"temperature": 18}\n<|assistant|>\nIt is 18 degrees in '
        "Paris.</s>\n"
    )


def copy_with(tiny_dir: Path, out: Path, **tok_config_changes) -> Path:
    shutil.copytree(tiny_dir, out)
    config_file = out / "tokenizer_config.json"
    config = json.loads(config_file.read_text()) | tok_config_changes
    config = {k: v for k, v in config.items() if v is not None}
    config_file.write_text(json.dumps(config))
    return out


def test_default_template_when_directory_has_none(tiny_dir: Path, tmp_path: Path) -> None:
    tok = Tokenizer.from_dir(copy_with(tiny_dir, tmp_path / "d", chat_template=None))
    assert tok.chat_template is None
    assert tok.apply_chat_template(MESSAGES) == Tokenizer.from_dir(tiny_dir).apply_chat_template(
        MESSAGES
    )


def test_directory_template_and_jinja_file_win(tiny_dir: Path, tmp_path: Path) -> None:
    """A checkpoint's own template (config string, or chat_template.jinja) is used."""
    template = "{{ bos_token }}{% for m in messages %}[{{ m['role'] | upper }}]{% endfor %}"
    path = copy_with(tiny_dir, tmp_path / "d", chat_template=template)
    assert Tokenizer.from_dir(path).apply_chat_template(MESSAGES) == "<s>[SYSTEM][USER]"
    (path / "chat_template.jinja").write_text("{{ messages | length }}")
    assert Tokenizer.from_dir(path).apply_chat_template(MESSAGES) == "2"
    assert template != DEFAULT_CHAT_TEMPLATE


def test_tokenizer_without_bos(tiny_dir: Path, tmp_path: Path) -> None:
    """add_bos_token false (as in Qwen2): no BOS id, encode never prepends one."""
    tok = Tokenizer.from_dir(copy_with(tiny_dir, tmp_path / "d", add_bos_token=False))
    assert tok.bos_token_id is None
    assert tok.encode("hi") == tok.backend.encode("hi", add_special_tokens=False).ids
    assert BOS_ID not in tok.encode("hi")


def test_bos_detected_from_post_processor(tiny_dir: Path, tmp_path: Path) -> None:
    """Without add_bos_token in tokenizer_config, tokenizer.json's post-processor decides."""
    path = tmp_path / "d"
    shutil.copytree(tiny_dir, path)
    config = json.loads((path / "tokenizer_config.json").read_text())
    del config["add_bos_token"]
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    assert Tokenizer.from_dir(path).bos_token_id == BOS_ID
    raw = json.loads((path / "tokenizer.json").read_text())
    raw["post_processor"] = None
    (path / "tokenizer.json").write_text(json.dumps(raw))
    assert Tokenizer.from_dir(path).bos_token_id is None


def test_eos_ids_gathered_from_generation_config(tiny_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "d"
    shutil.copytree(tiny_dir, path)
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [EOS_ID, 300]}))
    assert Tokenizer.from_dir(path).eos_token_ids == (EOS_ID, 300)


def test_missing_tokenizer_json_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"no tokenizer\.json"):
        Tokenizer.from_dir(tmp_path)


def test_a_template_rendering_bos_gets_it_once_as_a_chat_prompt(
    tiny_dir: Path, tmp_path: Path, hf_tok
) -> None:
    """A template rendering {{ bos_token }} gives a prompt that already starts with BOS: as a
    chat prompt (no special tokens added, vLLM's chat endpoint) it has one BOS, the ids
    transformers gives; as a completion prompt BOS is added once more, as
    ``tokenizer(text)`` adds it."""
    path = copy_with(
        tiny_dir, tmp_path / "d", chat_template="{{ bos_token }}{{ messages[0]['content'] }}"
    )
    tok = Tokenizer.from_dir(path)
    prompt = tok.apply_chat_template(MESSAGES)
    assert prompt.startswith("<s>")
    ids = tok.encode(prompt, add_special_tokens=False)
    assert ids.count(BOS_ID) == 1 and ids[0] == BOS_ID
    assert ids == hf_tok.encode(prompt, add_special_tokens=False)
    assert tok.encode(prompt) == [BOS_ID, *ids] == hf_tok(prompt).input_ids
    assert tok.effective_chat_template == "{{ bos_token }}{{ messages[0]['content'] }}"
    assert tok.template_vars["bos_token"] == "<s>"


def sentencepiece_style_tokenizer() -> Tokenizer:
    """A Llama-2/Mistral-shaped tokenizer built in place: "▁" for spaces, byte fallback,
    and a decoder that strips the leading space of whatever it decodes."""
    from tokenizers import AddedToken, decoders, models, normalizers
    from tokenizers import Tokenizer as Backend

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"<0x{b:02X}>": 3 + b for b in range(256)}
    for piece in ["▁", "a", "b", "▁a", "▁ab", "é", "▁é", "ab"]:
        vocab[piece] = len(vocab)
    merges = [("▁", "a"), ("▁a", "b"), ("a", "b"), ("▁", "é")]
    backend = Backend(
        models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token="<unk>", fuse_unk=True)
    )
    backend.normalizer = normalizers.Sequence(
        [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
    )
    backend.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    backend.add_special_tokens([AddedToken("<s>", special=True), AddedToken("</s>", special=True)])
    return Tokenizer(
        backend, bos_token_id=1, eos_token_ids=(2,), chat_template=None, special_tokens={}
    )


SP_TOKENIZER = sentencepiece_style_tokenizer()


# byte tokens (valid and invalid UTF-8 starts/continuations), specials and pieces, densely
SP_INTERESTING = [
    0,
    1,
    2,
    *(3 + b for b in (0x00, 0x41, 0x80, 0x9F, 0xA9, 0xC3, 0xE2, 0xF0)),
    259,
    260,
    261,
    262,
    263,
]


@FAST
@given(
    ids=st.lists(
        st.one_of(st.integers(0, SP_TOKENIZER.vocab_size - 1), st.sampled_from(SP_INTERESTING)),
        max_size=40,
    )
)
def test_incremental_detok_with_byte_fallback_and_space_stripping(ids: list[int]) -> None:
    """Stripped leading spaces are not lost (the window keeps context) and byte-fallback runs,
    which decode to all-U+FFFD when invalid, are emitted only once complete."""
    assert "".join(stream(SP_TOKENIZER, ids)) == SP_TOKENIZER.decode(ids)


def test_incremental_detok_sentencepiece_text() -> None:
    ids = SP_TOKENIZER.encode("ab a é 😀b")
    pieces = stream(SP_TOKENIZER, ids)
    assert "".join(pieces) == "ab a é 😀b" and " a" in pieces
    assert pieces[-6:] == ["", "", "", "", "😀b", ""]  # the emoji's 4 byte tokens wait for "b"


def test_seams_on_a_sentencepiece_style_tokenizer() -> None:
    """The prepended "▁" belongs to the first character, the "▁" of a space to its word:
    "ab" + " a" has both tokens apart at the seam, "a" + "b a" cuts "▁ab" (straddling)."""
    ab, a = SP_TOKENIZER.backend.token_to_id("▁ab"), SP_TOKENIZER.backend.token_to_id("▁a")
    assert SP_TOKENIZER.encode_pieces(["ab", " a"]) == ([1, ab, a], [2, 3])
    assert SP_TOKENIZER.encode_pieces(["a", "b a"]) == ([1, ab, a], [1, 3])
