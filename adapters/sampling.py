"""The sampling payload of a framework adapter's call: the contract's own SamplingParams.

Both adapters build :class:`~eclectus.protocol.SamplingParams` directly from layers of
settings (constructor fields, extra keyword arguments, call-time overrides); a field no
layer sets keeps the contract's default, which is stated once, in
``eclectus/protocol/sampling.py`` (docs/protocol.md has the table). The keys an adapter
accepts are the contract's fields, so a new sampling option reaches every adapter without
touching it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from eclectus.protocol import SamplingParams

SAMPLING_KEYS: frozenset[str] = frozenset(SamplingParams.model_fields)


def build_sampling(*layers: Mapping[str, Any], where: str) -> SamplingParams:
    """One SamplingParams from ``layers``, later layers winning; a None value means "not
    set here" (the contract's default, or an earlier layer, stands). Keys outside the
    contract are a ValueError, as is an out-of-range value; both name ``where``. Pure."""
    merged: dict[str, Any] = {}
    for layer in layers:
        unknown = sorted(set(layer) - SAMPLING_KEYS)
        if unknown:
            raise ValueError(f"{where}: {', '.join(unknown)} is not a sampling option")
        merged.update({key: value for key, value in layer.items() if value is not None})
    try:
        return SamplingParams.model_validate(merged)
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        raise ValueError(f"{where}: invalid sampling settings: {exc}") from exc


def explicit(sampling: SamplingParams) -> dict[str, Any]:
    """The fields of ``sampling`` that differ from the contract's defaults, as plain JSON
    values (for labels, cache keys and LangSmith; pure)."""
    return sampling.model_dump(mode="json", exclude_defaults=True)
