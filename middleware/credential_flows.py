"""Which route flows are kept only as keyed hashes (gym_concurrency.hashed_flows), and with
what key: a flow read from a credential header (the built-in ones and the settings'
`credential_headers`) or from a `hash:` source; the key is the settings' `flow_key`, else the
one made for this process (made, and warned of, only once a route needs it)."""

from __future__ import annotations

from gym_concurrency.hashed_flows import CREDENTIAL_HEADERS, FlowHasher, process_flow_key

from .settings import ConcurrencySettings

__all__ = ["CredentialFlows"]


class CredentialFlows:
    """The flow hashing one set of settings asks for."""

    __slots__ = ("_hasher", "_headers", "_settings")

    def __init__(self, settings: ConcurrencySettings) -> None:
        self._settings = settings
        self._headers = CREDENTIAL_HEADERS | set(settings.credential_headers)
        self._hasher: FlowHasher | None = None

    def hashes(self, source: str) -> bool:
        """Whether a flow read from `source` (a `RouteLimit.flow`) is kept as its hash."""
        kind, _, name = source.partition(":")
        return kind == "hash" or (kind == "header" and name.lower() in self._headers)

    def hasher(self) -> FlowHasher:
        """The hasher of these settings' key and labels."""
        if self._hasher is None:
            secret = self._settings.flow_key
            key = process_flow_key() if secret is None else secret.get_secret_value().encode()
            self._hasher = FlowHasher(key, self._settings.flow_labels)
        return self._hasher
