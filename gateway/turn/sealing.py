"""Sealed content: what only this gateway can read back.

Reasoning (`include: ["reasoning.encrypted_content"]`) and compaction
summaries travel through stateless clients (Codex sends its whole history
every turn) as opaque `encrypted_content`.  They are sealed with a key of
the gateway's (Fernet: AES with an HMAC), so clients cannot read or forge
them, and a gateway that did not seal a value ignores it.
"""

from __future__ import annotations

import base64
import hashlib
import logging
from typing import Any

import orjson
from cryptography.fernet import Fernet, InvalidToken

__all__ = ["Sealer"]

log = logging.getLogger("gateway")

_PREFIX = "gws1."


class Sealer:
    def __init__(self, secret: str | None) -> None:
        """`secret`: any string shared by the gateway's processes; None makes a key for this process only."""
        if secret:
            key = base64.urlsafe_b64encode(hashlib.sha256(secret.encode()).digest())
        else:
            key = Fernet.generate_key()
            log.warning(
                "GATEWAY_SECRET_KEY is not set: sealed reasoning and compaction can be read back by this process only"
            )
        self._fernet = Fernet(key)

    def seal(self, kind: str, value: dict[str, Any]) -> str:
        return _PREFIX + self._fernet.encrypt(orjson.dumps({"kind": kind, **value})).decode()

    def open(self, kind: str, token: str) -> dict[str, Any] | None:
        """The sealed value, or None when it is not ours, was tampered with, or is of another kind."""
        if not isinstance(token, str) or not token.startswith(_PREFIX):
            return None
        try:
            value = orjson.loads(self._fernet.decrypt(token[len(_PREFIX) :].encode()))
        except (InvalidToken, orjson.JSONDecodeError, ValueError):
            return None
        return value if isinstance(value, dict) and value.get("kind") == kind else None
