"""What every config block is made of: a frozen model (`Block`) whose fields are `setting`s, each
with its default, its description and, where the block decides staleness by it, whether a change
can change what a stage produces (`x-changes-outputs`)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, WrapValidator

CHANGES_OUTPUTS = "x-changes-outputs"


class Block(BaseModel):
    """A config block: unknown keys refused, frozen once read. Its docstring is the block's
    description in the schema."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def setting(default, *, description: str, changes_outputs: bool | None = None, **constraints) -> Any:
    """A field of a Block: its one default, its description and, in a block that marks them,
    whether a change can change outputs. `constraints` are pydantic's (ge, gt, le, min_length)."""
    extra = {CHANGES_OUTPUTS: changes_outputs} if changes_outputs is not None else None
    return Field(default, description=description, json_schema_extra=extra, **constraints)


def _keep_int(value, handler):
    """A JSON number as written: an int stays an int (a setting's repr decides staleness, and
    `1` is not `1.0` there), once it passed the float's checks."""
    checked = handler(value)
    return value if type(value) is int else checked


def number(**constraints) -> Any:
    """The schema's `number` under pydantic's `constraints` (gt, ge, le; checked before the value
    is kept as given): for a number inside a union, where a field's own constraints do not reach."""
    return Annotated[float, Field(**constraints), WrapValidator(_keep_int)]


Number = number()  # an int or a float, kept as given


def block(cls: type[Block]) -> Any:
    """A block inside a block (hidden_states.fidelity, and each block of the config): its own
    defaults when it is left out."""
    return Field(default_factory=cls, json_schema_extra={"default": {}})
