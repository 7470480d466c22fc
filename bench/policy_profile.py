"""Per-policy cost of the Admission and Placement stages on the benchmark workloads.

For each policy: µs per workload of its fused batch evaluation (cel-expr-python) and whether
it runs fused ("whole" / "per-rule") or falls back to one-input-at-a-time ("FALLBACK", slow:
the fused expression failed to compile — too deep for the parser — or raised for some item).
Use it when writing policies: ``python bench/policy_profile.py [--policies DIR]``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from m2g.policy import Evaluator, Stage, load_dir
from m2g.policy.batch import _run_fused
from m2g.policy.runtime import BATCH_ITEMS
from m2g.testing.scenarios import SCENARIOS, inputs

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--policies", type=Path, default=ROOT / "policies")
    ap.add_argument("-n", type=int, default=400)
    args = ap.parse_args()
    ev = Evaluator(load_dir(args.policies, "cel-expr-python"))
    rt = ev.policy_set.runtime
    items = inputs(args.n)
    total = 0.0
    stages = (Stage.ADMISSION, Stage.PLACEMENT, Stage.PREEMPTION)
    for policy in (p for s in stages for p in ev.policy_set.by_stage[s]):
        fused = ev._fused.get(policy)
        kind = "FALLBACK" if fused is None else ("whole" if fused.whole else "per-rule")
        cost = 0.0
        for k, _ in enumerate(SCENARIOS):
            batch = items[k::len(SCENARIOS)]
            act = rt.activation({**batch[0].shared_data(), BATCH_ITEMS: [
                {"w": b.workload_data(), "q": b.queue_data()} for b in batch]})
            t0 = time.perf_counter()
            ok = _run_fused(fused, policy, act) is not None
            cost += (time.perf_counter() - t0) / len(batch) / len(SCENARIOS)
            kind = kind if ok else "FALLBACK"
        total += cost
        print(f"{cost * 1e6:8.1f} µs/workload  {kind:8}  {policy.stage.value:10} {policy.name}")
    print(f"{total * 1e6:8.1f} µs/workload in all (CEL evaluation only, batches of {args.n // 4})")


if __name__ == "__main__":
    main()
