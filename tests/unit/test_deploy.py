"""What ships for deployment checks out without Docker, helm or a cluster: the Dockerfile passes
hadolint, the Helm chart lints and renders offline and every manifest it renders validates
strictly against the Kubernetes schema (for the default values and for three engines on
PostgreSQL with a KubeRay cluster), and the systemd unit passes `systemd-analyze verify`."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import helm_python
import jsonschema
import kubernetes_validate
import pytest
import yaml

from corral.config_models import check

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "corral"
CI_VALUES = CHART / "ci" / "postgres-ray-values.yaml"
UNIT = ROOT / "deploy" / "systemd" / "corral.service"
KUBE = "1.30.0"
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    """A tool the project's setup installs (scripts/setup): missing is a failure, not a skip."""
    found = shutil.which(name, path=f"{BIN}:/usr/bin:/bin:/usr/sbin:/sbin")
    assert found, f"{name} is missing: scripts/setup installs it"
    return found


# ------------------------------------------------------------------------------ Dockerfile


def hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("hadolint"), "--no-color", str(path)], capture_output=True, text=True, timeout=60
    )


def test_the_dockerfile_passes_hadolint() -> None:
    r = hadolint(ROOT / "Dockerfile")
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")


def test_hadolint_does_find_problems(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get install gcc\nUSER corral\n")
    r = hadolint(bad)
    assert r.returncode != 0 and "DL3007" in r.stdout  # `latest`


def stages() -> list[list[str]]:
    """The Dockerfile's stages, each its instructions (continuation lines joined)."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    found: list[list[str]] = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line.startswith("FROM "):
            found.append([])
        if found:
            found[-1].append(" ".join(line.split()))
    return found


def test_the_final_image_has_no_compiler_runs_unprivileged_and_probes_health() -> None:
    builder, final = stages()
    assert builder[0].endswith(" AS builder") and any("pip wheel" in i for i in builder)
    assert "slim" in final[0]
    body = "\n".join(final)
    for compiler in ("gcc", "build-essential", "clang", "apt-get"):
        assert compiler not in body
    assert "COPY --from=builder /wheels" in body
    user = next(i for i in final if i.startswith("USER "))
    assert user == "USER 10001:10001"  # numeric: no root, whatever the host's passwd says
    assert 'VOLUME ["/var/lib/corral"]' in final
    assert any(i.startswith("HEALTHCHECK ") and "/healthz" in i for i in final)
    assert 'ENTRYPOINT ["corral"]' in final


# ------------------------------------------------------------------------------ Helm chart


def render(values: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Every rendered manifest, by template."""
    chart = helm_python.Chart.load(str(CHART))
    try:
        out = chart.render(values, name="corral", namespace="agents", is_install=True)
    finally:
        chart.close()
    docs = {
        path: [d for d in yaml.safe_load_all(text) if d]
        for path, text in out.items()
        if path.endswith(".yaml")
    }
    return {path: found for path, found in docs.items() if found}


def ci_values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load(CI_VALUES.read_text())
    return values


def test_the_chart_lints_clean() -> None:
    report = helm_python.lint(str(CHART), strict=True, kube_version=f"v{KUBE}")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []  # warnings and errors
    report = helm_python.lint(str(CHART), ci_values(), strict=True, kube_version=f"v{KUBE}")
    assert report["errors"] == [] and all(m["severity"] < 2 for m in report["messages"])


# KubeRay's resources are custom: the Kubernetes schema does not know them. Their pod templates
# are validated as PodTemplates (strictly), the fields around them against this outline of
# KubeRay's ray.io/v1 API (the fields the chart uses, nothing else allowed).
RAY_OUTLINE: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "ray.io/v1"},
        "kind": {"enum": ["RayCluster", "RayJob"]},
        "metadata": {"type": "object"},
        "spec": {"type": "object"},
    },
}
RAY_CLUSTER_SPEC: dict[str, Any] = {
    "type": "object",
    "required": ["headGroupSpec"],
    "additionalProperties": False,
    "properties": {
        "rayVersion": {"type": "string"},
        "enableInTreeAutoscaling": {"type": "boolean"},
        "headGroupSpec": {
            "type": "object",
            "required": ["rayStartParams", "template"],
            "additionalProperties": False,
            "properties": {
                "rayStartParams": {"type": "object", "additionalProperties": {"type": "string"}},
                "template": {"type": "object"},
            },
        },
        "workerGroupSpecs": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["groupName", "maxReplicas", "rayStartParams", "template"],
                "additionalProperties": False,
                "properties": {
                    "groupName": {"type": "string"},
                    "replicas": {"type": "integer", "minimum": 0},
                    "minReplicas": {"type": "integer", "minimum": 0},
                    "maxReplicas": {"type": "integer", "minimum": 1},
                    "rayStartParams": {
                        "type": "object",
                        "additionalProperties": {"type": "string"},
                    },
                    "template": {"type": "object"},
                },
            },
        },
    },
}
RAY_JOB_SPEC: dict[str, Any] = {
    "type": "object",
    "required": ["entrypoint", "clusterSelector"],
    "additionalProperties": False,
    "properties": {
        "entrypoint": {"type": "string"},
        "clusterSelector": {"type": "object", "additionalProperties": {"type": "string"}},
        "shutdownAfterJobFinishes": {"type": "boolean"},
    },
}


