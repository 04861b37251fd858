"""``--api-key``: a dependency on every router that runs the model, tokenizes or shows requests; the key is
read from ``Authorization: Bearer <key>`` (OpenAI, Ollama clients) or ``x-api-key`` (Anthropic)."""

from __future__ import annotations

import secrets
from typing import Annotated, Any

from fastapi import Depends
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from hitenter.server.api_error import APIError

_bearer = HTTPBearer(auto_error=False, description="the server's --api-key")


_x_api_key = APIKeyHeader(name="x-api-key", auto_error=False, description="the server's --api-key (Anthropic clients)")


Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


XApiKey = Annotated[str | None, Depends(_x_api_key)]


def api_key_dependency(api_key: str) -> Any:
    """``Depends(...)`` that answers 401 (with ``WWW-Authenticate: Bearer``) unless a key matches."""
    expected = api_key.encode()

    async def require_api_key(creds: Credentials, x_api_key: XApiKey) -> None:
        sent = [creds.credentials if creds is not None else "", x_api_key or ""]
        if not any(secrets.compare_digest(k.encode(), expected) for k in sent):
            raise APIError(401, "invalid or missing API key: send 'Authorization: Bearer <key>' "
                           "(or 'x-api-key: <key>')")

    return Depends(require_api_key)
