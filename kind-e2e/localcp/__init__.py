"""localcp: a real local Kubernetes control plane (etcd, kube-apiserver, controller-manager,
scheduler, Kueue, KWOK) built from pinned Go modules and run as plain processes.

Entry point: ``python kind-e2e/localcp {build,up,down,status,env,factory}`` or
``PYTHONPATH=kind-e2e python -m localcp ...``. See docs/control-plane.md.
"""

__all__ = ["UserError"]


class UserError(Exception):
    """An error whose message is shown to the user as one line, without a traceback."""
