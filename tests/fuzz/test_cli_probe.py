"""Every case of the hostile-input probe (tests/fuzz/cli_probe.py) as a regression test, run
in-process through typer's CliRunner: no traceback, the documented exit code, one ``error:``
line, and no Admit for an input that must not be decided (docs/reliability.md, "The CLI
probe"). ``python -m tests.fuzz.cli_probe`` runs the same cases as subprocesses with time and
memory limits."""

from __future__ import annotations

import asyncio
import json
import math
import stat
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from m2g.signals import PrometheusClient, SignalConfig
from m2g.signals.config import SignalName
from m2g.signals.reader import read_signals
from m2g.signals.readings import Expected
from m2g_cli.app import app
from m2g_controllers.run import main
from tests.fuzz.cli_probe import Case, all_cases, materialise, verdict

CASES = all_cases()
#: Kubeconfigs whose exec plugin never exits: in-process with a 1 s plugin bound
#: ($M2G_EXEC_TIMEOUT; the subprocess runner keeps the default 20 s under its time limit).
SLOW_PLUGIN = {f"kubeconfig:{cmd}-exec-{name}" for cmd in ("queues", "submit")
               for name in ("sleeps", "sleeps-in-child")}


def _restore(root: Path) -> None:
    """Let pytest remove the case's folder (unreadable files and folders included)."""
    for path in root.rglob("*"):
        if not path.is_symlink():
            path.chmod(stat.S_IRWXU)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_probe_case(case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                    capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "case"
    argv, env = materialise(case, root)
    monkeypatch.chdir(root)
    base = {"HOME": str(root), "KUBECONFIG": str(root / "no-kubeconfig"), "NO_COLOR": "1"}
    if case.id in SLOW_PLUGIN:
        base["M2G_EXEC_TIMEOUT"] = "1"
    for key in ("M2G_TEMPLATES", "M2G_PROMETHEUS_URL", "M2G_CONFIG", "KUBERNETES_SERVICE_HOST",
                "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(key, raising=False)
    try:
        if argv[0] == "run":  # `m2g run` execs the controller process: call it here
            code, out, err, exc = _run_controller(argv[1:], {**base, **env}, monkeypatch, capsys)
        else:
            res = CliRunner().invoke(app, argv, input=case.stdin, env={**base, **env})
            code, out, err, exc = res.exit_code, res.stdout, res.stderr, res.exception
    finally:
        _restore(root)
    leaked = exc is not None and not isinstance(exc, SystemExit)
    kind = "traceback" if leaked else verdict(case, code, out, err)
    assert kind is None, (f"{case.id}: {kind} (exit {code}): {exc!r}\n"
                          f"stdout: {out[-500:]}\nstderr: {err[-500:]}")


def _run_controller(argv: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
                    capsys: pytest.CaptureFixture[str]
                    ) -> tuple[int, str, str, BaseException | None]:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    capsys.readouterr()
    exc: BaseException | None = None
    try:
        code = main(argv)
    except SystemExit as stop:  # argparse
        code = stop.code if isinstance(stop.code, int) else 2
    except Exception as raised:
        code, exc = 1, raised
    captured = capsys.readouterr()
    return code, captured.out, captured.err, exc


def test_the_probe_covers_every_entry_point() -> None:
    areas = {c.area for c in CASES}
    assert areas >= {"policy-lint", "policy-test", "policy-eval-dir", "policy-eval-input",
                     "policy-eval-stdin", "policy-examples", "templates", "submit",
                     "kubeconfig", "env", "run-config", "run-options"}
    assert len(CASES) > 900 and len({c.id for c in CASES}) == len(CASES)


# ------------------------------------------------------------- Prometheus answers of odd shapes

NOW = 1_800_000_000.0


def _vector(value: object, ts: object = NOW, metric: dict[str, str] | None = None) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": metric or {"rack": "r0", "Hostname": "n0", "gpu": "0"},
         "value": [ts, value]}]}}).encode()


PROM_ANSWERS: dict[str, tuple[int, bytes, dict[str, str]]] = {
    "html": (200, b"<html>oops</html>", {}),
    "bigint-value": (200, _vector("1").replace(b'"1"', b"1" + b"0" * 5000), {}),
    "bigint-timestamp": (200, _vector("1").replace(str(NOW).encode(), b"1" + b"0" * 5000), {}),
    "deep": (200, b"[" * 100_000 + b"]" * 100_000, {}),
    "nan-timestamp": (200, _vector("1", ts="NaN"), {}),
    "string-timestamp": (200, _vector("1", ts="soon"), {}),
    "plus-inf": (200, _vector("+Inf"), {}),
    "1e999": (200, _vector("1").replace(b'"1"', b"1e999"), {}),
    "duplicate-status": (200, b'{"status":"success","status":"error","data":{"resultType":'
                              b'"vector","result":[]}}', {}),
    "error-with-newline": (200, b'{"status":"error","errorType":"bad_data","error":"x\\ny"}', {}),
    "matrix": (200, json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {}, "values": [[NOW, "1"]]}]}}).encode(), {}),
    "scalar": (200, json.dumps({"status": "success", "data": {"resultType": "scalar",
                                                              "result": [NOW, "1"]}}).encode(), {}),
    "retry-after-huge": (429, b"{}", {"retry-after": "1e308"}),
    "retry-after-nan": (429, b"{}", {"retry-after": "nan"}),
    "retry-after-inf": (503, b"{}", {"retry-after": "inf"}),
    "retry-after-negative": (503, b"{}", {"retry-after": "-5"}),
    "utf16": (200, _vector("1").decode().encode("utf-16"), {}),
    "bom": (200, b"\xef\xbb\xbf" + _vector("1"), {}),
    "empty": (200, b"", {}),
    "null": (200, b"null", {}),
    "label-10mb": (200, _vector("1", metric={"rack": "r" * 10_000_000}), {}),
}


@pytest.mark.parametrize("name", sorted(PROM_ANSWERS))
def test_odd_prometheus_answers(name: str) -> None:
    """Every signal reads (fresh in bounds, or not fresh) and every error is one line; no
    wait beyond the client's cap (2 s) whatever Retry-After says."""
    code, body, headers = PROM_ANSWERS[name]
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(code, content=body,
                              headers={"content-type": "application/json", **headers})

    async def go() -> None:
        http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
        client = PrometheusClient("http://prom", http, clock=lambda: NOW, sleep=sleep)
        readings = await read_signals(client, SignalConfig(), Expected(racks=("r0",)))
        await http.aclose()
        assert set(readings.status) == set(SignalName)
        for status in readings.status.values():
            assert "\n" not in (status.error or "")
        for rack in readings.racks.values():
            for reading in (rack.power_kw, rack.inlet_c, rack.coolant_c):
                assert reading.value is None or math.isfinite(reading.value)

    asyncio.run(go())
    assert all(0 <= s <= 2.0 for s in slept)
