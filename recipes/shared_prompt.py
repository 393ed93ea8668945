"""``shared-prompt``: many users chatting with one app that has a long system prompt (a
Copilot or GPTs-style assistant), beside a background analytics job (map-reduce).

Chat requests arrive at ``rate`` per second (Poisson, seeded), each from one of ``users``;
every prompt opens with the same long system prompt, which a prefix cache computes once.
Beside them run analytics jobs (map-reduce over the rest of the document), in one of two
ways (:mod:`eclectus.recipes.background`):

- ``background_concurrency=None`` (open loop): ``background_jobs`` jobs started at even
  intervals over the chats' expected arrival window (``requests / rate`` seconds): job
  ``k`` at ``k * window / background_jobs``, each run to its end.
- ``background_concurrency=N`` (closed loop): ``N`` jobs kept running, a new one starting
  when one ends, from the first chat until the last chat is answered; the jobs still
  running then are cancelled. A batch job that keeps the engine busy the whole time the
  chats arrive, however fast the engine is, as in the paper's mixed workload (40 chats at 1
  req/s beside 9 map-reduce jobs).

Each job reads its own chunks: consecutive ones, and where the document runs out they wrap
around, prefixed with the job's number so no job's prompts are another's (a prefix cache
would otherwise serve them). The two parts run under different root chain names ("chat",
"analytics"), so Eclectus sees two applications; the report gives the chat latency (what its
users feel: mean, p50, p90) and what the jobs got done (jobs completed and cancelled, their
output tokens per second, the mean job's duration), so a scheduler that starves the jobs
to speed the chats shows it.
"""

from __future__ import annotations

import asyncio
import gc
import random
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import Runnable, RunnableConfig

from eclectus.recipes import background, map_reduce
from eclectus.recipes.result import RecipeOutput
from eclectus.recipes.target import ModelFactory
from eclectus.recipes.text import split_chunks

SYSTEM = (
    "You are the assistant of the handbook below. Answer each user's question from the "
    "handbook, briefly and accurately; say so when the handbook does not answer it.\n\n"
    "Handbook:\n{handbook}"
)
chat_prompt = ChatPromptTemplate.from_messages([("system", SYSTEM), ("human", "{question}")])


def _background_default() -> map_reduce.MapReduceParams:
    return map_reduce.MapReduceParams(
        chunk_tokens=512, num_chunks=8, map_tokens=50, reduce_tokens=50, width=8
    )


@dataclass(frozen=True, slots=True)
class SharedPromptParams:
    """Sizes of a shared-prompt run (tokens are the model's; see text.approx_tokens)."""

    users: int = 8
    requests: int = 16  # chat requests in all
    rate: float = 4.0  # chat requests per second (Poisson arrivals)
    system_tokens: int = 2048  # the handbook excerpt in the shared system prompt
    answer_tokens: int = 32
    seed: int = 0
    background: map_reduce.MapReduceParams | None = field(default_factory=_background_default)
    background_jobs: int = 1  # open loop: analytics jobs, spread over the chats' window
    # closed loop: analytics jobs kept running from the first chat to the last answer
    # (None: the open loop of background_jobs)
    background_concurrency: int | None = None

    def __post_init__(self) -> None:
        if self.users < 1 or self.requests < 1 or self.rate <= 0:
            raise ValueError("users and requests must be >= 1 and rate > 0")
        if self.background_jobs < 1:
            raise ValueError("background_jobs must be >= 1 (background=None: no job)")
        if self.background_concurrency is not None and self.background_concurrency < 1:
            raise ValueError(
                "background_concurrency must be >= 1 (none: the open loop of background_jobs)"
            )


def questions(params: SharedPromptParams, text: str) -> list[str]:
    """One question per request, each about a sentence of the document, from a user in
    turn (pure: seeded)."""
    sentences = [s for s in re.split(r"(?<=[.!?])\s+", " ".join(text.split())) if len(s) > 40]
    rng = random.Random(params.seed)
    return [
        f"(user {i % params.users}) What does the handbook say about this: "
        f'"{rng.choice(sentences)[:160]}"?'
        for i in range(params.requests)
    ]


def arrivals(params: SharedPromptParams) -> list[float]:
    """Seconds after the start at which each request arrives (Poisson; pure: seeded)."""
    rng, now, out = random.Random(params.seed + 1), 0.0, []
    for _ in range(params.requests):
        out.append(now)
        now += rng.expovariate(params.rate)
    return out


