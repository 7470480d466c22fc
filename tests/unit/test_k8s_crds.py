"""deploy/crds against the code that reads them: no drift between the Policy CRD and the policy
spec model, and the structural basics every CRD needs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from m2g.policy.spec import PolicySpecBody, RuleSpec, Stage

CRDS = Path(__file__).resolve().parents[2] / "deploy" / "crds"


def crd(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((CRDS / f"m2g.io_{name}.yaml").read_text())
    return data


def schema(name: str) -> dict[str, Any]:
    version = crd(name)["spec"]["versions"][0]
    props: dict[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]
    return props


def aliases(model: Any) -> set[str]:
    return {f.alias or n for n, f in model.model_fields.items()}


def test_policy_crd_spec_matches_the_policy_model() -> None:
    spec = schema("policies")["spec"]
    assert set(spec["properties"]) == aliases(PolicySpecBody)
    assert spec["properties"]["stage"]["enum"] == [s.value for s in Stage]
    rules = spec["properties"]["rules"]["items"]
    assert rules["x-kubernetes-preserve-unknown-fields"] is True
    assert set(rules["properties"]) <= aliases(RuleSpec)


@pytest.mark.parametrize("name", ["gridevents", "maintenancewindows", "powerdomains",
                                  "policies", "reservations", "capacityplans"])
def test_crd_basics(name: str) -> None:
    c = crd(name)
    assert c["metadata"]["name"] == f"{name}.m2g.io"
    assert c["spec"]["scope"] == "Cluster" and c["spec"]["group"] == "m2g.io"
    (version,) = c["spec"]["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}
    assert version["additionalPrinterColumns"]
    kustomization = yaml.safe_load((CRDS / "kustomization.yaml").read_text())
    assert f"m2g.io_{name}.yaml" in kustomization["resources"]
