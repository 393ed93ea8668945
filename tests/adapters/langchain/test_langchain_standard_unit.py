"""LangChain's standard unit suite for ChatEclectus (no server needed)."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.load import dumpd, load
from langchain_tests.unit_tests import ChatModelUnitTests
from lc_helpers import ChatEclectusFeatures

from eclectus.adapters.langchain import ChatEclectus, EclectusLLM


class TestChatEclectusUnit(ChatEclectusFeatures, ChatModelUnitTests):
    """Construction, standard params and env defaults; the features it declares
    (lc_helpers.ChatEclectusFeatures) are exercised by the integration suite."""

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"model": "tiny", "base_url": "ws://127.0.0.1:1"}

    @property
    def init_from_env_params(self) -> tuple[dict[str, str], dict[str, Any], dict[str, Any]]:
        env = {"ECLECTUS_URL": "ws://example.invalid:9", "ECLECTUS_TOKEN": "secret-token"}
        expected = {"eclectus_url": env["ECLECTUS_URL"], "eclectus_api_key": "secret-token"}
        return env, {"model": "tiny"}, expected

    @pytest.mark.xfail(
        strict=True,
        raises=ValueError,
        reason="the suite loads with allowed_objects='all', which langchain_core limits to "
        "its own mapping of partner packages; a third-party class must be allowed by name "
        "(test_models_round_trip_through_dumpd_and_load does that)",
    )
    def test_serdes(self, model: BaseChatModel, snapshot: Any) -> None:
        super().test_serdes(model, snapshot)


@pytest.mark.filterwarnings("ignore::langchain_core._api.beta_decorator.LangChainBetaWarning")
@pytest.mark.parametrize("cls", [ChatEclectus, EclectusLLM])
def test_models_round_trip_through_dumpd_and_load(cls: type[ChatEclectus | EclectusLLM]) -> None:
    """Both models serialize (the token as a reference to ECLECTUS_TOKEN, never its value)
    and load back equal when the class is allowed by name."""
    model = cls(model="tiny", api_key="s3cr3t-value", base_url="ws://h:1", max_tokens=7, stop=["a"])
    data = dumpd(model)
    assert "s3cr3t-value" not in str(data)
    loaded = load(
        data,
        allowed_objects=[cls],
        valid_namespaces=["eclectus"],
        secrets_map={"ECLECTUS_TOKEN": "s3cr3t-value"},
    )
    assert loaded == model and loaded.token == "s3cr3t-value"
