"""The client's view of a run: each call's span says which part of the app made it."""

from __future__ import annotations

import pytest
from recipe_support import TEXT

from eclectus.recipes import MapReduceParams, SharedPromptParams, run_recipe
from eclectus.recipes.embedded import Embedded
from eclectus.recipes.observe import DEFAULT_LABEL, label_of

pytestmark = pytest.mark.slow


def test_label_of_reads_the_app_tag() -> None:
    assert label_of(["seq:step:1", "app:chat"]) == "chat"
    assert label_of(["map:key:summaries"]) == label_of(None) == DEFAULT_LABEL


def test_chats_and_the_background_job_are_told_apart(embedded: Embedded) -> None:
    """A shared-prompt run over /v1 (calls seen one by one on the client): every chat span
    is labelled chat, every span of the job analytics."""
    background = MapReduceParams(chunk_tokens=64, num_chunks=2, map_tokens=4, reduce_tokens=4)
    params = SharedPromptParams(
        users=2, requests=2, rate=50.0, system_tokens=128, answer_tokens=4, background=background
    )
    result = run_recipe("shared-prompt", params, embedded.target("openai"), text=TEXT)
    labels = [span.label for span in result.timeline]
    assert sorted(labels) == ["analytics"] * 3 + ["chat"] * 2
