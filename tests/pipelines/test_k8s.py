"""``slicefeed k8s`` output, validated against the KubeRay RayJob CRD schema.

The schemas under tests/pipelines/data/ are trimmed copies of KubeRay's
ray.io_rayjobs.yaml openAPIV3Schema and the Kubernetes CronJob/PodTemplate
schemas (see each file's ``$comment``). Validation uses ``jsonschema``, in
strict mode: like ``kubectl apply --validate=strict``, a field the schema does
not declare is an error, so a misspelt field cannot slip through.
"""

from __future__ import annotations

import argparse
import copy
import json
import os

import jsonschema
import pytest
import yaml

from slicefeed.connectors import SpecError
from slicefeed.pipelines._ops.k8s import add_parser, build_manifests, render
from tests._harness import run_slicefeed

DATA = os.path.join(os.path.dirname(__file__), "data")

SPEC = """\
name: Nightly Tokenize
source: {format: parquet, uri: "gs://raw-bucket/text/*.parquet"}
transforms:
  - {select: {columns: [text]}}
sink: {format: parquet, uri: "gs://out-bucket/tokenized"}
"""


_slicefeed = run_slicefeed


def _strict(schema):
    """Schema copy where objects with declared properties reject undeclared ones."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if "properties" in node and "additionalProperties" not in node:
                node["additionalProperties"] = False
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(schema)
    return schema


def _validator(name):
    with open(os.path.join(DATA, name)) as f:
        schema = json.load(f)
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(_strict(schema))


RAYJOB = _validator("kuberay_rayjob_v1_schema.json")
CRONJOB = _validator("k8s_cronjob_v1_schema.json")
POD = _validator("k8s_pod_template_schema.json")


def _validate(validator, doc):
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)


@pytest.fixture
def spec_path(tmp_path):
    p = tmp_path / "nightly tokenize.yaml"
    p.write_text(SPEC)
    return str(p)


def _by_kind(docs):
    out = {}
    for d in docs:
        out.setdefault(d["kind"], []).append(d)
    return out


def _all_pod_templates(rayjob):
    cluster = rayjob["spec"]["rayClusterSpec"]
    yield cluster["headGroupSpec"]["template"]
    for g in cluster["workerGroupSpecs"]:
        yield g["template"]


def test_cpu_only_rayjob_validates(spec_path):
    docs = build_manifests(spec_path, image="example.com/slicefeed:1", namespace="data")
    # Round trip through the printed YAML, as kubectl would read it.
    docs = list(yaml.safe_load_all(render(docs)))
    kinds = _by_kind(docs)
    assert [d["kind"] for d in docs] == ["ConfigMap", "RayJob"]
    job = kinds["RayJob"][0]
    _validate(RAYJOB, job)
    for t in _all_pod_templates(job):
        _validate(POD, t)
    assert job["apiVersion"] == "ray.io/v1"
    assert job["metadata"] == {
        "name": "nightly-tokenize", "namespace": "data",
        "labels": {"app.kubernetes.io/name": "slicefeed", "slicefeed.dev/job": "nightly-tokenize"},
    }
    assert job["spec"]["entrypoint"] == "slicefeed run /etc/slicefeed/pipeline.yaml"
    assert job["spec"]["shutdownAfterJobFinishes"] is True
    groups = job["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert [g["groupName"] for g in groups] == ["cpu"]
    assert groups[0]["replicas"] == 2 and groups[0].get("numOfHosts", 1) == 1
    assert "google.com/tpu" not in render(docs)
    assert "nodeSelector" not in groups[0]["template"]["spec"]
    # The spec ships verbatim in the ConfigMap, mounted where the entrypoint reads it.
    cm = kinds["ConfigMap"][0]
    assert cm["data"]["pipeline.yaml"] == SPEC
    head = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert head["volumes"] == [{"name": "slicefeed-spec", "configMap": {"name": cm["metadata"]["name"]}}]
    assert head["containers"][0]["volumeMounts"][0]["mountPath"] == "/etc/slicefeed"
    assert head["containers"][0]["image"] == "example.com/slicefeed:1"


def test_v6e_4x4_rayjob_has_tpu_group(spec_path):
    pytest.importorskip("slicefeed.pipelines._ops.topology", reason="SliceSpec not merged yet")
    docs = list(yaml.safe_load_all(render(
        build_manifests(spec_path, topology="4x4", accelerator="v6e", image="img:1")
    )))
    job = _by_kind(docs)["RayJob"][0]
    _validate(RAYJOB, job)
    for t in _all_pod_templates(job):
        _validate(POD, t)
    groups = {g["groupName"]: g for g in job["spec"]["rayClusterSpec"]["workerGroupSpecs"]}
    assert set(groups) == {"cpu", "tpu-v6e-4x4"}
    tpu = groups["tpu-v6e-4x4"]
    assert tpu["numOfHosts"] == 4  # 16 chips, 4 per host
    assert tpu["replicas"] == tpu["minReplicas"] == tpu["maxReplicas"] == 1
    pod = tpu["template"]["spec"]
    assert pod["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
        "cloud.google.com/gke-tpu-topology": "4x4",
    }
    res = pod["containers"][0]["resources"]
    assert res["limits"]["google.com/tpu"] == "4"
    assert res["requests"]["google.com/tpu"] == "4"
    # The CPU group stays off the TPU nodes.
    assert "google.com/tpu" not in groups["cpu"]["template"]["spec"]["containers"][0]["resources"]["limits"]


def test_cronjob_submits_a_valid_rayjob(spec_path):
    docs = build_manifests(spec_path, schedule="0 3 * * *", image="img:1", namespace="jobs")
    docs = list(yaml.safe_load_all(render(docs)))
    kinds = _by_kind(docs)
    assert "RayJob" not in kinds
    assert set(kinds) == {"ConfigMap", "ServiceAccount", "Role", "RoleBinding", "CronJob"}
    cron = kinds["CronJob"][0]
    _validate(CRONJOB, cron)
    assert cron["spec"]["schedule"] == "0 3 * * *"
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    _validate(POD, cron["spec"]["jobTemplate"]["spec"]["template"])
    rayjob_cm = next(c for c in kinds["ConfigMap"] if "rayjob.yaml" in c["data"])
    rayjob = yaml.safe_load(rayjob_cm["data"]["rayjob.yaml"])
    _validate(RAYJOB, rayjob)
    assert rayjob["metadata"]["generateName"] == "nightly-tokenize-"
    script = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["command"][2]
    assert "kubectl create -n jobs -f /etc/slicefeed-rayjob/rayjob.yaml" in script
    role = kinds["Role"][0]
    assert role["rules"] == [{"apiGroups": ["ray.io"], "resources": ["rayjobs"],
                              "verbs": ["create", "get", "list", "watch"]}]


def test_strict_schema_catches_mistakes(spec_path):
    """The validation can fail: broken manifests are rejected with the field named."""
    job = build_manifests(spec_path, image="img:1")[-1]
    bad = copy.deepcopy(job)
    del bad["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["groupName"]
    assert any("groupName" in e.message for e in RAYJOB.iter_errors(bad))
    bad = copy.deepcopy(job)
    bad["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["numOfHosts"] = "4"
    assert list(RAYJOB.iter_errors(bad))
    bad = copy.deepcopy(job)
    bad["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["numHosts"] = 4  # misspelt
    assert any("numHosts" in e.message for e in RAYJOB.iter_errors(bad))
    bad = copy.deepcopy(job)
    bad["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0][
        "resources"]["limits"]["memory"] = "16 GB"
    assert list(RAYJOB.iter_errors(bad))
    bad = copy.deepcopy(job)
    del bad["spec"]["entrypoint"]
    assert any("entrypoint" in e.message for e in RAYJOB.iter_errors(bad))


def test_cli_parser_prints_manifests(spec_path, capsys):
    parser = argparse.ArgumentParser(prog="slicefeed")
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["k8s", spec_path, "--no-source-check", "--image", "img:1", "--namespace", "ns",
                              "--cpu-workers", "3", "--name", "tok"])
    assert args.handler(args) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    job = _by_kind(docs)["RayJob"][0]
    _validate(RAYJOB, job)
    assert job["metadata"]["name"] == "tok" and job["metadata"]["namespace"] == "ns"
    assert job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] == 3


def test_spec_in_image_ships_no_configmap(spec_path):
    docs = build_manifests(spec_path, image="img:1", spec_in_image="/app/p.yaml", overwrite=True)
    assert [d["kind"] for d in docs] == ["RayJob"]
    _validate(RAYJOB, docs[0])
    assert docs[0]["spec"]["entrypoint"] == "slicefeed run /app/p.yaml --overwrite"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"topology": "4x4"}, "--topology and --accelerator go together"),
        ({"schedule": "every night"}, "5 fields"),
        ({"name": "Bad_Name"}, "--name"),
        ({"worker_memory": "16 GB"}, "--worker-memory"),
        ({"cpu_workers": -1}, "--cpu-workers"),
    ],
)
def test_bad_arguments_are_spec_errors(spec_path, kwargs, match):
    with pytest.raises(SpecError, match=match):
        build_manifests(spec_path, image="img:1", **kwargs)


def test_bad_topology_is_spec_error(spec_path):
    pytest.importorskip("slicefeed.pipelines._ops.topology", reason="SliceSpec not merged yet")
    with pytest.raises(SpecError, match="5x5"):
        build_manifests(spec_path, topology="5x5", accelerator="v6e")


def test_unreadable_or_non_mapping_spec(tmp_path):
    with pytest.raises(SpecError, match="cannot read"):
        build_manifests(str(tmp_path / "missing.yaml"))
    p = tmp_path / "list.yaml"
    p.write_text("- a\n- b\n")
    with pytest.raises(SpecError, match="must be a YAML mapping"):
        build_manifests(str(p))


def test_credentials_never_reach_the_manifests(tmp_path, capsys):
    key = tmp_path / "keys" / "sa-key-9d8c.json"
    key.parent.mkdir()
    key.write_text('{"type": "service_account", "private_key": "PRIVATE-KEY-MARKER-77"}')
    p = tmp_path / "job.yaml"
    p.write_text(
        "name: secret-job\n"
        f"source: {{format: parquet, uri: 'gs://b/in', storage: {{credentials: '{key}'}}}}\n"
        f"sink: {{format: parquet, uri: 'gs://b/out', storage: {{credentials: '{key}'}}}}\n"
    )
    for kwargs in ({}, {"schedule": "@daily"}, {"credentials_secret": "gcp-sa-key"}):
        out = render(build_manifests(str(p), image="img:1", **kwargs))
        assert str(key) not in out and "sa-key-9d8c" not in out
        assert "PRIVATE-KEY-MARKER-77" not in out
        for doc in yaml.safe_load_all(out):
            if doc["kind"] == "RayJob":
                _validate(RAYJOB, doc)
    assert "removed source.storage.credentials, sink.storage.credentials" in capsys.readouterr().err
    # The shipped spec keeps everything else.
    docs = build_manifests(str(p), image="img:1", credentials_secret="gcp-sa-key")
    shipped = yaml.safe_load(docs[0]["data"]["pipeline.yaml"])
    assert shipped == {"name": "secret-job",
                       "source": {"format": "parquet", "uri": "gs://b/in", "storage": {}},
                       "sink": {"format": "parquet", "uri": "gs://b/out", "storage": {}}}
    # A Secret is referenced by name only and mounted for GOOGLE_APPLICATION_CREDENTIALS.
    head = docs[1]["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert {"name": "gcp-key", "secret": {"secretName": "gcp-sa-key"}} in head["volumes"]
    assert {"name": "GOOGLE_APPLICATION_CREDENTIALS",
            "value": "/var/secrets/google/key.json"} in head["containers"][0]["env"]


@pytest.mark.parametrize("mistake, named", [
    ("transforms:\n  - {tokenise: {column: text}}\n", "tokenise"),
    ("on_eror: skip\n", "on_eror"),
])
@pytest.mark.slow
def test_k8s_refuses_an_invalid_spec_with_exit_2(tmp_path, mistake, named):
    """What `slicefeed validate` refuses is refused before a manifest is printed."""
    p = tmp_path / "bad.yaml"
    p.write_text(SPEC.replace("transforms:\n  - {select: {columns: [text]}}\n", "") + mistake)
    r = _slicefeed("k8s", str(p), "--image", "img:1", "--no-source-check")
    assert r.returncode == 2, (r.stdout[-500:], r.stderr[-2000:])
    assert named in r.stderr and "Traceback" not in r.stderr
    assert r.stdout == ""  # nothing to pipe into kubectl apply
    with pytest.raises(SpecError, match=named):
        build_manifests(str(p), image="img:1")
    # --debug after the subcommand is accepted by k8s too.
    r = _slicefeed("k8s", str(p), "--image", "img:1", "--no-source-check", "--debug")
    assert r.returncode != 0 and "Traceback" in r.stderr and named in r.stderr


def test_k8s_checks_columns_against_a_readable_source(tmp_path):
    """With a source it can read, k8s checks the transforms' columns like validate."""
    raw = tmp_path / "raw.jsonl"
    raw.write_text('{"text": "a"}\n')
    p = tmp_path / "cols.yaml"
    p.write_text(f"name: cols\nsource: {{format: jsonl, uri: '{raw}'}}\n"
                 "transforms:\n  - {select: {columns: [nope]}}\n"
                 "sink: {format: parquet, uri: gs://b/out}\n")
    r = _slicefeed("k8s", str(p), "--image", "img:1")
    assert r.returncode == 2 and "column 'nope' not found" in r.stderr, r.stderr[-2000:]


