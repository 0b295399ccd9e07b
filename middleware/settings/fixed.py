"""What a reload may not change: a settings field annotated `Annotated[..., Fixed]` keeps the
value its running limits were made with; `fixed_fields(model)` lists a model's, read from the
model itself (a field added with the marker is refused on reload with no list to update)."""

from __future__ import annotations

import functools
from typing import Final

from pydantic import BaseModel

__all__ = ["Fixed", "fixed_fields"]


class _FixedOnReload:
    """The marker's type: pydantic keeps metadata it does not know and ignores it."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "Fixed"


Fixed: Final = _FixedOnReload()


@functools.cache
def fixed_fields(model: type[BaseModel]) -> frozenset[str]:
    """The fields of `model` annotated `Fixed`."""
    fields = model.model_fields.items()
    return frozenset(name for name, field in fields if any(m is Fixed for m in field.metadata))
