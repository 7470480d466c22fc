"""Per-policy cost of the Admission and Placement stages on the benchmark workloads.

For each policy: µs per workload of its own fused batch evaluation (cel-expr-python; the
snapshot's CEL values already converted, as in a running controller) and whether it runs fused
("whole" / "per-rule") or falls back to one-input-at-a-time ("FALLBACK", slow: the fused
expression failed to compile — too deep for the parser — or raised for some item). Then the same
for all of them in the one combined expression that Evaluator uses.
Use it when writing policies: ``python bench/policy_profile.py [--policies DIR]``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from m2g.policy import Evaluator, Stage, load_dir
from m2g.policy.batch import batch_items, run_fused, split_by_gates
from m2g.testing.scenarios import SCENARIOS, inputs

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--policies", type=Path, default=ROOT / "policies")
    ap.add_argument("-n", type=int, default=400)
    ap.add_argument("--repeat", type=int, default=5, help="best of this many runs")
    args = ap.parse_args()
    ev = Evaluator(load_dir(args.policies, "cel-expr-python"))
    rt = ev.policy_set.runtime
    cache = ev._fused
    items = inputs(args.n)
    stages = (Stage.ADMISSION, Stage.PLACEMENT)
    policies = [p for s in stages for p in ev.policy_set.by_stage[s]]
    batches, combined = [], []
    for k, _ in enumerate(SCENARIOS):
        batch = items[k::len(SCENARIOS)]
        ev.admission_many(batch[:1])  # gates and hoisted variables of this snapshot
        snap = cache.snapshots.get(batch[0])
        data = batch_items(cache, policies, batch)
        batches.append((snap.activation(rt), data))
        combined.append(split_by_gates(cache, snap, policies)[1])

    def cost(run: object) -> tuple[float, bool]:
        best, ok = float("inf"), True
        for _ in range(args.repeat):
            t = 0.0
            for act, data in batches:
                t0 = time.perf_counter()
                ok = run(act, data) is not None and ok  # type: ignore[operator]
                t += (time.perf_counter() - t0) / len(data) / len(batches)
            best = min(best, t)
        return best, ok

    total = 0.0
    for policy in policies:
        fused = cache.get(policy)
        kind = "FALLBACK" if fused is None else ("whole" if fused.whole else "per-rule")
        t, ok = cost(lambda act, data, p=policy: run_fused(cache, p, act, data))
        total += t
        print(f"{t * 1e6:8.1f} µs/workload  {kind if ok else 'FALLBACK':8}  "
              f"{policy.stage.value:10} {policy.name}")
    print(f"{total * 1e6:8.1f} µs/workload in all, one policy at a time "
          "(every match condition and variable per workload)")
    if any(c is None for c in combined):
        print("no combined expression (it does not compile)")
        return
    progs = {id(act): c.program for (act, _), c in zip(batches, combined, strict=True) if c}
    t, ok = cost(lambda act, data: cache.run(progs[id(act)], act, data))
    print(f"{t * 1e6:8.1f} µs/workload combined, as Evaluator runs it (snapshot-only match "
          f"conditions and variables once per snapshot){'' if ok else ' FAILED'}; "
          f"batches of {args.n // len(SCENARIOS)}")


if __name__ == "__main__":
    main()