def test_every_image_is_pinned(spec_path):
    warnings = []
    for kwargs in ({}, {"schedule": "0 3 * * *"}):
        docs = list(yaml.safe_load_all(render(build_manifests(spec_path, warn=warnings.append,
                                                              **kwargs))))
        text = render(docs)
        cm = next((d for d in docs if "rayjob.yaml" in d.get("data", {})), None)
        if cm:
            text += cm["data"]["rayjob.yaml"]
        images = [line.split("image:", 1)[1].strip() for line in text.splitlines()
                  if line.strip().startswith("image:")]
        assert images, text
        for image in images:
            last = image.rsplit("/", 1)[-1]
            assert ":" in last and not last.endswith(":latest"), image
    # The default image is named after the installed version and is not published: warned.
    assert any("not published" in w and "--image" in w for w in warnings), warnings
    for bad in ("img", "img:latest", "registry.example.com:5000/slicefeed"):
        with pytest.raises(SpecError, match="not pinned"):
            build_manifests(spec_path, image=bad)
    build_manifests(spec_path, image="registry.example.com:5000/slicefeed@sha256:" + "0" * 64)


def test_configmap_holds_a_readable_yaml_block(spec_path):
    out = render(build_manifests(spec_path, image="img:1", schedule="@daily"))
    assert "pipeline.yaml: |" in out and "rayjob.yaml: |" in out
    # The spec's lines appear as they are, indented under the key.
    for line in SPEC.splitlines():
        assert f"    {line}" in out
    docs = list(yaml.safe_load_all(out))
    assert docs[0]["data"]["pipeline.yaml"] == SPEC


