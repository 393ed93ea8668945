"""The JSON-constrained cases the structured-output tests share (a uniquely named module at
the tests root, imported as ``json_fixtures`` like ``tool_fixtures``): the issue's
``Person`` and the schemas other tests use, each with the prompt those tests ask it with."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field
from typing_extensions import TypedDict


class Address(BaseModel):
    """Where a person lives."""

    city: str
    street: str


class Person(BaseModel):
    """A person: a string, an integer, a literal, a capped list, an optional object."""

    name: str
    age: int
    role: Literal["engineer", "doctor", "teacher"]
    hobbies: list[str] = Field(max_length=3)
    address: Address | None = None


class City(BaseModel):
    """A city and its rank."""

    name: str = Field(max_length=10)
    rank: int = Field(ge=1, le=99)


class Colour(TypedDict):
    """A named colour."""

    colour: str
    bright: bool


class Weather(BaseModel):
    """Get the weather of a city."""

    city: str = Field(max_length=12)


ANSWER: dict[str, Any] = {
    "title": "Answer",
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}, "score": {"type": "integer"}},
    "required": ["answer", "score"],
}
# the prompt docs/models.md shows the model answering with a person's JSON
PERSON_PROMPT = "Return a JSON object describing a person named Maya who is 41 and lives in Oslo."
# (schema, prompt) as the structured-output tests ask them
CASES: list[tuple[Any, str]] = [
    (Person, PERSON_PROMPT),
    (City, "A city:"),
    (Colour, "A colour:"),
    (ANSWER, "Is it so?"),
    (Weather, "The weather where?"),
]
CASE_IDS = [getattr(schema, "__name__", None) or schema["title"] for schema, _ in CASES]


# the default layout (server/engine/json_layout.py): one newline and at most 32 blanks
MAX_FREE_WHITESPACE = 33


def longest_free_whitespace(text: str) -> int:
    """The longest run of whitespace outside JSON strings in ``text`` (pure)."""
    longest = run = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            in_string = escaped or ch != '"'
            escaped = not escaped and ch == "\\"
            continue
        if ch in " \t\r\n":
            run += 1
            longest = max(longest, run)
        else:
            run = 0
            in_string = ch == '"'
    return longest
