"""Command line: ``python kind-e2e/localcp <command>`` (or ``python -m localcp``).

Commands: build, up [--factory SPEC|none], down, status, env, factory apply|manifests SPEC,
kwok-stages, jobset-manifests. User errors print one line (plus a log tail) and exit 1, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: python kind-e2e/localcp
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    __package__ = "localcp"

import yaml

from localcp import UserError
from localcp.paths import FACTORIES, run_paths


def _factory_arg(value: str) -> Path | None:
    if value.lower() in ("", "none"):
        return None
    path = Path(value)
    if not path.exists() and (FACTORIES / f"{value}.yaml").exists():
        path = FACTORIES / f"{value}.yaml"
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="localcp", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build", help="build missing binaries into the cache")
    p_up = sub.add_parser("up", help="start the control plane (build first if needed)")
    p_up.add_argument("--factory", default="small",
                      help="factory spec to create: a name in kind-e2e/factories, a path, or none")
    p_up.add_argument("--extra-crds", default=None,
                      help="also install CRDs of jobset,lws,trainer,kubeflow (or all); "
                           "default $M2G_EXTRA_CRDS")
    sub.add_parser("down", help="stop everything that `up` started")
    sub.add_parser("status", help="show components, memory, nodes")
    sub.add_parser("env", help="print `export KUBECONFIG=...`")
    p_f = sub.add_parser("factory", help="apply a factory spec, or print its manifests")
    p_f.add_argument("action", choices=["apply", "manifests", "check"])
    p_f.add_argument("spec")
    sub.add_parser("kwok-stages", help="print KWOK's Stage documents (for kind)")
    sub.add_parser("jobset-manifests",
                   help="print JobSet's install manifests for a cluster with an image "
                        "registry (for kind), from the module go.sum pins")
    args = parser.parse_args(argv)

    from localcp import controlplane, factory, jobset_install, kwok  # lazy: `--help` fast

    try:
        if args.cmd == "build":
            controlplane.ensure_binaries(print)
        elif args.cmd == "up":
            controlplane.up(_factory_arg(args.factory), extra_crds=args.extra_crds)
        elif args.cmd == "down":
            controlplane.down()
        elif args.cmd == "status":
            return 0 if controlplane.status() else 3
        elif args.cmd == "env":
            print(f"export KUBECONFIG={run_paths().kubeconfig}")
        elif args.cmd == "factory":
            path = _factory_arg(args.spec)
            if path is None:
                raise UserError("no factory spec given")
            if args.action == "apply":
                controlplane.apply_factory(path)
            else:
                spec = factory.load_spec(path)
                if args.action == "manifests":
                    print(yaml.safe_dump_all(factory.manifests(spec), sort_keys=False), end="")
                else:
                    print(f"{path}: {spec.racks} racks, {spec.node_count} nodes, "
                          f"{spec.gpu_count} GPUs")
        elif args.cmd == "kwok-stages":
            print(yaml.safe_dump_all(kwok.stages(), sort_keys=False), end="")
        elif args.cmd == "jobset-manifests":
            print(jobset_install.manifests(), end="")
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
