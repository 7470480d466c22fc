"""The site configuration (m2g run --config): validation with FILE:LINE, defaults, overrides,
Prometheus auth from files, and credentials kept out of messages."""

from __future__ import annotations

import os
import re
from pathlib import Path

import httpx
import pytest

from m2g.config import SiteConfig, SiteConfigError, load_site_config, parse_site_config
from m2g.config.site import PlannerSettings
from m2g.planner.config import PlannerConfig
from m2g.signals.config import Aggregate, PrometheusSettings, SignalName, redact_url
from m2g.signals.http import PrometheusSetupError, make_http_client
from m2g.signals.prometheus import PrometheusClient, RetryableError
from m2g_controllers import run

REPO = Path(__file__).resolve().parents[2]


def doc_example() -> str:
    text = (REPO / "docs" / "configuration.md").read_text()
    section = text.split("## Full example", 1)[1]
    return re.search(r"```yaml\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]


def test_the_documented_full_example_is_valid_and_means_what_it_says() -> None:
    site = parse_site_config(doc_example(), "configuration.md")
    assert site.prometheus is not None
    assert site.prometheus.headers == {"X-Scope-OrgID": "factory-a"}
    rack = site.signal_config().spec(SignalName.RACK_POWER_KW)
    assert (rack.query, rack.key_label, rack.aggregate, rack.scale) == (
        "pdu_input_power_watts", "rack", Aggregate.SUM, 0.001)
    # a partial entry keeps the default of every field it does not name
    assert site.signal_config().spec(SignalName.GPU_TEMP_C).key_label == "Hostname"
    planner = site.planner_config()
    assert planner.ramp_kw_per_second == 50 and planner.thermal_clear_margin_c == 1.0
    assert site.lease_namespace({"POD_NAMESPACE": "elsewhere"}) == "m2g-system"


def test_every_numeric_planner_knob_is_configurable() -> None:
    knobs = {f for f in PlannerConfig.__dataclass_fields__} - {"check_name", "kai_topology_levels"}
    assert set(PlannerSettings.model_fields) == knobs


def test_unknown_keys_and_bad_values_are_named_with_their_line(tmp_path: Path) -> None:
    f = tmp_path / "site.yaml"
    f.write_text("prometheus:\n  url: http://prom:9090\nplanner:\n  rampKw: 3\n"
                 "  maxStepKw: -1\nsignals:\n  rack_power_kw:\n    maxAge: 5\n"
                 "  rack_pwr: {query: x}\nprometeus: {}\n")
    with pytest.raises(SiteConfigError) as info:
        load_site_config(f)
    assert info.value.problems == [
        f"{f}:4: planner.rampKw: unknown key (did you mean rampKwPerSecond?)",
        f"{f}:5: planner.maxStepKw: Input should be greater than 0",
        f"{f}:8: signals.rack_power_kw.maxAge: unknown key (did you mean maxAgeSeconds?)",
        f"{f}:9: signals.rack_pwr: Input should be 'gpu_power_w', 'gpu_temp_c', 'gpu_xid', "
        "'rack_power_kw', 'rack_inlet_c', 'coolant_temp_c' or 'domain_power_kw'",
        f"{f}:10: prometeus: unknown key (did you mean prometheus?)",
    ]
    assert str(info.value).endswith("(and 4 more)") and "\n" not in str(info.value)


@pytest.mark.parametrize(("text", "match"), [
    ("- a\n", "1: a mapping expected"),
    ("a: [\n", "invalid YAML"),
    ("kind: Policy\n", "kind: Input should be 'SiteConfig'"),
    ("a: 1\n---\nb: 2\n", "3: one document expected"),
    ("prometheus:\n  url: http://u:secret@prom:9090\n", "2: prometheus.url: .*\\*\\*\\*@prom"),
    ("prometheus:\n  headers: {Authorization: Bearer x}\n", "bearerTokenFile"),
    ("planner:\n  restoreMargin: 1\n", "2: planner.restoreMargin"),
    # nineteenth session probe: a label key no node can carry (a trailing space, a bidi
    # override) silently made every rack its clique; a KAI Topology name with a newline
    ("topology:\n  labels: {rack: 'rack '}\n", "2: topology.labels.rack"),
    ("topology:\n  labels: {block: \"\\u202eblock\"}\n", "2: topology.labels.block"),
    ("topology:\n  labels: {clique: 'a/b/c'}\n", "2: topology.labels.clique"),
    ("planner:\n  kaiTopologyName: \"t\\nerror: fake\"\n", "2: planner.kaiTopologyName"),
    # the same probe's values accepted because they stop nothing: they distort a lever (a
    # taint that never clears, a hysteresis that no derate passes, no pacing), a typo each
    ("planner:\n  thermalClearMarginC: 1e308\n", "2: planner.thermalClearMarginC: .* 50"),
    ("planner:\n  quotaHysteresisGpus: 1180591620717411303424\n",
     "2: planner.quotaHysteresisGpus: .* 1000000"),
    ("planner:\n  rampKwPerSecond: 1e308\n", "2: planner.rampKwPerSecond: .* 10000000"),
    ("planner:\n  maxStepKw: 1e12\n", "2: planner.maxStepKw: .* 10000000"),
    ("planner:\n  capLevels: [0.875, 0.875, 0.5]\n", "2: planner.capLevels: .* each once"),
])
def test_bad_files(text: str, match: str) -> None:
    with pytest.raises(SiteConfigError) as info:
        parse_site_config(text, "f.yaml")
    assert re.search(match, info.value.problems[0]), info.value.problems
    assert "secret" not in str(info.value)


def test_an_empty_file_is_every_default(tmp_path: Path) -> None:
    f = tmp_path / "empty.yaml"
    f.write_text("# nothing yet\n")
    site = load_site_config(f)
    assert site == SiteConfig() and site.prometheus is None
    assert site.planner_config() == PlannerConfig()
    with pytest.raises(SiteConfigError, match="cannot read"):
        load_site_config(tmp_path / "absent.yaml")


def test_flags_override_the_file_and_the_lease_follows_the_pod(tmp_path: Path) -> None:
    f = tmp_path / "site.yaml"
    f.write_text("prometheus: {url: 'http://from-file:9090', timeoutSeconds: 2}\n"
                 "leaderElection: {leaseName: from-file}\n")
    s = run.resolve(run.parse(["--config", str(f)]), {"POD_NAMESPACE": "gpu-ops"})
    assert s.prometheus is not None and s.prometheus.url == "http://from-file:9090"
    assert (s.lease_namespace, s.lease_name) == ("gpu-ops", "from-file")
    s = run.resolve(run.parse(["--config", str(f), "--prometheus", "http://flag:9090",
                               "--lease-namespace", "ns", "--lease-name", "l"]), {})
    assert s.prometheus is not None and s.prometheus.url == "http://flag:9090"
    assert s.prometheus.timeout_seconds == 2  # the rest of the file still applies
    assert (s.lease_namespace, s.lease_name) == ("ns", "l")
    s = run.resolve(run.parse([]), {})
    assert s.prometheus is None and s.lease_namespace == "m2g-system"


def test_run_stops_on_a_bad_config_with_every_line(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "site.yaml"
    f.write_text("planner:\n  rampKw: 3\n  dwell: 2\n")
    assert run.main(["--config", str(f)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"error: m2g run: {f}:2: planner.rampKw: unknown key (did you mean "
                   "rampKwPerSecond?)", f"error: m2g run: {f}:3: planner.dwell: unknown key"]


def test_a_missing_token_file_stops_run_instead_of_going_anonymous(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "site.yaml"
    f.write_text(f"prometheus:\n  bearerTokenFile: {tmp_path}/no-token\n")
    assert run.main(["--config", str(f), "--kubeconfig", str(tmp_path / "kc")]) == 1
    assert f"bearer token file {tmp_path}/no-token: No such file" in capsys.readouterr().err
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(PrometheusSetupError, match="is empty"):
        make_http_client(PrometheusSettings(bearer_token_file=tmp_path / "empty"))
    with pytest.raises(PrometheusSetupError, match="CA file"):
        make_http_client(PrometheusSettings(ca_file=tmp_path / "no-ca.pem"))


async def test_token_headers_sent_and_a_rotated_token_picked_up(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    seen: list[httpx.Request] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        return httpx.Response(200, json={"status": "success",
                                         "data": {"resultType": "vector", "result": []}})

    settings = PrometheusSettings(url="https://thanos:9091", bearer_token_file=token,
                                  headers={"X-Scope-OrgID": "factory-a"})
    async with make_http_client(settings, httpx.MockTransport(handler)) as http:
        client = PrometheusClient(settings.url, http)
        await client.query("up", 1.0)
        token.write_text("second")
        os.utime(token, (1, 1))  # a new mtime, however fast the test runs
        await client.query("up", 1.0)
        token.unlink()
        with pytest.raises(RetryableError, match=r"bearer token file .*token"):
            await client.query("up", 1.0)
    assert [r.headers["Authorization"] for r in seen] == ["Bearer first", "Bearer second"]
    assert all(r.headers["X-Scope-OrgID"] == "factory-a" for r in seen)
    assert seen[0].url.host == "thanos"


async def test_errors_never_print_credentials_of_a_url() -> None:
    assert redact_url("https://user:pw@prom:9090/x?token=abc&a=1") == \
        "https://***@prom:9090/x?token=***&a=***"

    def refuse(req: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=req)

    async with httpx.AsyncClient(transport=httpx.MockTransport(refuse)) as http:
        client = PrometheusClient("http://admin:hunter2@prom:9090", http)
        with pytest.raises(RetryableError) as info:
            await client.query("up", 1.0)
    assert "hunter2" not in str(info.value) and "***@prom:9090" in str(info.value)


def test_label_keys_the_api_server_takes_are_accepted() -> None:
    site = parse_site_config("topology:\n  labels: {rack: m2g.io/rack, block: '', clique: "
                             "nvidia.com/gpu.clique, powerDomain: Example.COM_x}\n", "f.yaml")
    assert (site.topology.labels.rack, site.topology.labels.block) == ("m2g.io/rack", "")
