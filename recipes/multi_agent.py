"""``multi-agent``: a MetaGPT-style software team as a LangChain app.

An architect writes a design from the requirements, then a file list. Engineers write the
files in parallel, each prompt opening with the same system text and design (the shared
prefix); for each round, a reviewer reviews each file and its engineer revises it. One
``RunnableParallel`` branch per file, each a sequence of ``RunnablePassthrough.assign``
steps, so the team's whole round structure is one chain.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import (
    Runnable,
    RunnableConfig,
    RunnableParallel,
    RunnablePassthrough,
    RunnablePick,
)

from eclectus.recipes.result import RecipeOutput
from eclectus.recipes.target import ModelFactory
from eclectus.recipes.text import split_chunks

ARCHITECT = (
    "You are the software architect of a small team. Read the requirements and write a "
    "design: the components, their interfaces and the data they exchange."
)
ENGINEER = "You are a software engineer on the team. The architect's design:\n\n{design}"
REVIEWER = "You are a code reviewer on the team. The architect's design:\n\n{design}"
APP = "multi-agent"  # the application both compiled parts run as (the session's tag)
FILE_NAME = re.compile(r"\b[\w/-]+\.(?:py|md|toml|json|yaml|txt|js|ts)\b")

architect_prompt = ChatPromptTemplate.from_messages(
    [("system", ARCHITECT), ("human", "Requirements:\n{requirements}\n\nWrite the design.")]
)
list_prompt = ChatPromptTemplate.from_messages(
    [
        ("system", ARCHITECT),
        ("human", "Requirements:\n{requirements}\n\nWrite the design."),
        ("ai", "{design}"),
        ("human", "List the source files to write, one file name per line, nothing else."),
    ]
)
write_prompt = ChatPromptTemplate.from_messages(
    [("system", ENGINEER), ("human", "Write the complete file {filename}.")]
)
review_prompt = ChatPromptTemplate.from_messages(
    [("system", REVIEWER), ("human", "Review the file {filename}:\n\n{code}")]
)
revise_prompt = ChatPromptTemplate.from_messages(
    [
        ("system", ENGINEER),
        (
            "human",
            "Revise the file {filename} to address the review.\n\nFile:\n{code}\n\n"
            "Review:\n{review}\n\nWrite the complete revised file.",
        ),
    ]
)


@dataclass(frozen=True, slots=True)
class MultiAgentParams:
    """Sizes of a team run (tokens are the model's; see text.approx_tokens)."""

    files: int = 8  # engineers (branches) per round
    rounds: int = 2  # review + revise rounds after the first draft
    requirements_tokens: int = 1024  # the input document's head, as requirements
    design_tokens: int = 200
    list_tokens: int = 50
    code_tokens: int = 200
    review_tokens: int = 50
    width: int = 8  # calls in flight at once (max_concurrency)

    def __post_init__(self) -> None:
        if self.files < 1 or self.rounds < 0:
            raise ValueError("files must be >= 1 and rounds >= 0")


def file_names(file_list: str, count: int) -> list[str]:
    """The first ``count`` distinct file names in the architect's list, padded with
    ``module_N.py`` when it names fewer (a random model names none). Pure."""
    names = list(dict.fromkeys(FILE_NAME.findall(file_list)))[:count]
    padding = (f"module_{i}.py" for i in range(count * 2) if f"module_{i}.py" not in names)
    return names + [next(padding) for _ in range(count - len(names))]


def build_architect(params: MultiAgentParams, models: ModelFactory) -> Runnable:
    """Input ``{requirements}``; output adds ``design`` and ``file_list`` (pure)."""
    parser = StrOutputParser()
    design = architect_prompt | models.chat(params.design_tokens) | parser
    listing = list_prompt | models.chat(params.list_tokens) | parser
    return RunnablePassthrough.assign(design=design) | RunnablePassthrough.assign(file_list=listing)


def engineer_chain(params: MultiAgentParams, models: ModelFactory) -> Runnable:
    """One engineer: input ``{design, filename}``; output the input with ``code`` (the file
    after every round) and ``review`` (the last review, with rounds) (pure). Every form of
    the team (this chain, the StateGraphs) runs this one."""
    parser = StrOutputParser()
    coder, reviewer = models.chat(params.code_tokens), models.chat(params.review_tokens)
    engineer: Runnable = RunnablePassthrough.assign(code=write_prompt | coder | parser)
    for _ in range(params.rounds):
        engineer = engineer | RunnablePassthrough.assign(review=review_prompt | reviewer | parser)
        engineer = engineer | RunnablePassthrough.assign(code=revise_prompt | coder | parser)
    return engineer


def build_team(params: MultiAgentParams, models: ModelFactory, names: list[str]) -> Runnable:
    """Input ``{design, name_0, ...}``; output ``{file_0: code, ...}`` (pure)."""
    engineer = engineer_chain(params, models) | RunnablePick("code")
    return RunnableParallel(
        {
            f"file_{i}": {"design": RunnablePick("design"), "filename": RunnablePick(f"name_{i}")}
            | engineer
            for i in range(len(names))
        }
    )


def requirements_of(params: MultiAgentParams, text: str) -> str:
    """The head of the input document, as the team's requirements (pure)."""
    return split_chunks(text, params.requirements_tokens, 1)[0]


def plan(params: MultiAgentParams, text: str) -> int:
    """Planned model calls: design, file list, then per file a draft and 2 per round."""
    return 2 + params.files * (1 + 2 * params.rounds)


def run(
    params: MultiAgentParams, models: ModelFactory, text: str, config: RunnableConfig
) -> RecipeOutput:
    """Run the team on ``text`` as requirements; the output is every file, by name."""
    config = {**config, "max_concurrency": params.width}
    # both parts are one application: one session (its setup paid once), one app-FIFO slot
    architect = models.prepare(build_architect(params, models), "multi-agent architect", APP)
    planned = architect.invoke({"requirements": requirements_of(params, text)}, config)
    names = file_names(planned["file_list"], params.files)
    team = models.prepare(build_team(params, models, names), "multi-agent team", APP)
    inputs = {"design": planned["design"], **{f"name_{i}": n for i, n in enumerate(names)}}
    files = team.invoke(inputs, config)
    output = "\n\n".join(f"## {name}\n{files[f'file_{i}']}" for i, name in enumerate(names))
    depth = 2 + 1 + 2 * params.rounds
    return RecipeOutput(output, depth, plan(params, text), {"files": ", ".join(names)})
