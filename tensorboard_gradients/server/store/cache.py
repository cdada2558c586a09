"""What the `registry.Store` keeps between requests (thread-safe): values by key while their
signature holds (for a tag's source, what it was built from: see `registry`), and per kept
value what routes derived from it. Kept values are bounded by bytes, least recently used first
out; the newest always stays, so a series larger than the budget is still served from memory
while it is asked for.
"""

import collections
import dataclasses
import threading

# Derivations (classes, alerts, encoded answers) kept per value, the newest first to stay.
_DERIVED_PER_VALUE = 12


@dataclasses.dataclass(frozen=True)
class _Entry:
    value: object
    signature: tuple
    nbytes: int


class Cache:
    """Values by key while their signature holds, within ``budget_bytes``."""

    def __init__(self, budget_bytes: int):
        self._budget_bytes = budget_bytes
        self._entries: "collections.OrderedDict[tuple, _Entry]" = collections.OrderedDict()
        self._nbytes = 0  # of the entries
        self._lock = threading.Lock()

    def get(self, key: tuple, signature: tuple):
        """The value kept under ``key`` if it was kept with ``signature``, else None."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            if entry.signature != signature:
                del self._entries[key]
                self._nbytes -= entry.nbytes
                return None
            self._entries.move_to_end(key)
            return entry.value

    def put(self, key: tuple, value, signature: tuple, nbytes: int):
        with self._lock:
            old = self._entries.pop(key, None)
            self._nbytes += nbytes - (0 if old is None else old.nbytes)
            self._entries[key] = _Entry(value, signature, nbytes)
            while len(self._entries) > 1 and self._nbytes > self._budget_bytes:
                self._nbytes -= self._entries.popitem(last=False)[1].nbytes

    def derived(self, derivations: collections.OrderedDict, key: tuple, compute):
        """``compute()`` once per ``key`` among ``derivations`` (a kept value's own dict: they
        go with it); the newest few are kept."""
        with self._lock:
            if key in derivations:
                derivations.move_to_end(key)
                return derivations[key]
        value = compute()
        with self._lock:
            derivations[key] = value
            while len(derivations) > _DERIVED_PER_VALUE:
                derivations.popitem(last=False)
        return value
