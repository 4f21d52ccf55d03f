"""``slicefeed k8s``: KubeRay manifests that run a pipeline on GKE.

``slicefeed k8s PIPELINE.yaml`` prints, as one multi-document YAML stream:

1. a ``ConfigMap`` holding the pipeline spec (``pipeline.yaml``), mounted
   read-only at ``/etc/slicefeed/`` in every Ray pod;
2. a KubeRay ``RayJob`` (``ray.io/v1``) whose entrypoint is
   ``slicefeed run /etc/slicefeed/pipeline.yaml``: a head group, a CPU worker
   group for preprocessing and, with ``--topology``/``--accelerator``, a TPU
   worker group (GKE TPU node selectors, ``google.com/tpu`` = chips per host,
   ``numOfHosts`` = hosts of the slice). KubeRay runs the entrypoint on the
   head through the Ray job API and, with ``shutdownAfterJobFinishes``, tears
   the cluster down afterwards.

With ``--schedule "0 3 * * *"`` it prints a ``CronJob`` (``batch/v1``)
instead of the bare RayJob: each run a small ``kubectl`` pod creates a fresh
RayJob (``metadata.generateName``) from a second ConfigMap and waits for it,
under a ServiceAccount whose Role may only create/get RayJobs. A run whose
sink is committed from the same spec and input exits 0 without recomputing;
give a scheduled job a dated sink (``--set 'sink.uri=gs://b/out/{date}'``)
so each run commits its own dataset.

Shipping the spec: by default the spec text goes into the ConfigMap. With
``--spec-in-image PATH`` nothing is shipped and the entrypoint reads PATH from
the image. The image must contain slicefeed (``--image``; build it ``FROM
rayproject/ray:<ray version>-py311`` plus ``pip install slicefeed``, and
``jax[tpu]`` for TPU hosts).

Credentials are never put in a manifest. Keys named ``credentials`` or
``token`` are removed from the shipped spec (on GKE use Workload Identity via
``--service-account``, or ``--credentials-secret NAME``: a Kubernetes Secret
with a ``key.json`` that is mounted and named by
``GOOGLE_APPLICATION_CREDENTIALS``; its contents are never read here).
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import shlex
import sys
from typing import Any

import yaml

from slicefeed.connectors import SpecError

__all__ = ["add_parser", "build_manifests", "render", "run_k8s"]

SPEC_DIR = "/etc/slicefeed"
SPEC_FILE = "pipeline.yaml"
SECRET_DIR = "/var/secrets/google"
_SECRET_KEYS = {"credentials", "token"}
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# KubeRay derives pod and service names from the RayJob name; keep room for
# its suffixes (RayCluster name + "-head-svc", ...).
_MAX_NAME = 40


#: The submitter pod of a CronJob: any image with ``sh`` and ``kubectl``, pinned.
KUBECTL_IMAGE = "alpine/k8s:1.31.4"


def _default_image() -> str:
    """``slicefeed:<installed version>``: a name for the image the README builds.

    It is not published to any registry, so ``slicefeed k8s`` warns when it
    is used.
    """
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"slicefeed:{version('slicefeed')}"
    except PackageNotFoundError:  # running from a source tree
        return "slicefeed:dev"


def _check_pinned(image: str, what: str) -> None:
    """Refuses an image without a version tag or digest, or tagged ``latest``."""
    last = image.rsplit("/", 1)[-1]
    if "@" in last:  # name@sha256:...
        return
    tag = last.split(":", 1)[1] if ":" in last else ""
    if not tag or tag == "latest":
        raise SpecError(
            f"{what} {image!r} is not pinned: give a version tag or digest "
            f"(e.g. {image.split('@')[0].rsplit(':', 1)[0] if tag else image}:1.2.3), so every "
            "pod of a run, and every scheduled run, uses the same code."
        )


def _is_local(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file://")


def check_spec(
    spec_path: str,
    overrides: list[str] | None = None,
    *,
    source_check: bool = True,
    warn: Any = None,
) -> dict[str, Any]:
    """What ``slicefeed validate`` checks, for a spec about to be shipped.

    The spec's keys, values and transforms are always checked (no I/O);
    with ``source_check`` the transforms are also checked against the
    source's schema when the source can be read from here (a source this
    machine cannot read is a warning, not an error: the cluster may be able
    to). A spec ``slicefeed run`` would refuse raises :class:`SpecError`.

    Returns:
        The validated spec (overrides applied).
    """
    from slicefeed.pipelines._pipeline import Pipeline
    from slicefeed.pipelines._spec import load_spec

    warn = warn or _warn
    spec = load_spec(spec_path, overrides)
    # URI templates ({date}, {env:NAME}) are filled in the pod, at run time.
    p = Pipeline(spec, source_name=spec_path, expand_templates=False)
    if p.spec.sink is None:
        raise SpecError(f"{spec_path}: missing required key 'sink' (format and uri); "
                        "`slicefeed run` needs one.")
    if source_check:
        try:
            p.check()
        except SpecError:
            raise
        except Exception as e:  # noqa: BLE001 - unreachable here; the cluster may reach it
            text = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            warn(f"could not read the source from here to check the transforms' columns "
                 f"({type(e).__name__}: {text}); the spec's keys and transforms are valid.")
    return spec


def _warn(message: str) -> None:
    print(f"slicefeed k8s: warning: {message}", file=sys.stderr)


def _ray_version() -> str:
    import ray

    return ray.__version__


def _job_name(spec: dict[str, Any], path: str) -> str:
    raw = str(spec.get("name") or os.path.splitext(os.path.basename(path))[0])
    name = re.sub(r"[^a-z0-9-]+", "-", raw.lower()).strip("-")[:_MAX_NAME].strip("-")
    if not name or not _DNS_LABEL.match(name):
        raise SpecError(
            f"{path}: cannot derive a Kubernetes name from {raw!r}; pass --name with "
            "lowercase letters, digits and '-'."
        )
    return name


def _strip_secrets(obj: Any) -> tuple[Any, list[str]]:
    """A copy of ``obj`` without credential keys, and the dotted keys removed."""
    removed: list[str] = []

    def walk(node: Any, where: str) -> Any:
        if isinstance(node, dict):
            out = {}
            for k, v in node.items():
                key = f"{where}.{k}" if where else str(k)
                if str(k).lower() in _SECRET_KEYS:
                    removed.append(key)
                    continue
                out[k] = walk(v, key)
            return out
        if isinstance(node, list):
            return [walk(v, f"{where}[{i}]") for i, v in enumerate(node)]
        return node

    return walk(obj, ""), removed


def _quantity(value: str | int, what: str) -> str:
    text = str(value).strip()
    if not re.match(r"^(\d+(\.\d*)?|\.\d+)([KMGTPE]i|[numkMGTPE])?$", text):
        raise SpecError(f"{what}: {value!r} is not a Kubernetes quantity (e.g. 4, 500m, 16Gi).")
    return text


def _container(
    name: str,
    image: str,
    *,
    cpu: str,
    memory: str,
    extra_resources: dict[str, str] | None = None,
    mounts: list[dict[str, Any]],
    env: list[dict[str, Any]],
    ports: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    resources = {"cpu": cpu, "memory": memory, **(extra_resources or {})}
    c: dict[str, Any] = {
        "name": name,
        "image": image,
        "resources": {"limits": dict(resources), "requests": dict(resources)},
        "volumeMounts": mounts,
    }
    if env:
        c["env"] = env
    if ports:
        c["ports"] = ports
    return c


def build_manifests(
    spec_path: str,
    *,
    topology: str | None = None,
    accelerator: str | None = None,
    tpu_slices: int = 1,
    schedule: str | None = None,
    image: str | None = None,
    namespace: str = "default",
    name: str | None = None,
    cpu_workers: int = 2,
    worker_cpu: str = "4",
    worker_memory: str = "16Gi",
    head_cpu: str = "2",
    head_memory: str = "8Gi",
    tpu_host_cpu: str = "8",
    tpu_host_memory: str = "32Gi",
    service_account: str | None = None,
    credentials_secret: str | None = None,
    spec_in_image: str | None = None,
    overwrite: bool = False,
    ttl_seconds: int = 600,
    deadline_seconds: int | None = None,
    overrides: list[str] | None = None,
    kubectl_image: str = KUBECTL_IMAGE,
    warn: Any = None,
) -> list[dict[str, Any]]:
    """Builds the Kubernetes objects that run ``spec_path`` on a KubeRay cluster.

    Args:
        spec_path: The pipeline YAML (read locally; shipped in a ConfigMap
            unless ``spec_in_image`` is given).
        topology: TPU slice topology (``"4x4"``); needs ``accelerator``. Adds a
            TPU worker group with one pod per host of the slice.
        accelerator: TPU generation (``"v6e"``, ``"TPU-V6E"``, ...).
        tpu_slices: Number of slices (TPU group replicas).
        schedule: A cron schedule; returns a CronJob that submits the RayJob.
        image: Container image with slicefeed installed.
        namespace: Namespace of every object.
        name: Job name (DNS label); default: the spec's ``name`` or file stem.
        cpu_workers: Pods in the CPU worker group (0: run on the head).
        worker_cpu, worker_memory: Requests = limits per CPU worker pod.
        head_cpu, head_memory: Requests = limits of the head pod.
        tpu_host_cpu, tpu_host_memory: Requests = limits per TPU host pod.
        service_account: Kubernetes ServiceAccount of the Ray pods (bind it
            to a Google service account with Workload Identity).
        credentials_secret: Name of a Secret with ``key.json``; mounted at
            ``/var/secrets/google`` and named by GOOGLE_APPLICATION_CREDENTIALS.
        spec_in_image: Path of the spec inside the image; no ConfigMap then.
        overwrite: Pass ``--overwrite`` to ``slicefeed run``.
        ttl_seconds: RayJob ``ttlSecondsAfterFinished``.
        deadline_seconds: RayJob ``activeDeadlineSeconds``.
        overrides: ``--set KEY.PATH=VALUE`` items: checked here and passed on
            to ``slicefeed run`` in the entrypoint.
        kubectl_image: Image of the CronJob's submitter pod (sh + kubectl).
        warn: Called with each warning (default: print to stderr).

    Returns:
        The objects as dicts, in apply order.

    The spec is checked like ``slicefeed validate`` does, without reading
    the source (see :func:`check_spec`); warnings name local paths the pods
    cannot see and the unpublished default image.

    Raises:
        SpecError: unreadable or invalid spec, unpinned image, invalid
            topology/accelerator, bad names or quantities.
    """
    warn = warn or _warn
    try:
        with open(spec_path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise SpecError(f"{spec_path}: cannot read the pipeline spec ({e.strerror}).") from e
    try:
        spec = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise SpecError(f"{spec_path}: not valid YAML: {e}") from e
    if not isinstance(spec, dict):
        raise SpecError(f"{spec_path}: a pipeline spec must be a YAML mapping.")
    overrides = list(overrides or [])
    checked = check_spec(spec_path, overrides, source_check=False, warn=warn)
    for where, node in [("source", s_) for s_ in (
            [checked["source"]] if "source" in checked else checked.get("sources", []))] + [
            ("sink", checked["sink"])]:
        if _is_local(str(node["uri"])):
            warn(f"{where}.uri {str(node['uri'])[:200]!r} is a local path: the pods on the "
                 "cluster do not see this machine's files; use gs://BUCKET/... (or a path "
                 "inside the image / a mounted volume, on purpose).")
    if (topology is None) != (accelerator is None):
        raise SpecError("--topology and --accelerator go together (e.g. --topology 4x4 "
                        "--accelerator v6e).")
    if cpu_workers < 0 or tpu_slices < 1:
        raise SpecError("--cpu-workers must be >= 0 and --tpu-slices >= 1.")
    job = name or _job_name(spec, spec_path)
    if not _DNS_LABEL.match(job) or len(job) > _MAX_NAME:
        raise SpecError(f"--name {job!r}: use at most {_MAX_NAME} lowercase letters, digits, '-'.")
    if not _DNS_LABEL.match(namespace):
        raise SpecError(f"--namespace {namespace!r} is not a valid Kubernetes namespace.")
    if image is None:
        image = _default_image()
        warn(f"no --image: using {image!r}, a name for the image the README builds, which is "
             "not published anywhere; build and push it, then pass "
             "--image REGISTRY/slicefeed:TAG.")
    _check_pinned(image, "--image")
    _check_pinned(kubectl_image, "--kubectl-image")
    labels = {"app.kubernetes.io/name": "slicefeed", "slicefeed.dev/job": job}

    docs: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    volumes: list[dict[str, Any]] = []
    env: list[dict[str, Any]] = []
    if spec_in_image is None:
        shipped, removed = _strip_secrets(spec)
        if removed:
            warn(f"removed {', '.join(removed)} from the shipped spec; "
                 "on GKE use Workload Identity (--service-account) or --credentials-secret.")
        body = text if not removed and _block_safe(text) else yaml.safe_dump(
            shipped, sort_keys=False)
        cm = f"{job}-spec"
        docs.append({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": cm, "namespace": namespace, "labels": labels},
            "data": {SPEC_FILE: body},
        })
        volumes.append({"name": "slicefeed-spec", "configMap": {"name": cm}})
        mounts.append({"name": "slicefeed-spec", "mountPath": SPEC_DIR, "readOnly": True})
        spec_in_pod = f"{SPEC_DIR}/{SPEC_FILE}"
    else:
        spec_in_pod = spec_in_image
    if credentials_secret:
        volumes.append({"name": "gcp-key", "secret": {"secretName": credentials_secret}})
        mounts.append({"name": "gcp-key", "mountPath": SECRET_DIR, "readOnly": True})
        env.append({"name": "GOOGLE_APPLICATION_CREDENTIALS", "value": f"{SECRET_DIR}/key.json"})

    def pod(container: dict[str, Any], **spec_extra: Any) -> dict[str, Any]:
        s: dict[str, Any] = {"containers": [container], **spec_extra}
        if volumes:
            s["volumes"] = copy.deepcopy(volumes)
        if service_account:
            s["serviceAccountName"] = service_account
        return {"metadata": {"labels": dict(labels)}, "spec": s}

    head_start = {"dashboard-host": "0.0.0.0"}
    if cpu_workers > 0 or topology is not None:
        # The head only coordinates; Ray Data's tasks go to the workers.
        head_start["num-cpus"] = "0"
    head = {
        "rayStartParams": head_start,
        "template": pod(_container(
            "ray-head", image,
            cpu=_quantity(head_cpu, "--head-cpu"), memory=_quantity(head_memory, "--head-memory"),
            mounts=copy.deepcopy(mounts), env=copy.deepcopy(env),
            ports=[{"containerPort": 6379, "name": "gcs"},
                   {"containerPort": 8265, "name": "dashboard"},
                   {"containerPort": 10001, "name": "client"}],
        )),
    }
    workers: list[dict[str, Any]] = []
    if cpu_workers > 0:
        workers.append({
            "groupName": "cpu",
            "replicas": cpu_workers,
            "minReplicas": cpu_workers,
            "maxReplicas": cpu_workers,
            "rayStartParams": {},
            "template": pod(_container(
                "ray-worker", image,
                cpu=_quantity(worker_cpu, "--worker-cpu"),
                memory=_quantity(worker_memory, "--worker-memory"),
                mounts=copy.deepcopy(mounts), env=copy.deepcopy(env),
            )),
        })
    if topology is not None:
        from slicefeed.pipelines._ops.topology import SliceSpec

        slice_ = SliceSpec(topology, accelerator)
        tpu_container = _container(
            "ray-worker", image,
            cpu=_quantity(tpu_host_cpu, "--tpu-host-cpu"),
            memory=_quantity(tpu_host_memory, "--tpu-host-memory"),
            extra_resources={"google.com/tpu": str(slice_.chips_per_host)},
            mounts=copy.deepcopy(mounts), env=copy.deepcopy(env),
        )
        workers.append({
            "groupName": f"tpu-{slice_.accelerator}-{slice_.topology}",
            "replicas": tpu_slices,
            "minReplicas": tpu_slices,
            "maxReplicas": tpu_slices,
            # One Ray worker per TPU VM host; KubeRay schedules the hosts of a
            # replica together (multi-host slice).
            "numOfHosts": slice_.num_hosts,
            "rayStartParams": {},
            "template": pod(
                tpu_container,
                nodeSelector=dict(slice_.node_selectors()),
                tolerations=[{"key": "google.com/tpu", "operator": "Exists",
                              "effect": "NoSchedule"}],
            ),
        })
    entrypoint = " ".join(
        [f"slicefeed run {shlex.quote(spec_in_pod)}"]
        + [f"--set {shlex.quote(item)}" for item in overrides]
        + (["--overwrite"] if overwrite else [])
    )
    rayjob_spec: dict[str, Any] = {
        "entrypoint": entrypoint,
        "shutdownAfterJobFinishes": True,
        "ttlSecondsAfterFinished": int(ttl_seconds),
        "rayClusterSpec": {
            "rayVersion": _ray_version(),
            "enableInTreeAutoscaling": False,
            "headGroupSpec": head,
            "workerGroupSpecs": workers,
        },
    }
    if deadline_seconds is not None:
        rayjob_spec["activeDeadlineSeconds"] = int(deadline_seconds)
    rayjob = {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": job, "namespace": namespace, "labels": labels},
        "spec": rayjob_spec,
    }
    if schedule is None:
        docs.append(rayjob)
        return docs
    return docs + _cron_docs(rayjob, job=job, namespace=namespace, labels=labels,
                             schedule=schedule, kubectl_image=kubectl_image)


def _cron_docs(rayjob: dict[str, Any], *, job: str, namespace: str, labels: dict[str, str],
               schedule: str, kubectl_image: str) -> list[dict[str, Any]]:
    fields = schedule.split()
    if len(fields) != 5 and not schedule.startswith("@"):
        raise SpecError(
            f"--schedule {schedule!r}: expected a cron expression with 5 fields "
            "(minute hour day month weekday), e.g. '0 3 * * *', or @daily/@hourly."
        )
    template = copy.deepcopy(rayjob)
    template["metadata"] = {"generateName": f"{job}-", "namespace": namespace,
                            "labels": labels}
    submitter = f"{job}-submitter"
    script = (
        "set -eu; "
        f"name=$(kubectl create -n {namespace} -f /etc/slicefeed-rayjob/rayjob.yaml -o name); "
        'echo "created $name"; '
        f"kubectl wait -n {namespace} --for=jsonpath='{{.status.jobStatus}}'=SUCCEEDED "
        '--timeout=24h "$name"'
    )
    return [
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": f"{job}-rayjob", "namespace": namespace, "labels": labels},
         "data": {"rayjob.yaml": yaml.safe_dump(template, sort_keys=False)}},
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": submitter, "namespace": namespace, "labels": labels}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": submitter, "namespace": namespace, "labels": labels},
         "rules": [{"apiGroups": ["ray.io"], "resources": ["rayjobs"],
                    "verbs": ["create", "get", "list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": submitter, "namespace": namespace, "labels": labels},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": submitter},
         "subjects": [{"kind": "ServiceAccount", "name": submitter, "namespace": namespace}]},
        {"apiVersion": "batch/v1", "kind": "CronJob",
         "metadata": {"name": job, "namespace": namespace, "labels": labels},
         "spec": {
             "schedule": schedule,
             # A run still going when the next is due is not doubled.
             "concurrencyPolicy": "Forbid",
             "successfulJobsHistoryLimit": 3,
             "failedJobsHistoryLimit": 3,
             "jobTemplate": {"spec": {
                 "backoffLimit": 0,
                 "template": {
                     "metadata": {"labels": dict(labels)},
                     "spec": {
                         "serviceAccountName": submitter,
                         "restartPolicy": "Never",
                         "containers": [{
                             "name": "submit",
                             "image": kubectl_image,
                             "command": ["/bin/sh", "-c", script],
                             "volumeMounts": [{"name": "rayjob",
                                               "mountPath": "/etc/slicefeed-rayjob",
                                               "readOnly": True}],
                         }],
                         "volumes": [{"name": "rayjob",
                                      "configMap": {"name": f"{job}-rayjob"}}],
                     },
                 },
             }},
         }},
    ]


def _block_safe(text: str) -> bool:
    """Whether PyYAML can emit ``text`` as a literal block (``|``), i.e. readable."""
    dumped = yaml.dump({"k": text}, Dumper=_Dumper, sort_keys=False)
    return dumped.startswith("k: |")


class _Dumper(yaml.SafeDumper):
    """Safe dumper that writes multi-line strings as literal blocks (``|``)."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render(docs: list[dict[str, Any]]) -> str:
    """The objects as one multi-document YAML stream (``kubectl apply -f -``).

    Multi-line strings (the shipped spec, the CronJob's RayJob template) are
    literal blocks, readable as YAML inside the ConfigMap.
    """
    return yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                         allow_unicode=True)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Adds ``slicefeed k8s`` to the CLI's subparsers; its handler is :func:`run_k8s`."""
    p = subparsers.add_parser(
        "k8s",
        help="print a KubeRay RayJob (or a CronJob that submits one) for GKE",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("pipeline", help="pipeline spec (YAML)")
    p.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override a spec value (repeatable); checked here and passed on to "
                        "`slicefeed run` in the pod")
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help="show full tracebacks")
    p.add_argument("--no-source-check", dest="source_check", action="store_false",
                   help="do not read the source to check the transforms' columns")
    p.add_argument("--kubectl-image", default=KUBECTL_IMAGE,
                   help=f"pinned image with sh and kubectl for the CronJob (default {KUBECTL_IMAGE})")
    from slicefeed.pipelines._ops.cli import output_flags

    output_flags(p, default=argparse.SUPPRESS)
    p.add_argument("--topology", help="TPU slice topology, e.g. 4x4 (needs --accelerator)")
    p.add_argument("--accelerator", help="TPU generation, e.g. v6e (needs --topology)")
    p.add_argument("--tpu-slices", type=int, default=1, help="number of TPU slices (default 1)")
    p.add_argument("--schedule", help="cron schedule, e.g. '0 3 * * *': print a CronJob")
    p.add_argument("--image", help="container image with slicefeed installed")
    p.add_argument("--namespace", default="default")
    p.add_argument("--name", help="job name (default: the spec's name or file stem)")
    p.add_argument("--cpu-workers", type=int, default=2, help="CPU worker pods (default 2)")
    p.add_argument("--worker-cpu", default="4")
    p.add_argument("--worker-memory", default="16Gi")
    p.add_argument("--head-cpu", default="2")
    p.add_argument("--head-memory", default="8Gi")
    p.add_argument("--tpu-host-cpu", default="8")
    p.add_argument("--tpu-host-memory", default="32Gi")
    p.add_argument("--service-account", help="ServiceAccount of the Ray pods (Workload Identity)")
    p.add_argument("--credentials-secret",
                   help="Secret holding key.json, mounted for GOOGLE_APPLICATION_CREDENTIALS")
    p.add_argument("--spec-in-image", metavar="PATH",
                   help="the spec's path inside the image (no ConfigMap is emitted)")
    p.add_argument("--overwrite", action="store_true",
                   help="pass --overwrite to slicefeed run")
    p.add_argument("--deadline", type=int, dest="deadline_seconds",
                   help="RayJob activeDeadlineSeconds")
    p.set_defaults(handler=run_k8s)
    return p