def validate(doc: dict[str, Any]) -> None:
    """One manifest, strictly: the Kubernetes schema, or for KubeRay's kinds the outline above
    with every pod template validated as a PodTemplate."""
    if doc.get("apiVersion") != "ray.io/v1":
        kubernetes_validate.validate(doc, KUBE, strict=True)
        return
    jsonschema.validate(doc, RAY_OUTLINE)
    spec = doc["spec"]
    if doc["kind"] == "RayJob":
        jsonschema.validate(spec, RAY_JOB_SPEC)
        return
    jsonschema.validate(spec, RAY_CLUSTER_SPEC)
    groups = [spec["headGroupSpec"], *spec.get("workerGroupSpecs", [])]
    for group in groups:
        pod = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}}
        kubernetes_validate.validate({**pod, "template": group["template"]}, KUBE, strict=True)


@pytest.mark.parametrize("which", ["default", "postgres-ray"])
def test_every_rendered_manifest_validates_strictly(which: str) -> None:
    rendered = render({} if which == "default" else ci_values())
    kinds = sorted(d["kind"] for docs in rendered.values() for d in docs)
    base = ["ConfigMap", "Deployment", "NetworkPolicy", "Service", "ServiceAccount"]
    if which == "default":
        assert kinds == sorted([*base, "PersistentVolumeClaim"])
    else:
        assert kinds == sorted([*base, "RayCluster", "RayJob"])
    for docs in rendered.values():
        for doc in docs:
            validate(doc)


def test_validation_is_strict() -> None:
    (deployment,) = render({})["corral/templates/deployment.yaml"]
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"][
        "colour"
    ] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(deployment)
    (cluster,) = render(ci_values())["corral/templates/raycluster.yaml"]
    cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["imag"] = "x"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(cluster)


def deployment_of(values: dict[str, Any]) -> dict[str, Any]:
    (doc,) = render(values)["corral/templates/deployment.yaml"]
    return doc


def test_more_than_one_engine_needs_postgresql() -> None:
    with pytest.raises(helm_python.HelmError, match="replicaCount > 1 needs PostgreSQL"):
        render({"replicaCount": 2})
    values = ci_values()
    del values["keys"]
    with pytest.raises(helm_python.HelmError, match=r"share secrets\.key and audit\.key"):
        render(values)
    assert deployment_of(ci_values())["spec"]["replicas"] == 3
    assert deployment_of(ci_values())["spec"]["strategy"]["type"] == "RollingUpdate"
    assert deployment_of({})["spec"]["strategy"] == {"type": "Recreate"}  # one SQLite engine


def test_plain_http_only_when_asked_for() -> None:
    with pytest.raises(helm_python.HelmError, match=r"http\.insecure: true"):
        render({"http": {"tls": {"secretName": ""}}})
    tls = deployment_of({})["spec"]["template"]["spec"]["containers"][0]
    assert tls["args"] == [
        *("serve", "--http", "0.0.0.0:8765"),
        *("--tls-cert", "/etc/corral/tls/tls.crt", "--tls-key", "/etc/corral/tls/tls.key"),
    ]
    assert tls["readinessProbe"]["httpGet"] == {
        "path": "/readyz",
        "port": "http",
        "scheme": "HTTPS",
    }
    plain = deployment_of({"http": {"insecure": True}})["spec"]["template"]["spec"]
    assert plain["containers"][0]["args"][-1] == "--insecure-http"
    assert plain["containers"][0]["livenessProbe"]["httpGet"]["scheme"] == "HTTP"
    assert "tls" not in [v["name"] for v in plain["volumes"]]


