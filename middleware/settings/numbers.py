"""Numbers are numbers: a number field takes a number or its decimal text (as an environment
variable gives it), never a boolean, and never YAML 1.1's octal, sexagesimal or underscores."""

from __future__ import annotations

import re
import types
import typing
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ValidationInfo, field_validator

__all__ = ["DECIMAL", "WHOLE", "NumbersAreNumbers", "number", "union_members"]

WHOLE = re.compile(r"[+-]?(?:0|[1-9][0-9]*)")
DECIMAL = re.compile(r"[+-]?(?:(?:0|[1-9][0-9]*)(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _number_kind(annotation: Any) -> tuple[type | None, bool]:
    """(int or float if the field holds that number, else None; whether a string is valid)."""
    kinds: set[Any] = set()
    strings = False
    for arg in union_members(annotation):
        if typing.get_origin(arg) is Literal:
            strings = strings or any(isinstance(v, str) for v in typing.get_args(arg))
        elif arg is str:
            strings = True
        else:
            kinds.add(arg)
    if bool in kinds:
        return None, strings
    if int in kinds:
        return int, strings
    if float in kinds:
        return float, strings
    return None, strings


def union_members(annotation: Any) -> list[Any]:
    if typing.get_origin(annotation) is Annotated:
        return union_members(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(annotation) for m in union_members(arg)]
    return [annotation]


def number(kind: type, value: Any, strings: bool) -> Any:
    """`value` for a number field of `kind`: a number, or the decimal text of one (as an
    environment variable gives it); a boolean or any other text is an error."""
    if isinstance(value, bool):
        raise ValueError(
            f"must be a number, got the boolean {str(value).lower()} (YAML reads yes/no/on/off "
            "and true/false as booleans; write the number)"
        )
    if not isinstance(value, str):
        return value
    text = value.strip()
    if kind is int and WHOLE.fullmatch(text):
        return int(text)
    if kind is float and DECIMAL.fullmatch(text):
        return float(text)
    if strings:
        return value
    hint = ""
    if re.fullmatch(r"[+-]?0[0-9_]+(?:\.[0-9]*)?", text):
        hint = " (a leading zero is ambiguous: YAML 1.1 reads 010 as octal 8)"
    elif ":" in text:
        hint = " (YAML 1.1 reads 1:30 as the sexagesimal 90)"
    elif text.lower() in ("yes", "no", "on", "off", "y", "n"):
        hint = f" (YAML 1.1 reads {text} as a boolean; write the number, or null where allowed)"
    whole = "a whole number" if kind is int else "a number"
    raise ValueError(f"must be {whole} written in decimal, got {value!r}{hint}")


class NumbersAreNumbers(BaseModel):
    """A number field takes a number or its decimal text, never a boolean or other text."""

    @field_validator("*", mode="before")
    @classmethod
    def _numbers_are_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        if info.field_name is None:
            return value
        kind, strings = _number_kind(cls.model_fields[info.field_name].annotation)
        return value if kind is None else number(kind, value, strings)
