"""The Responses API's memory (``store: true``, the default): the last ``MAX_STORED`` responses, each with
the conversation that led to it, for ``previous_response_id`` and GET / DELETE /v1/responses/{id}.

In memory only, bounded by count (the oldest is dropped first); a server restart forgets everything.
A stored conversation holds the template messages of the inputs and of the reply (not the request's
``instructions``, which OpenAI does not carry to the next response either).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

MAX_STORED = 256


@dataclass
class Stored:
    body: dict[str, Any]                   # the response object as returned
    history: list[dict[str, Any]]          # template messages: everything before, this reply included


class ResponseStore:
    def __init__(self, capacity: int = MAX_STORED) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, Stored] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, body: dict[str, Any], history: list[dict[str, Any]]) -> None:
        with self._lock:
            self._items[body["id"]] = Stored(body, history)
            self._items.move_to_end(body["id"])
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)

    def get(self, response_id: str) -> Stored | None:
        with self._lock:
            return self._items.get(response_id)

    def delete(self, response_id: str) -> bool:
        with self._lock:
            return self._items.pop(response_id, None) is not None
