"""Strict checks of the settings for flows from credentials (docs/flows.md): `flow_key`, a
secret never shown (not in a repr, a dump or an error), `credential_headers` and
`flow_labels`, which name hashed flows (`{"h:<16 hex>": "team-a"}`)."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator, SecretStr, ValidationError, WrapValidator
from pydantic_core import InitErrorDetails, PydanticCustomError
from pydantic_core.core_schema import ValidatorFunctionWrapHandler

from gym_concurrency.hashed_flows import HASHED_PREFIX

__all__ = ["CredentialHeaders", "FlowKey", "FlowLabels", "check_flow_labels", "without_input"]

_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP header name (RFC 9110)
_FLOW_ID = re.compile(r"^h:[0-9a-f]{16}$")
MIN_KEY_CHARACTERS = 16
_MAX_LABEL_CHARACTERS = 128  # as a flow read from a request (middleware/asks.py)
_HIDDEN = "**********"  # what an error shows for the key, as SecretStr's repr does


def _secret_error(field: str, message: str) -> ValidationError:
    # Raised from a validator, it replaces pydantic's own error, which would show the input.
    return ValidationError.from_exception_data(
        field, [InitErrorDetails(type=PydanticCustomError(field, message), input=_HIDDEN)]
    )


def _check_key(value: Any, handler: ValidatorFunctionWrapHandler) -> SecretStr | None:
    if value is None:
        return None
    if not isinstance(value, str | SecretStr):
        raise _secret_error("flow_key", f"must be text (a secret), not {type(value).__name__}")
    key: SecretStr = handler(value)
    length = len(key.get_secret_value())
    if length < MIN_KEY_CHARACTERS:
        raise _secret_error(
            "flow_key",
            f"must be at least {MIN_KEY_CHARACTERS} characters, got {length} (make one with "
            "python -c 'import secrets; print(secrets.token_hex(32))')",
        )
    return key


def _header_names(value: Any) -> Any:
    # From the environment: "x-team-token,x-other" (or a JSON list, read before this).
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    if not isinstance(value, list | tuple):
        return value
    names = []
    for name in value:
        if not isinstance(name, str) or not _TOKEN.match(name):
            raise ValueError(f"{name!r} is not an HTTP header name")
        names.append(name.lower())
    return tuple(names)


def _labels(value: Any, handler: ValidatorFunctionWrapHandler) -> dict[str, str]:
    # A raw credential put here by mistake is never echoed: errors show no input.
    if not isinstance(value, dict):
        raise _secret_error("flow_labels", "must be a mapping of hashed flow ids to labels")
    labels = {}
    for flow, label in value.items():
        if not isinstance(flow, str) or not _FLOW_ID.match(flow.lower()):
            raise _secret_error(
                "flow_labels",
                "a key is not a hashed flow id, 'h:' and 16 hex digits (not shown: it may be "
                "a credential; python -m gym_concurrency.hashed_flows prints a credential's)",
            )
        if not isinstance(label, str) or not 0 < len(label) <= _MAX_LABEL_CHARACTERS:
            message = f"{flow}: a label is text of 1 to 128 characters"
            raise _secret_error("flow_labels", message)
        if "\0" in label or label.startswith(HASHED_PREFIX):
            message = f"{flow}: a label has no NUL and does not start with 'h:'"
            raise _secret_error("flow_labels", message)
        labels[flow.lower()] = label
    checked: dict[str, str] = handler(labels)
    return checked


FlowKey = Annotated[SecretStr | None, WrapValidator(_check_key)]
CredentialHeaders = Annotated[tuple[str, ...], BeforeValidator(_header_names)]
FlowLabels = Annotated[dict[str, str], WrapValidator(_labels)]


def check_flow_labels(labels: dict[str, str], key: SecretStr | None) -> None:
    """ValueError for labels without a key: the ids they name are made with the key."""
    if labels and key is None:
        raise ValueError(
            "flow_labels: the ids it names are hashed with flow_key, which is not set (the "
            "key made per process when it is unset names no flow the same twice)"
        )


def without_input(error: ValueError) -> ValidationError:
    """`error` of the settings as a whole, without the input pydantic would show with it
    (every setting, flow_key too)."""
    details = InitErrorDetails(type="value_error", ctx={"error": error}, input=_HIDDEN)
    return ValidationError.from_exception_data("ConcurrencySettings", [details])
