"""Made-up tools for the ``tiny`` corpus: a schema, a question, the call, a result, an answer.

Each maker draws one :class:`ToolExample` from a seeded ``random.Random`` (pure given its
state). The schemas are OpenAI-style ``{"type": "function", "function": {...}}`` objects, as
transformers and OpenAI clients pass ``tools``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def _words(text: str) -> list[str]:
    """A space-separated list of words (pure)."""
    return text.split()


CITIES = _words("Paris London Berlin Madrid Rome Lisbon Oslo Tokyo Lima Cairo Boston Denver")
NAMES = _words("Ada Ben Cleo Dan Eva Finn Grace Hugo Iris Kira Leo Maya")
TOPICS = _words("birds rivers bread trains music gardens volcanoes whales tea maps")
CONDITIONS = _words("sunny cloudy rainy windy foggy snowy")
CURRENCIES = _words("EUR USD GBP JPY")
WORDS = _words("estuary heron tide sluice sensor parish marsh channel")


@dataclass(frozen=True, slots=True)
class ToolExample:
    """One tool use: the tool's schema, a user question, the call and how it ends."""

    schema: dict[str, Any]
    question: str
    arguments: dict[str, Any]
    result: dict[str, Any]
    answer: str

    @property
    def name(self) -> str:
        """The function's name (pure)."""
        return self.schema["function"]["name"]


def _schema(name: str, description: str, params: dict[str, str], required: list[str]) -> dict:
    properties = {p: {"type": t} for p, t in params.items()}
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


def weather(rng: random.Random) -> ToolExample:
    city, condition, degrees = rng.choice(CITIES), rng.choice(CONDITIONS), rng.randint(-5, 35)
    question = rng.choice(
        ["What is the weather in {c}?", "Is it raining in {c}?", "How warm is it in {c} today?"]
    ).format(c=city)
    return ToolExample(
        _schema("get_weather", "Get the current weather in a city.", {"city": "string"}, ["city"]),
        question,
        {"city": city},
        {"city": city, "temperature": degrees, "condition": condition},
        f"It is {degrees} degrees and {condition} in {city}.",
    )


def search(rng: random.Random) -> ToolExample:
    topic = rng.choice(TOPICS)
    question = rng.choice(["Search the web for {t}.", "Find articles about {t}."]).format(t=topic)
    return ToolExample(
        _schema("search_web", "Search the web for a query.", {"query": "string"}, ["query"]),
        question,
        {"query": topic},
        {"results": [f"A short guide to {topic}", f"The history of {topic}"]},
        f"I found two articles: A short guide to {topic}, and The history of {topic}.",
    )


def local_time(rng: random.Random) -> ToolExample:
    city, hour, minute = rng.choice(CITIES), rng.randint(0, 23), rng.choice((0, 15, 30, 45))
    return ToolExample(
        _schema("get_time", "Get the local time in a city.", {"city": "string"}, ["city"]),
        rng.choice(["What time is it in {c}?", "Tell me the time in {c}."]).format(c=city),
        {"city": city},
        {"city": city, "time": f"{hour:02d}:{minute:02d}"},
        f"It is {hour:02d}:{minute:02d} in {city}.",
    )


def email(rng: random.Random) -> ToolExample:
    name, topic = rng.choice(NAMES), rng.choice(TOPICS)
    address = f"{name.lower()}@example.com"
    return ToolExample(
        _schema(
            "send_email",
            "Send an email.",
            {"to": "string", "subject": "string"},
            ["to", "subject"],
        ),
        f"Email {address} with the subject {topic}.",
        {"to": address, "subject": topic},
        {"status": "sent"},
        f"I sent the email about {topic} to {name}.",
    )


def convert(rng: random.Random) -> ToolExample:
    amount = rng.choice((5, 10, 20, 50, 100, 250))
    source, target = rng.sample(CURRENCIES, 2)
    value = round(amount * rng.uniform(0.5, 1.5), 2)
    return ToolExample(
        _schema(
            "convert_currency",
            "Convert an amount between currencies.",
            {"amount": "number", "from": "string", "to": "string"},
            ["amount", "from", "to"],
        ),
        f"Convert {amount} {source} to {target}.",
        {"amount": amount, "from": source, "to": target},
        {"amount": value, "currency": target},
        f"{amount} {source} is {value} {target}.",
    )


def define(rng: random.Random) -> ToolExample:
    word = rng.choice(WORDS)
    return ToolExample(
        _schema("lookup_word", "Look up a word in the dictionary.", {"word": "string"}, ["word"]),
        rng.choice(["What does {w} mean?", "Define the word {w}."]).format(w=word),
        {"word": word},
        {"word": word, "found": True},
        f"I looked up {word} in the dictionary.",
    )


TOOL_MAKERS: list[Callable[[random.Random], ToolExample]] = [
    weather,
    search,
    local_time,
    email,
    convert,
    define,
]
