"""Python's cyclic garbage collector kept off the donors a late replica's sync adds.

Every catalog entry is an object the cyclic collector tracks. While a replica takes a million of them from its peers,
the collector's full collections (one each time the objects that survived since the last grew by a quarter) walk
every entry again, about five times in all over the sync. :class:`SyncGcFreeze` moves everything alive into the
interpreter's permanent generation after each page (``gc.freeze``: constant time), which collections skip, and back
into the oldest generation once the sync is over (``gc.unfreeze``), where the next full collection walks it once.

Frozen objects are still freed by reference counting; only garbage *cycles* reaching a frozen object wait for the
thaw, so what the freeze holds back is bounded by the sync's length (its peers answer or are given up within
seconds). The generations are the process's: a freeze and a thaw cover every object in it, not only this router's.

The add of a chunk of donors itself runs with the collector off (:meth:`SyncGcFreeze.adding`), while more pages are
awaited: each of its ~2,000 new entries would otherwise be walked by a young collection (one every 700 new objects)
and again by the next generation's, ~10% of the add's CPU, only to find no garbage; what the add made is frozen
before the collector runs again.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


class SyncGcFreeze:
    """Freezes after each page of a sync in progress; thaws when the sync is over (a no-op if it froze nothing)."""

    def __init__(self) -> None:
        self.frozen = False

    def page_added(self, syncing: bool) -> None:
        """A sync page's donors were added; ``syncing``: more pages are awaited."""
        if syncing:
            gc.freeze()
            self.frozen = True
        else:
            self.thaw()

    @contextmanager
    def adding(self, syncing: bool) -> Iterator[None]:
        """An add of sync pages' donors; ``syncing``: more pages are awaited. Then the collector does not run during
        the add, and everything alive is frozen (as :meth:`page_added` freezes) before it runs again; otherwise (or
        with the collector off already) the add runs as any code does."""
        if not syncing or not gc.isenabled():
            yield
            return
        gc.disable()
        try:
            yield
        finally:
            gc.freeze()
            self.frozen = True
            gc.enable()

    def thaw(self) -> None:
        if self.frozen:
            gc.unfreeze()
            self.frozen = False
