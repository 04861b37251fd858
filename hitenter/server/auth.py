"""``--api-key``: a FastAPI dependency attached to every router that runs the model, tokenizes or shows
requests (the OpenAI routes, /tokenize, /detokenize, /playground/api/*, and /metrics unless public).
It is declared as HTTP bearer security in the OpenAPI schema."""

from __future__ import annotations

import secrets
from typing import Annotated, Any

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from hitenter.server import protocol as P

_bearer = HTTPBearer(auto_error=False, description="the server's --api-key")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def api_key_dependency(api_key: str) -> Any:
    """``Depends(...)`` that answers 401 (with ``WWW-Authenticate: Bearer``) unless the key matches."""
    expected = api_key.encode()

    async def require_api_key(creds: Credentials) -> None:
        got = creds.credentials.encode() if creds is not None else b""
        if not secrets.compare_digest(got, expected):
            raise P.APIError(401, "invalid or missing API key: send 'Authorization: Bearer <key>'")

    return Depends(require_api_key)
