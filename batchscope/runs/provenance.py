"""The header every result file carries (a load summary, a run result, a comparison, a server search): its
format's version, which each model sets, and the batchscope that wrote it."""

from __future__ import annotations

from pydantic import BaseModel, Field

import batchscope


class Provenance(BaseModel):
    """Subclassed by every result model; each narrows ``schema_version`` to its own versions and default."""

    schema_version: int = Field(description="Bumped when a field changes meaning.")
    tool_version: str = Field(batchscope.__version__, description="batchscope version that wrote it.")
