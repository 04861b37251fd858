"""Incremental detokenizer with stop strings, for streaming one output sequence.

Contract of :class:`IncrementalDetokenizer`:
- ``add(token_id) -> DetokDelta`` once per output token (never the prompt's: a stop string in the
  prompt can't match). The token's exact bytes (``token_bytes``) are appended to the output bytes and
  decoded incrementally: an incomplete UTF-8 sequence at the tail stays buffered (no U+FFFD for it);
  a byte sequence that can never become valid is emitted as U+FFFD once the bytes that prove it arrive.
  Special tokens contribute no text when ``params.skip_special_tokens``.
- Stop strings (``params.stop``) are matched on the whole output text, across token boundaries, once
  more than ``params.min_tokens`` tokens were added (vLLM v1). Only matches ending in the newly decoded
  text are looked for (earlier ones were found earlier). When several match, the one that completes
  first wins (smallest end; on a tie the longer, earlier-starting one), so the result does not depend
  on how the text was split into tokens. The text is truncated before the stop string (after it with
  ``include_stop_str_in_output``); ``DetokDelta.stop_string`` names it and the detokenizer is finished.
- Streaming hold-back: the emitted text never includes the longest tail of the text that is a proper
  prefix of some stop string (vLLM PR #45636); it is emitted as soon as it cannot become a stop.
- ``flush()`` at the end (length / eos / stop token) releases the held text. An incomplete UTF-8
  sequence at the end (a reply cut by ``max_tokens`` between the bytes of one character) is dropped,
  never shown as U+FFFD: its character was not generated, and llama-server's stream never sends those
  bytes either (it holds them back until they complete). ``text`` and the token ids still say what was
  generated; only the partial character's bytes are missing from the text. After a stop string or a
  flush, ``add`` returns empty deltas.
- Invariants: ``"".join(deltas) + flush() == text``; without ``include_stop_str_in_output`` no emitted
  chunk contains any character of a matched stop string.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable
from dataclasses import dataclass

from hitenter.sampling_params import SamplingParams

TRIM_CHARS = 512      # the live text window is trimmed when this much emitted text is out of reach


@dataclass(frozen=True)
class DetokDelta:
    text: str                   # newly emitted text (may be empty)
    stop_string: str | None     # the stop string matched by this token, if any
    held: str                   # text decoded but held back (a proper prefix of some stop string)


class IncrementalDetokenizer:
    def __init__(self, token_bytes: Callable[[int], bytes], is_special: Callable[[int], bool],
                 params: SamplingParams) -> None:
        self._token_bytes = token_bytes
        self._is_special = is_special
        self._skip_special = params.skip_special_tokens
        self._stops: list[str] = list(params.stop or ())
        self._include_stop = params.include_stop_str_in_output
        self._min_tokens = params.min_tokens
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        # the text is _head (emitted, beyond any stop match's reach: never looked at again) + _text, so a
        # token costs the same however long the output is (see _trim)
        self._head: list[str] = []
        self._keep = max((len(x) for x in self._stops), default=1) - 1   # chars a new match may reach back
        self._text = ""
        self._emitted = 0             # characters of _text already emitted
        self.token_ids: list[int] = []
        self.stop_string: str | None = None
        self.finished = False

    @property
    def text(self) -> str:
        """The output text decoded so far (truncated at a matched stop string)."""
        return "".join(self._head) + self._text

    @property
    def held(self) -> str:
        return self._text[self._emitted:]

    def add(self, token_id: int) -> DetokDelta:
        """Append one output token; return the text that may now be shown (see module docstring)."""
        if self.finished:
            return DetokDelta("", None, "")
        self.token_ids.append(token_id)
        if self._skip_special and self._is_special(token_id):
            data = b""
        else:
            data = self._token_bytes(token_id)
        old_len = len(self._text)
        self._text += self._decoder.decode(data)
        if self._stops and len(self.token_ids) > self._min_tokens and len(self._text) > old_len:
            match = self._find_stop(old_len)
            if match is not None:
                start, stop = match
                cut = start + len(stop) if self._include_stop else start
                self._text = self._text[:cut]
                self.stop_string = stop
                self.finished = True
                return DetokDelta(self._take(cut), stop, "")
        end = len(self._text) - self._held_len()
        delta = DetokDelta(self._take(max(end, self._emitted)), None, self._text[max(end, self._emitted):])
        self._trim()
        return delta

    def _trim(self) -> None:
        """Move emitted text that no future stop match can reach into _head (in chunks: amortized O(1))."""
        cut = min(self._emitted, len(self._text) - self._keep)
        if cut >= TRIM_CHARS:
            self._head.append(self._text[:cut])
            self._text = self._text[cut:]
            self._emitted -= cut

    def flush(self) -> str:
        """End of generation without a stop string: release the held text; drop an incomplete UTF-8 tail."""
        if self.finished:
            return ""
        self.finished = True
        self._decoder.reset()
        return self._take(len(self._text))

    def _take(self, end: int) -> str:
        out = self._text[self._emitted:end]
        self._emitted = max(self._emitted, end)
        return out

    def _find_stop(self, old_len: int) -> tuple[int, str] | None:
        """The stop match ending after ``old_len`` that completes first (see module docstring)."""
        best: tuple[int, int, str] | None = None   # (end, start, stop)
        for s in self._stops:
            i = self._text.find(s, max(0, old_len - len(s) + 1))
            if i < 0:
                continue
            key = (i + len(s), i, s)
            if best is None or key[:2] < best[:2]:
                best = key
        return None if best is None else (best[1], best[2])

    def _held_len(self) -> int:
        """Length of the longest tail of the unemitted text that is a proper prefix of a stop string."""
        avail = len(self._text) - self._emitted
        best = 0
        for s in self._stops:
            for h in range(min(len(s) - 1, avail), best, -1):
                if self._text.endswith(s[:h]):
                    best = h
                    break
        return best
