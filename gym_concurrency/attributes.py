"""The attributes a limit is reported with, written once for every instrument that carries
them: the observer's, the middleware's queue-wait histogram and the outbound clients'."""

from __future__ import annotations

from . import names
from .limits import Limit

__all__ = ["limit_attributes"]


def limit_attributes(limit: Limit) -> dict[str, str]:
    """The attributes `limit` is reported with (those it has): component, limit_name, server,
    and scope="global" for a limit shared across processes (a process limit has none)."""
    attributes: dict[str, str] = {}
    if limit.component is not None:
        attributes[names.COMPONENT_ATTRIBUTE] = limit.component
    if limit.limit_name is not None:
        attributes[names.LIMIT_NAME_ATTRIBUTE] = limit.limit_name
    if limit.server is not None:
        attributes[names.SERVER_ATTRIBUTE] = limit.server
    if limit.scope == names.GLOBAL_SCOPE:
        attributes[names.SCOPE_ATTRIBUTE] = names.GLOBAL_SCOPE
    return attributes
