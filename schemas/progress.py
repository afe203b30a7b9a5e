"""Progress events a running export emits."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from schemas._base import StrictModel
from schemas.errors import Stage


class Progress(StrictModel):
    """A stage, how far along it is, and a short line for people."""

    stage: Stage
    fraction: Annotated[float, Field(ge=0, le=1)]
    message: str = ""
