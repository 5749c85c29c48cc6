"""The base of the sweep file's models: strict (an unknown key is an error, never ignored),
frozen, and without NaN or infinity unless a field allows them; and the token count every
length of the file is."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

MAX_TOKENS = 1_048_576

Tokens = Annotated[int, Field(gt=0, le=MAX_TOKENS, strict=True)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
