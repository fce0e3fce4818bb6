"""Incremental detokenisation with stop strings: text is released only once it cannot be the
start of a stop string, and generation ends at the first stop string (which is cut)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class StreamDecoderLike(Protocol):
    def feed(self, token_id: int) -> str: ...

    def flush(self) -> str: ...


class TextStopper:
    def __init__(self, decoder: StreamDecoderLike, stop: Sequence[str]) -> None:
        self.decoder = decoder
        self.stop = tuple(stop)
        self.text = ""  # everything decoded so far, stop string included once found
        self.emitted_len = 0
        self.stopped = False

    def feed(self, token_id: int) -> str:
        """Decode one token; return the text that is now safe to emit."""
        self.text += self.decoder.feed(token_id)
        return self._release(final=False)

    def finish(self) -> str:
        """Flush what is held back (the request ended for another reason)."""
        if not self.stopped:
            self.text += self.decoder.flush()
        return self._release(final=True)

    @property
    def final_text(self) -> str:
        return self.text[: self.emitted_len]

    def _release(self, *, final: bool) -> str:
        if self.stopped:
            return ""
        if self.stop:
            longest = max(len(s) for s in self.stop)
            search_from = max(0, self.emitted_len - longest + 1)
            hits = [i for s in self.stop if (i := self.text.find(s, search_from)) >= 0]
            if hits:
                self.stopped = True
                return self._emit_to(min(hits))
        if final or not self.stop:
            return self._emit_to(len(self.text))
        # Hold back the longest tail that could still grow into a stop string.
        hold = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(self.text)), hold, -1):
                if self.text.endswith(s[:n]):
                    hold = n
                    break
        return self._emit_to(len(self.text) - hold)

    def _emit_to(self, end: int) -> str:
        end = max(end, self.emitted_len)
        piece = self.text[self.emitted_len : end]
        self.emitted_len = end
        return piece
