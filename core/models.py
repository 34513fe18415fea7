"""The base of every config model: unknown keys are errors and a loaded config is immutable."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """A config model that refuses unknown keys (typos surface at load time) and is frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)
