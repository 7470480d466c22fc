"""m2g on a factory labelled only as a real GB300 cluster labels its nodes.

The KWOK factory's nodes carry GPU Feature Discovery's labels (``nvidia.com/gpu.clique``,
``nvidia.com/gpu.product``, ...) and NVIDIA Topograph's (``network.topology.nvidia.com/block``
and ``/accelerator``), and no topology label of m2g's own. The Kueue Topology and flavor are
what ``m2g topology generate`` writes for the default mapping. With ``m2g run`` answering the
ClusterQueue's check (the shipped policies, the Deployment's site configuration), a job from
every template that renders to a plain batch/v1 Job, submitted with ``m2g submit``, is admitted
on the first try and placed where it should be: the gangs that ask for a clique inside one
NVLink clique, the pre-training job inside one block with each 16-pod slice inside one clique.

Every template that renders a JobSet runs for real too: the JobSet controller of the local
control plane makes its child Jobs once Kueue admits it (the ``jobset.x-k8s.io/jobset``
integration), and every pod of those Jobs runs (KWOK) on the very hosts of Kueue's topology
assignment, each child Job (one slice) inside one NVLink clique when the template asks for it.

The queue and ``m2g run`` are conftest's ``labels_queue``; the checks are
``template_runs.run_template``, shared with the chart's and the kind path's tests.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_helpers import REPO, Cluster
from template_runs import (
    JOB_TEMPLATES,
    JOBSET_TEMPLATES,
    nodes_carry_only_real_cluster_labels,
    run_template,
)

pytestmark = pytest.mark.e2e

#: the templates of this checkout, no KAI scheduler here, and no priority class (the queue of
#: ``labels_queue`` is not kueue-config's, which defines them)
ARGS = ("--templates-dir", str(REPO / "templates"), "--set", "scheduler=default",
        "--set", "priority=")


def test_factory_nodes_carry_only_real_cluster_labels(cluster: Cluster) -> None:
    nodes_carry_only_real_cluster_labels(cluster)


@pytest.mark.parametrize("name", JOB_TEMPLATES)
def test_every_job_template_is_admitted_on_the_first_try_and_placed(
        kubeconfig: Path, cluster: Cluster, labels_queue: str, name: str) -> None:
    run_template(kubeconfig, cluster, labels_queue, name, "Job", *ARGS)


def test_some_templates_render_a_jobset() -> None:
    """The parametrisation below is not empty by accident (a moved folder, a dropped API)."""
    assert JOBSET_TEMPLATES


@pytest.mark.parametrize("name", JOBSET_TEMPLATES)
def test_every_jobset_template_runs_its_child_jobs_where_kueue_placed_it(
        kubeconfig: Path, cluster: Cluster, labels_queue: str, name: str) -> None:
    run_template(kubeconfig, cluster, labels_queue, name, "JobSet", *ARGS)
