"""m2g — the Model-to-Grid library: factory model, CEL policy engine, planner and k8s adapters.

Layers (enforced by import-linter, see pyproject.toml):

* ``m2g.model``   — immutable snapshot types: the factory, its signals, and the CEL inputs.
* ``m2g.policy``  — the policy contract (v1alpha1): parsing, type-checking, evaluation, tests.
* ``m2g.planner`` — pure functions from a snapshot and a policy set to a plan of changes.
* ``m2g.k8s``     — adapters: the only place that talks to a cluster.
"""

__version__ = "0.1.0"
