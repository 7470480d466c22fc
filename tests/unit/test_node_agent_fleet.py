"""The node agent's loop in fleet mode (m2g_controllers.nodeagent.Agent): the statuses of
many nodes go out concurrently but bounded, one failed write does not hold up the others, and
the Nodes are listed only when due — against a fake API (the real one: test_node_agent_e2e)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from m2g.k8s import client as k
from m2g.nodeagent.core import NodeAgentCore
from m2g.nodeagent.nvml import FakeNvml
from m2g_controllers import nodeagent as na

T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


def limit(node: str, fraction: float = 0.5) -> dict[str, Any]:
    return {"metadata": {"name": node, "generation": 1},
            "spec": {"nodeName": node, "fraction": fraction, "workloads": ["t/a"],
                     "expiresAt": (T0 + timedelta(seconds=120)).strftime("%Y-%m-%dT%H:%M:%SZ"),
                     "reason": "dr"}}


class FakeApi:
    """Status writes that take a while; counts how many are in flight at once."""

    def __init__(self, fail: set[str] | None = None) -> None:
        self.in_flight = self.peak = 0
        self.written: list[str] = []
        self.fail = fail or set()

    async def apply(self, res: Any, name: str, body: Any, **_: Any) -> Any:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            await asyncio.sleep(0.01)
            if name in self.fail:
                raise k.KubeError(f"boom {name}")
            self.written.append(name)
        finally:
            self.in_flight -= 1


def agent(api: FakeApi, nodes: int) -> na.Agent:
    cores = {f"n{i:03d}": NodeAgentCore(f"n{i:03d}", FakeNvml(gpus=4, node=f"n{i:03d}"))
             for i in range(nodes)}
    a = na.Agent(api, cores, fleet=True, clock=lambda: T0)  # type: ignore[arg-type]
    for name in cores:
        a.cache.apply_event({"type": "ADDED", "object": limit(name)})
    return a


def test_statuses_are_written_concurrently_and_bounded() -> None:
    api = FakeApi()
    a = agent(api, 50)
    asyncio.run(a.tick())
    assert sorted(api.written) == sorted(a.cores)
    assert 1 < api.peak <= na.WRITE_PARALLEL
    assert all(c.backend.devices()[0].limit_w < c.backend.devices()[0].default_w
               for c in a.cores.values())


def test_one_failed_write_does_not_stop_the_others_and_is_retried() -> None:
    api = FakeApi(fail={"n003"})
    a = agent(api, 10)
    asyncio.run(a.tick())
    assert "n003" not in api.written and len(api.written) == 9
    api.fail.clear()
    asyncio.run(a.tick())  # the failed one is reported again, the others are unchanged
    assert api.written.count("n003") == 1 and len(api.written) == 10


def test_nodes_are_listed_when_due_not_on_every_change() -> None:
    a = agent(FakeApi(), 2)
    assert a.fleet_due(100.0)  # never listed
    a._fleet_at = 100.0
    assert not a.fleet_due(100.0 + na.FLEET_REFRESH_SECONDS / 2)
    assert a.fleet_due(100.0 + na.FLEET_REFRESH_SECONDS)
    a.cache.apply_event({"type": "ADDED", "object": limit("new-node")})
    assert a.fleet_due(101.0)  # a limit for a node with no agent yet


def test_agent_times_it_cannot_keep_are_refused_before_it_starts(
        capsys: Any) -> None:
    """Nineteenth session probe: ``--grace inf`` or ``1e308`` passed (OverflowError at every
    step: no cap applied and none restored after its lease), NaN passed every comparison."""
    for flag, value in (("--grace", "inf"), ("--grace", "1e308"), ("--grace", "nan"),
                        ("--interval", "nan"), ("--min-interval", "inf"),
                        ("--interval", "1e308")):
        assert na.main(["--node", "n0", "--nvml", "fake", flag, value]) == 2, (flag, value)
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "error: --interval must be in" in err


def test_the_cli_bounds_the_agent_times() -> None:
    from typer.testing import CliRunner

    from m2g_cli.app import app

    for flag in ("--grace", "--interval", "--min-interval"):
        got = CliRunner().invoke(app, ["node-agent", "--node", "n0", "--nvml", "fake",
                                       "--kubeconfig", "/nonexistent", flag, "1e308"])
        assert got.exit_code == 2 and isinstance(got.exception, SystemExit), flag