def test_secrets_come_only_from_secret_key_refs() -> None:
    rendered = render(ci_values())
    assert not any(d["kind"] == "Secret" for docs in rendered.values() for d in docs)
    env = deployment_of(ci_values())["spec"]["template"]["spec"]["containers"][0]["env"]
    by_name = {e["name"]: e for e in env}
    for name in ("CORRAL_STORE_URL", "ANTHROPIC_API_KEY", "HF_TOKEN", "WANDB_API_KEY"):
        assert set(by_name[name]) == {"name", "valueFrom"}
        assert set(by_name[name]["valueFrom"]) == {"secretKeyRef"}
    assert by_name["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf", "key": "token"}
    plain = {e["name"] for e in env if "value" in e}
    assert plain == {"CORRAL_CONFIG", "CORRAL_DATA_DIR", "HOME"}
    for clear in (
        {"name": "HF_TOKEN", "value": "hf_plain"},
        {"name": "HF_TOKEN", "secretName": ""},
    ):
        with pytest.raises(helm_python.HelmError):  # the values' schema, then the template
            render({"secretEnv": [clear]})
    chart = helm_python.Chart.load(str(CHART))
    try:
        with pytest.raises(helm_python.HelmValuesError, match="value"):
            chart.validate_schema({"secretEnv": [{"name": "X", "value": "plain"}]})
    finally:
        chart.close()


def test_the_engine_runs_unprivileged_with_no_kubernetes_api_access() -> None:
    rendered = render(ci_values())
    (account,) = rendered["corral/templates/serviceaccount.yaml"]
    assert account["automountServiceAccountToken"] is False
    kinds = {d["kind"] for docs in rendered.values() for d in docs}
    assert not kinds & {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}
    pod = deployment_of(ci_values())["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    container = pod["containers"][0]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["resources"]["limits"] and container["resources"]["requests"]
    (policy,) = rendered["corral/templates/networkpolicy.yaml"]
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]


def test_the_rendered_corral_yaml_is_one_corral_accepts() -> None:
    for values in ({}, ci_values()):
        (config_map,) = render(values)["corral/templates/configmap.yaml"]
        text = config_map["data"]["corral.yaml"]
        assert check(text, "corral.yaml") == []
    config = yaml.safe_load(text)
    assert config["environments"]["torch-dev-gpu"] == {
        "kind": "ray",
        "address": "ray://torch-dev-gpu-head-svc.agents.svc:10001",
        "max_inflight": 4,
    }
    assert config["secrets"] == {"key_file": "/etc/corral/keys/secrets.key"}
    assert config["audit"]["key_file"] == "/etc/corral/keys/audit.key"
    assert config["audit"]["checkpoint_every_s"] == 30  # the values' own keys kept


def test_the_chart_declares_no_dependency() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert "dependencies" not in chart
    assert not (CHART / "charts").exists()


# ------------------------------------------------------------------------------ systemd


def verify_unit(text: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`systemd-analyze verify` on the unit, its ExecStart pointed at this environment's
    `corral` (verify checks that the program exists; /opt/corral is the installed path)."""
    unit = tmp_path / "corral.service"
    unit.write_text(text.replace("/opt/corral/bin/corral", str(BIN / "corral")))
    return subprocess.run(
        [tool("systemd-analyze"), "verify", str(unit)], capture_output=True, text=True, timeout=60
    )


def test_the_systemd_unit_verifies(tmp_path: Path) -> None:
    text = UNIT.read_text()
    assert "ExecStart=/opt/corral/bin/corral serve" in text
    r = verify_unit(text, tmp_path)
    assert (r.returncode, r.stderr) == (0, "")
    assert "KillMode=process" in text  # a restart leaves the agents running: re-adopted


def test_systemd_analyze_does_find_problems(tmp_path: Path) -> None:
    r = verify_unit(UNIT.read_text().replace("KillMode=process", "KillMode=bogus"), tmp_path)
    assert "KillMode" in r.stderr or "kill mode" in r.stderr


def test_the_values_schema_holds_both_values_files_and_refuses_bad_ones() -> None:
    chart = helm_python.Chart.load(str(CHART))
    try:
        chart.validate_schema({})
        chart.validate_schema(ci_values())
        for bad, where in (
            ({"replicaCount": 0}, "/replicaCount"),
            ({"http": {"port": "8765"}}, "/http/port"),
            ({"store": {"postgresql": {"url": "postgresql://u:pw@db/corral"}}}, "url"),
        ):
            with pytest.raises(helm_python.HelmValuesError, match=where):
                chart.validate_schema(bad)
    finally:
        chart.close()
