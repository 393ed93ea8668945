"""The training corpus of the ``tiny`` preset, generated deterministically (pure).

:func:`build_corpus` returns a list of documents, each one training example: the bundled
recipe documents (recipes/data/*.md) cut into paragraphs, summaries of those paragraphs and of
generated notes in the prompt formats the recipes and the demo use, generated English
sentences, chats in the preset's template (:mod:`.tiny_chat`), JSON objects that always
close their strings and braces, and Hermes/Qwen tool calls after tool definitions, some
followed by the tool's result and an answer. The same code gives the same list everywhere
(one seeded ``random.Random``, sorted inputs), so ``train_tiny`` is reproducible.

The facts are made up by small tables below; the point is fluent, well-formed text.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from importlib import resources
from typing import Any

from eclectus.models.tiny_chat import BOS, CHAT_TEMPLATE, EOS
from eclectus.protocol.chat_template import render_chat
from eclectus.training.tiny_tools import TOOL_MAKERS, ToolExample


def _words(text: str) -> list[str]:
    """A space-separated list of words (pure)."""
    return text.split()


NAMES = _words(
    "Ada Ben Cleo Dan Eva Finn Grace Hugo Iris Jack Kira Leo Maya Noah Olga Paul Rosa Sam Tara Vera"
)
CITIES = _words(
    "Paris London Berlin Madrid Rome Lisbon Vienna Prague Oslo Dublin Tokyo Lima Cairo "
    "Sydney Toronto Boston Denver Seattle Chicago Austin"
)
COUNTRIES = {
    "France": "Paris", "England": "London", "Germany": "Berlin", "Spain": "Madrid",
    "Italy": "Rome", "Portugal": "Lisbon", "Austria": "Vienna", "Norway": "Oslo",
    "Ireland": "Dublin", "Japan": "Tokyo", "Peru": "Lima", "Egypt": "Cairo",
}  # fmt: skip
JOBS = _words("teacher engineer doctor farmer writer baker pilot nurse painter chemist")
COLORS = _words("red blue green yellow black white orange purple grey brown")
ANIMALS = {
    "cat": ("fish and meat", "houses"), "dog": ("meat", "houses"),
    "owl": ("mice", "woods"), "heron": ("fish", "rivers"), "fox": ("rabbits", "fields"),
    "duck": ("plants and insects", "ponds"), "bee": ("nectar", "hives"),
    "horse": ("grass and hay", "fields"), "goat": ("leaves", "hills"),
    "seal": ("fish", "the sea"), "robin": ("worms", "gardens"), "frog": ("insects", "ponds"),
}  # fmt: skip
THINGS = [
    ("The scheduler", "batches requests from many users", "to keep the processor busy"),
    ("The cache", "keeps the keys and values of shared prompts", "so they are computed once"),
    ("The server", "sends each result back as soon as it is ready", "to cut waiting time"),
    ("The engine", "reads the model weights once at start", "so requests begin quickly"),
    ("The team", "reviews every change before it is merged", "to catch mistakes early"),
    ("The river", "rises quickly after heavy rain", "because the hills are steep"),
    ("The village", "keeps a list of volunteers", "who check the sensors each month"),
    ("The report", "lists the main results in a short table", "so readers find them fast"),
    ("The garden", "needs water every morning in summer", "because the soil is thin"),
    ("The library", "opens late on Thursdays", "so that workers can visit"),
    ("The bakery", "sells fresh bread before eight", "for people on their way to work"),
    ("The museum", "shows old maps of the coast", "to explain how the town grew"),
    ("The graph", "describes which calls depend on which", "so the server can plan ahead"),
    ("The model", "writes short answers to questions", "because it is very small"),
    ("The sensor", "measures the water level every minute", "and sends it by radio"),
    ("The council", "meets on the first Monday of each month", "to agree the budget"),
]
ADJECTIVES = _words("quiet busy small large old new bright cold warm simple careful")
OPENERS = ["Hello! How can I help you today?", "Hi! What would you like to know?"]
GREETINGS = ["Hi", "Hello", "Hello!", "Hi there", "Good morning"]
SYSTEMS = [
    "You are a helpful assistant.",
    "Be brief.",
    "You are a concise assistant who answers in one sentence.",
    "You are a friendly assistant. Answer clearly.",
]
SUMMARY_FORMATS = [  # the recipes' and the demo's prompt shapes
    "Write a concise summary of the following text, keeping its key facts.\n\nText:\n{text}"
    "\n\nSummary:",
    "You are a careful analyst. Write a concise summary of the passage below, keeping its key "
    "facts, names and numbers.\n\nPassage:\n{text}\n\nSummary:",
    "You are a concise assistant who summarizes technical notes in one sentence.\nNote:\n{text}"
    "\nSummary:",
]


def build_corpus(seed: int = 0) -> list[str]:
    """Every training document, in a fixed order (pure: same ``seed``, same list)."""
    rng = random.Random(seed)
    paragraphs = _recipe_paragraphs()
    docs: list[str] = [BOS + p + EOS for p in paragraphs]
    makers: list[tuple[Callable[[random.Random], str], int]] = [
        (_prose, 3000),
        (_note_summary, 2500),
        (_chat_fact, 3000),
        (_chat_json, 2500),
        (_json_document, 1500),
        (_chat_tool, 2000),
    ]
    for make, count in makers:
        docs += [BOS + make(rng) for _ in range(count)]
    for paragraph in paragraphs:
        if len(paragraph) > 120 and not paragraph.startswith(("#", "-", "1")):
            text = rng.choice(SUMMARY_FORMATS).format(text=paragraph)
            docs.append(BOS + text + " " + _first_sentence(paragraph) + EOS)
    rng.shuffle(docs)
    return docs


def _recipe_paragraphs() -> list[str]:
    data = resources.files("eclectus.recipes").joinpath("data")
    names = sorted(p.name for p in data.iterdir() if p.name.endswith(".md"))
    text = "\n\n".join(data.joinpath(n).read_text(encoding="utf-8") for n in names)
    return [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]


def _first_sentence(text: str) -> str:
    match = re.match(r"(.+?[.!?])(\s|$)", text, flags=re.S)
    return (match.group(1) if match else text).strip()


def _sentence(rng: random.Random) -> str:
    subject, verb, reason = rng.choice(THINGS)
    pick = rng.randrange(5)
    if pick == 0:
        return f"{subject} {verb} {reason}."
    if pick == 1:
        return f"{subject} {verb}."
    if pick == 2:
        animal, (food, home) = rng.choice(sorted(ANIMALS.items()))
        return f"The {rng.choice(ADJECTIVES)} {animal} lives in {home} and eats {food}."
    if pick == 3:
        name, city, job = rng.choice(NAMES), rng.choice(CITIES), rng.choice(JOBS)
        return f"{name} is a {job} who lives in {city}."
    country, capital = rng.choice(sorted(COUNTRIES.items()))
    return f"The capital of {country} is {capital}."


def _prose(rng: random.Random) -> str:
    return " ".join(_sentence(rng) for _ in range(rng.randint(2, 5))) + EOS


def _note_summary(rng: random.Random) -> str:
    subject, verb, reason = rng.choice(THINGS)
    note = f"{subject} {verb} {reason}."
    if rng.random() < 0.5:
        note += " " + _sentence(rng)
    summary = f"{subject} {verb}."
    return rng.choice(SUMMARY_FORMATS).format(text=note) + " " + summary + EOS


def _chat(rng: random.Random, turns: list[dict[str, Any]], tools: list[Any] | None = None) -> str:
    messages = [{"role": "system", "content": rng.choice(SYSTEMS)}] if rng.random() < 0.5 else []
    return render_chat(
        CHAT_TEMPLATE,
        messages + turns,
        add_generation_prompt=False,
        template_vars={"eos_token": EOS, "bos_token": BOS},
        tools=tools,
    )


def _fact_pair(rng: random.Random) -> tuple[str, str]:
    pick = rng.randrange(6)
    if pick == 0:
        country, capital = rng.choice(sorted(COUNTRIES.items()))
        return f"What is the capital of {country}?", f"The capital of {country} is {capital}."
    if pick == 1:
        animal, (food, _) = rng.choice(sorted(ANIMALS.items()))
        return f"What does a {animal} eat?", f"A {animal} eats {food}."
    if pick == 2:
        animal, (_, home) = rng.choice(sorted(ANIMALS.items()))
        return f"Where does a {animal} live?", f"A {animal} lives in {home}."
    if pick == 3:
        return rng.choice(GREETINGS), rng.choice(OPENERS)
    if pick == 4:
        subject, verb, reason = rng.choice(THINGS)
        name = subject.removeprefix("The ").lower()
        return f"Tell me about the {name}.", f"{subject} {verb} {reason}."
    subject, verb, reason = rng.choice(THINGS)
    note = f"{subject} {verb} {reason}."
    return f"Summarize in a few words: {note}", f"{subject} {verb}."


def _chat_fact(rng: random.Random) -> str:
    turns: list[dict[str, Any]] = []
    for _ in range(rng.choice((1, 1, 1, 2))):
        question, answer = _fact_pair(rng)
        turns += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    return _chat(rng, turns)


def _record(rng: random.Random) -> tuple[str, dict[str, Any]]:
    """A request in words and the JSON object that answers it."""
    name, city, job = rng.choice(NAMES), rng.choice(CITIES), rng.choice(JOBS)
    age = rng.randint(18, 80)
    pick = rng.randrange(4)
    if pick == 0:
        return (
            f"a person named {name} who is {age} and lives in {city}",
            {"name": name, "age": age, "city": city},
        )
    if pick == 1:
        colors = rng.sample(COLORS, rng.randint(1, 3))
        return (
            f"{name}, a {job}, whose favourite colors are {' and '.join(colors)}",
            {"name": name, "job": job, "colors": colors},
        )
    if pick == 2:
        animal, (food, home) = rng.choice(sorted(ANIMALS.items()))
        return f"a {animal}", {"animal": animal, "food": food, "habitat": home}
    items = [
        {"id": i + 1, "name": n, "active": rng.random() < 0.5}
        for i, n in enumerate(rng.sample(NAMES, rng.randint(1, 3)))
    ]
    return (
        f"the team in {city} with {len(items)} members",
        {"city": city, "members": items, "count": len(items)},
    )


def _chat_json(rng: random.Random) -> str:
    words, value = _record(rng)
    ask = rng.choice(
        [
            "Return a JSON object describing {w}.",
            "Give me JSON for {w}.",
            "Reply only with JSON. Describe {w}.",
            "Describe {w} as a JSON object.",
        ]
    ).format(w=words)
    return _chat(rng, [{"role": "user", "content": ask}, _reply(json.dumps(value))])


def _json_document(rng: random.Random) -> str:
    words, value = _record(rng)
    indent = rng.choice((None, None, 2))
    return f"Data about {words}:\n{json.dumps(value, indent=indent)}\n" + EOS


def _chat_tool(rng: random.Random) -> str:
    makers = rng.sample(TOOL_MAKERS, rng.randint(1, 3))
    examples: list[ToolExample] = [make(rng) for make in makers]
    tools = [e.schema for e in examples]
    chosen = examples[0]
    if rng.random() < 0.15:  # a question no tool answers
        question, answer = _fact_pair(rng)
        return _chat(rng, [{"role": "user", "content": question}, _reply(answer)], tools)
    call = {"type": "function", "function": {"name": chosen.name, "arguments": chosen.arguments}}
    turns: list[dict[str, Any]] = [
        {"role": "user", "content": chosen.question},
        {"role": "assistant", "content": "", "tool_calls": [call]},
    ]
    if rng.random() < 0.6:
        turns += [{"role": "tool", "content": json.dumps(chosen.result)}, _reply(chosen.answer)]
    rng.shuffle(tools)
    return _chat(rng, turns, tools)


def _reply(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}