def handbook_and_rest(params: SharedPromptParams, text: str) -> tuple[str, str]:
    """(the handbook excerpt, the text the analytics job reads: what follows it) (pure)."""
    handbook = split_chunks(text, params.system_tokens, 1)[0]
    return handbook, _after_non_space(text, len("".join(handbook.split()))).lstrip()


def _after_non_space(text: str, num_chars: int) -> str:
    """``text`` after its first ``num_chars`` non-whitespace characters (pure). The handbook
    comes from the text with its whitespace runs made single spaces, so its length in the
    original is counted without them."""
    seen = 0
    for i, char in enumerate(text):
        if seen == num_chars:
            return text[i:]
        seen += not char.isspace()
    return ""


def split_document(params: SharedPromptParams, text: str) -> tuple[str, list[str]]:
    """(the handbook excerpt, the first analytics job's chunks from the rest) (pure)."""
    handbook, jobs = split_jobs(params, text)
    return handbook, jobs[0] if jobs else []


def split_jobs(params: SharedPromptParams, text: str) -> tuple[str, list[list[str]]]:
    """(the handbook excerpt, each open-loop analytics job's chunks) (pure): see
    :func:`job_reader`."""
    handbook, read = job_reader(params, text)
    if read is None:
        return handbook, []
    return handbook, [read(k) for k in range(params.background_jobs)]


def job_reader(
    params: SharedPromptParams, text: str
) -> tuple[str, Callable[[int], list[str]] | None]:
    """(the handbook excerpt, job ``k``'s chunks as a function of ``k``; None without a
    background) (pure): job ``k`` takes the ``num_chunks`` chunks after job ``k - 1``'s,
    wrapping around the document; a job that reuses chunks gets them prefixed with its
    number."""
    handbook, rest = handbook_and_rest(params, text)
    if params.background is None:
        return handbook, None
    bg = params.background
    first = split_chunks(rest, bg.chunk_tokens, bg.num_chunks)
    available = split_chunks(rest, bg.chunk_tokens) if bg.num_chunks is not None else first

    def read(k: int) -> list[str]:
        start = k * len(first)
        chunks = [available[(start + i) % len(available)] for i in range(len(first))]
        wrapped = start + len(first) > len(available)
        return [f"[report {k}] {c}" for c in chunks] if wrapped else chunks

    return handbook, read


def job_starts(params: SharedPromptParams) -> list[float]:
    """Seconds after the start at which each analytics job begins (pure): evenly over the
    chats' expected arrival window."""
    window = params.requests / params.rate
    return [k * window / params.background_jobs for k in range(params.background_jobs)]


def plan(params: SharedPromptParams, text: str) -> int:
    """Planned model calls: the chats and the analytics jobs (for a closed loop, whose
    count of jobs depends on the engine's speed, its first ``background_concurrency``)."""
    _, first = split_document(params, text)
    if not first:
        return params.requests
    jobs = params.background_concurrency or params.background_jobs
    return params.requests + jobs * map_reduce.planned_calls(params.background, len(first))[0]  # type: ignore[arg-type]


async def _chat_session(
    chain: Runnable, handbook: str, question: str, at: float, t0: float, config: RunnableConfig
) -> tuple[str, float]:
    """One user's request, sent at its arrival time; (answer, latency in seconds)."""
    await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
    sent = time.perf_counter()
    answer = await chain.ainvoke({"handbook": handbook, "question": question}, config)
    return answer, time.perf_counter() - sent


@dataclass(frozen=True, slots=True)
class Served:
    """What a run's chats and jobs did (times in seconds after the run's start)."""

    answers: list[tuple[str, float]]  # (answer, latency) per chat
    window_s: float  # the last chat's answer
    jobs: list[background.JobRun]
    first_summary: str | None  # the first completed job's summary
    wall_s: float


async def serve(
    params: SharedPromptParams, models: ModelFactory, text: str, config: RunnableConfig
) -> Served:
    handbook, read = job_reader(params, text)
    chat = models.prepare(
        chat_prompt | models.chat(params.answer_tokens) | StrOutputParser(), "shared-prompt chat"
    )
    summaries: dict[int, str] = {}
    run_job = _job_runner(params, models, read, config, summaries)  # compiled before the start
    t0 = time.perf_counter()

    def clock() -> float:
        return time.perf_counter() - t0

    stop = asyncio.Event()
    jobs_task = asyncio.create_task(_background(params, run_job, stop, clock))
    chat_config = {**config, "run_name": "chat", "tags": [*config.get("tags", []), "app:chat"]}
    try:
        answers = await asyncio.gather(
            *(
                _chat_session(chat, handbook, q, at, t0, chat_config)
                for q, at in zip(questions(params, text), arrivals(params), strict=True)
            )
        )
    finally:
        window_s = clock()
        stop.set()  # a closed loop cancels its running jobs; an open one lets them end
        jobs = await jobs_task
    first = min(summaries, default=None)
    return Served(
        list(answers), window_s, jobs, None if first is None else summaries[first], clock()
    )


