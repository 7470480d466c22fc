"""The cyclic garbage collector in the controller: what is alive frozen after each snapshot.

A controller at scale keeps millions of long-lived objects (the watch caches, the snapshot
memo, the latest snapshot), and every full collection walks all of them: at 400 racks /
20,000 workloads about 1.1 s CPU every other reconcile (docs/benchmarks.md, "Scale").
``gc.freeze()`` after each snapshot moves what is alive into the permanent generation, which
collections skip; what becomes garbage later is still freed by reference counting. Reference
cycles among frozen objects are not collected, so every ``unfreeze_every`` snapshots everything
is unfrozen and the next full collection sees it all once.
"""

from __future__ import annotations

from m2g.model import collector


class CollectorFreezer:
    """Call ``after_snapshot()`` once per reconcile, after the snapshot is built."""

    def __init__(self, unfreeze_every: int = 30) -> None:
        self.unfreeze_every = max(1, unfreeze_every)
        self.snapshots = 0

    def after_snapshot(self) -> None:
        self.snapshots += 1
        if self.snapshots % self.unfreeze_every == 0:
            collector.unfreeze()  # the next full collection walks everything once (cycles freed)
        else:
            collector.freeze()  # (through m2g.model.collector: its blocks then freeze too)
