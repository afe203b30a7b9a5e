"""Base model and version shared by every document of the contract."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

SCHEMA_VERSION = "1.0"
"""MAJOR.MINOR of every JSON document torchport writes; new fields get defaults."""


class StrictModel(BaseModel):
    """A model that refuses unknown fields, so typos surface as `invalid_request`."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