@pytest.mark.slow
def test_local_paths_warned_and_set_passed_through(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "a.jsonl").write_text('{"text": "a"}\n')
    p = tmp_path / "local.yaml"
    p.write_text(f"name: local\nsource: {{format: jsonl, uri: '{raw}'}}\n"
                 f"sink: {{format: parquet, uri: '{tmp_path / 'out'}'}}\n")
    warnings = []
    docs = build_manifests(str(p), image="img:1", warn=warnings.append)
    assert any(w.startswith("source.uri") and "local path" in w for w in warnings), warnings
    assert any(w.startswith("sink.uri") and "local path" in w for w in warnings), warnings
    warnings.clear()
    docs = build_manifests(str(p), image="img:1", warn=warnings.append,
                           overrides=["sink.uri=gs://b/out/{date}", "seed=3"])
    assert not any(w.startswith("sink.uri") for w in warnings), warnings
    job = docs[-1]
    _validate(RAYJOB, job)
    assert job["spec"]["entrypoint"] == (
        "slicefeed run /etc/slicefeed/pipeline.yaml --set 'sink.uri=gs://b/out/{date}' "
        "--set seed=3")
    with pytest.raises(SpecError, match="seed"):
        build_manifests(str(p), image="img:1", overrides=["seed=abc"])
    # The CLI prints the warnings (stderr), and -q silences them.
    r = _slicefeed("k8s", str(p), "--image", "img:1")
    assert r.returncode == 0 and "local path" in r.stderr, r.stderr[-2000:]
    assert list(yaml.safe_load_all(r.stdout))[-1]["kind"] == "RayJob"
    r = _slicefeed("k8s", str(p), "--image", "img:1", "-q")
    assert r.returncode == 0 and r.stderr == "", r.stderr[-2000:]