def run_k8s(args: argparse.Namespace) -> int:
    """Handler of ``slicefeed k8s``: checks the spec, prints the manifests to stdout; returns 0."""
    warn = (lambda _m: None) if getattr(args, "quiet", False) else _warn
    # The full `slicefeed validate` check, source schema included, before
    # anything is printed: an invalid spec exits 2 here, not on the cluster.
    check_spec(args.pipeline, args.set, source_check=args.source_check, warn=warn)
    docs = build_manifests(
        args.pipeline,
        overrides=args.set,
        kubectl_image=args.kubectl_image,
        warn=warn,
        topology=args.topology,
        accelerator=args.accelerator,
        tpu_slices=args.tpu_slices,
        schedule=args.schedule,
        image=args.image,
        namespace=args.namespace,
        name=args.name,
        cpu_workers=args.cpu_workers,
        worker_cpu=args.worker_cpu,
        worker_memory=args.worker_memory,
        head_cpu=args.head_cpu,
        head_memory=args.head_memory,
        tpu_host_cpu=args.tpu_host_cpu,
        tpu_host_memory=args.tpu_host_memory,
        service_account=args.service_account,
        credentials_secret=args.credentials_secret,
        spec_in_image=args.spec_in_image,
        overwrite=args.overwrite,
        deadline_seconds=args.deadline_seconds,
    )
    sys.stdout.write(render(docs))
    return 0
