"""Cluster errors of ``m2g submit`` become one line each (no cluster needed here)."""

from __future__ import annotations

import pytest

from m2g.k8s.client import KubeError, error_from_response
from m2g_cli.templates_apply import _explain


def api_error(status: int, message: str, details: dict[str, str] | None = None) -> KubeError:
    """What m2g.k8s's client raises for the server's Status object."""
    return error_from_response("POST", "/apis/jobset.x-k8s.io/v1alpha2/namespaces/ml/jobsets",
                               status, {"kind": "Status", "reason": "Reason",
                                        "message": message, "details": details or {}})


@pytest.mark.parametrize(("status", "message", "details", "expected"), [
    (404, 'namespaces "ml" not found', {"kind": "namespaces"}, "namespace 'ml' not found"),
    (404, "the server could not find the requested resource", None,
     "the API server does not serve JobSet (jobset.x-k8s.io/v1alpha2); is its CRD installed?"),
    (403, 'jobsets.jobset.x-k8s.io is forbidden: User "u" cannot create\n resource', None,
     'forbidden: jobsets.jobset.x-k8s.io is forbidden: User "u" cannot create resource'),
    (409, 'jobsets "x" already exists', None, 'already exists: jobsets "x" already exists'),
    (422, 'JobSet "x" is invalid: spec: Required value', None,
     'rejected (422): JobSet "x" is invalid: spec: Required value'),
])
def test_api_errors_are_one_line(status: int, message: str, details: dict[str, str] | None,
                                 expected: str) -> None:
    text = _explain(api_error(status, message, details), "JobSet", "jobset.x-k8s.io/v1alpha2",
                    "ml")
    assert text == expected


def test_a_body_that_is_not_json_falls_back_to_the_reason() -> None:
    exc = error_from_response("POST", "/apis/batch/v1/namespaces/ml/jobs", 500,
                              "<html>oops</html>")
    assert _explain(exc, "Job", "batch/v1") == "rejected (500): Internal Server Error"