def _job_runner(
    params: SharedPromptParams,
    models: ModelFactory,
    read: Callable[[int], list[str]] | None,
    config: RunnableConfig,
    summaries: dict[int, str],
) -> background.RunJob | None:
    """Runs analytics job ``k`` (its summary stored in ``summaries[k]``); None without a
    background."""
    if read is None:
        return None
    assert params.background is not None
    bg = params.background
    factory = models.for_objective("throughput")  # the chats are what users wait on
    num_chunks = len(read(0))  # every job has as many
    chain = factory.prepare(map_reduce.build_chain(bg, factory, num_chunks), "analytics")
    job_config: RunnableConfig = {
        **config,
        "run_name": "analytics",
        "tags": [*config.get("tags", []), "app:analytics"],
        "max_concurrency": bg.width,
    }

    async def run_job(k: int) -> None:
        inputs = {f"chunk_{i}": c for i, c in enumerate(read(k))}
        summaries[k] = await chain.ainvoke(inputs, job_config)

    return run_job


async def _background(
    params: SharedPromptParams,
    run_job: background.RunJob | None,
    stop: asyncio.Event,
    clock: background.Clock,
) -> list[background.JobRun]:
    """The analytics jobs of a run: the open loop, or the closed loop until ``stop``."""
    if run_job is None:
        return []
    if params.background_concurrency is None:
        return await background.open_loop(run_job, job_starts(params), clock)
    return await background.closed_loop(run_job, params.background_concurrency, stop, clock)


def drop_cached_async_clients() -> None:
    """Forget langchain_openai's cached async HTTP clients (mutates its module cache).

    langchain_openai keeps one async client per base URL for the life of the process, bound
    to the event loop of its first use; an app that calls ``asyncio.run`` once per run (the
    shared-prompt recipe) then fails on its second run with "Event loop is closed". So each
    run starts with fresh clients (the evals' harness too: each of its runs is a fresh app
    start).
    """
    try:
        from langchain_openai.chat_models import _client_utils
    except ImportError:
        return
    cached = getattr(_client_utils, "_cached_async_httpx_client", None)
    if cached is not None and hasattr(cached, "cache_clear"):
        cached.cache_clear()
        # Collect the dropped clients now, while no event loop runs: their __del__ then finds
        # no loop and does nothing. Collected later, inside the next run's loop, each schedules
        # an aclose() on its own closed loop, and asyncio logs "Event loop is closed" for it.
        gc.collect()


def run(
    params: SharedPromptParams, models: ModelFactory, text: str, config: RunnableConfig
) -> RecipeOutput:
    """Serve the chats beside the analytics jobs; output the first answer and the first
    job's summary."""
    drop_cached_async_clients()  # this run's asyncio.run is a new event loop
    ran = asyncio.run(serve(params, models, text, config))
    latencies = sorted(latency for _, latency in ran.answers)
    details: dict[str, object] = {
        "chat mean latency s": statistics.fmean(latencies),
        "chat p50 latency s": statistics.median(latencies),
        "chat p90 latency s": latencies[int(0.9 * (len(latencies) - 1))],
    }
    output = f"first answer: {ran.answers[0][0]}"
    depth = 1
    if params.background is not None:
        if ran.first_summary is not None:
            output += f"\nanalytics summary: {ran.first_summary}"
        _, chunks = split_document(params, text)
        depth = map_reduce.planned_calls(params.background, len(chunks))[1]
        tokens = map_reduce.planned_output_tokens(params.background, len(chunks))
        details |= background.throughput_details(ran.jobs, ran.window_s, tokens)
        if params.background_concurrency is None:  # the run waited for every job
            details["analytics all done s"] = max(r.end_s for r in ran.jobs)
        details["analytics most jobs at once"] = background.most_at_once(ran.jobs)
    details["all answers"] = len(ran.answers)
    details["chat window s"] = ran.window_s
    details["wall incl. arrivals s"] = ran.wall_s
    return RecipeOutput(output, depth, plan(params, text), details)
