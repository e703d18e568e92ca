"""The errors of the hub client, for the CLI and ``LLM(...)`` to report as they are."""

from __future__ import annotations


class HubError(Exception):
    """A model reference that cannot be served: a bad reference, a repo or quant the hub does
    not have, a corrupt download, a hub that cannot be reached. The message says which and
    what to do."""


class ModelNotPulled(HubError, FileNotFoundError):
    """The reference is not in the local cache and the hub may not be asked (offline)."""
