"""Prompt caching as hosted providers count it, for the fake servers: which prefix of a prompt was
seen recently, by whom, and how many tokens of it a request reads from the cache.

A prompt is a sequence of chunks (a provider's fake decides where they end: OpenAI every 128 tokens
past the first 1,024, Anthropic at content blocks); a prefix is named by a digest of the chunks up to
it, so nothing of the prompt itself is kept. Entries live for a time-to-live refreshed by each read,
within a scope (OpenAI caches per organisation and model; Anthropic per workspace and model).
"""

from __future__ import annotations

import hashlib
import threading
import time
from typing import Callable, Hashable, Iterable

from tests.scripts.fake_server import tokens

Prefix = tuple[int, str]  # (tokens up to the end of the prefix, digest)


def prefixes(chunks: Iterable[str]) -> list[Prefix]:
    """Every prefix that ends at a chunk's end, in order: (its tokens, its digest)."""
    digest, out, chars = hashlib.sha256(), [], 0
    for chunk in chunks:
        digest.update(chunk.encode())
        chars += len(chunk)
        out.append((chars // 4, digest.copy().hexdigest()))  # as tokens() counts
    return out


def automatic(text: str, minimum: int = 1024, step: int = 128) -> list[Prefix]:
    """OpenAI's cacheable prefixes of a prompt: the first ``minimum`` tokens, then every ``step`` tokens more."""
    if tokens(text) < minimum:
        return []
    ends = range(minimum * 4, len(text) + 1, step * 4)
    return prefixes(text[start:end] for start, end in zip([0, *ends], ends))


class PrefixCache:
    """The prefixes a provider holds; ``clock`` is injectable so a test can let entries expire without waiting."""

    def __init__(self, ttl: float = 300.0, clock: Callable[[], float] = time.monotonic):
        self.ttl, self.clock = ttl, clock
        self.entries: dict[tuple[Hashable, str], tuple[float, float]] = {}  # (scope, digest) -> (expiry, ttl)
        self.lock = threading.Lock()

    def read(self, scope: Hashable, candidates: Iterable[Prefix]) -> int:
        """Tokens of the longest candidate held in ``scope`` (0 if none); the one read lives on."""
        now, best = self.clock(), None
        with self.lock:
            for count, digest in candidates:
                expiry, ttl = self.entries.get((scope, digest), (0.0, 0.0))
                if expiry > now and (best is None or count > best[0]):
                    best = (count, digest, ttl)
            if best is None:
                return 0
            self.entries[(scope, best[1])] = (now + best[2], best[2])
            return best[0]

    def write(self, scope: Hashable, written: Iterable[Prefix], ttl: float | None = None) -> None:
        life = self.ttl if ttl is None else ttl
        now = self.clock()
        with self.lock:
            for _, digest in written:
                expiry, kept = self.entries.get((scope, digest), (0.0, 0.0))
                self.entries[(scope, digest)] = (max(expiry, now + life), max(kept, life))
