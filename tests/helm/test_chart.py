"""The Helm chart, rendered and linted by Helm's Go SDK (helm-python-sdk), validated without a cluster.

Kubernetes objects are checked with kubernetes-validate (strict, Kubernetes 1.31); the DynamoGraphDeployment is
checked against the CRD's v1beta1 openAPIV3Schema (tests/data) with unknown fields refused, and each component's
podTemplate against the Kubernetes PodTemplate schema. Golden checks tie the chart to the Python code: connector
module and classes, SEMBLEND_* names, NATS subjects and the engine YAML bytes.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml

from semblend_dynamo.config import SemblendConfig, env_name
from semblend_dynamo.events.subjects import Subjects
from tests.helm.chart_schema import CHART_DIR, CHART_MANAGED, load_values_schema, settings_schema
from trtllm_connector.engine_config import (
    CONNECTOR_MODULE,
    CONNECTOR_SCHEDULER_CLASS,
    CONNECTOR_WORKER_CLASS,
    EngineConfigSettings,
    engine_env,
    render_engine_yaml,
)

KUBE_VERSION = "1.31.0"
EXAMPLES = sorted((CHART_DIR / "examples").glob("*.yaml"))
BAD_VALUES = sorted((Path(__file__).parent / "bad").glob("*.yaml"))
DGD_SCHEMA_PATH = Path(__file__).resolve().parents[1] / "data" / "dgd-v1beta1.schema.json"
RELEASE, NAMESPACE = "demo", "inference"
DISAGGREGATED = {"workers": {"topology": "disaggregated", "prefillReplicas": 2, "decodeReplicas": 3}}

CASES: dict[str, dict[str, Any]] = {
    "defaults": {},
    **{path.stem: yaml.safe_load(path.read_text()) for path in EXAMPLES},
    "disaggregated": DISAGGREGATED,
    "etcd-discovery-no-audit": {"discovery": {"backend": "etcd"}, "audit": {"enabled": False}},
}


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(str(CHART_DIR)) as loaded:
        yield loaded


def render(chart: helm.Chart, values: dict[str, Any]) -> dict[str, str]:
    """Template path -> rendered text, like ``helm template demo CHART -n inference``."""
    return chart.render(values=values, name=RELEASE, namespace=NAMESPACE, is_install=True)


def objects(rendered: dict[str, str]) -> list[dict[str, Any]]:
    out = []
    for path, text in rendered.items():
        if path.endswith("NOTES.txt"):
            continue
        out.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return out


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def components(dgd: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in dgd["spec"]["components"]}


def main_container(component: dict[str, Any]) -> dict[str, Any]:
    (container,) = [c for c in component["podTemplate"]["spec"]["containers"] if c["name"] == "main"]
    return container


def plain_env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def worker_components(dgd: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in dgd["spec"]["components"] if main_container(c)["command"][-1] == "dynamo.trtllm"]


def _refuse_unknown_fields(schema: Any) -> Any:
    """The API server prunes unknown fields silently; in tests an unknown field (a typo) is an error."""
    if isinstance(schema, dict):
        out = {k: _refuse_unknown_fields(v) for k, v in schema.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_refuse_unknown_fields(v) for v in schema]
    return schema


@pytest.fixture(scope="module")
def dgd_validator() -> jsonschema.protocols.Validator:
    schema = json.loads(DGD_SCHEMA_PATH.read_text())
    assert schema["x-semblend-source"] == {"group": "nvidia.com", "kind": "DynamoGraphDeployment", "version": "v1beta1"}
    return jsonschema.Draft7Validator(_refuse_unknown_fields(schema))


# --- lint and validate -----------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(CASES))
def test_lint_is_clean(case: str) -> None:
    report = helm.lint(str(CHART_DIR), values=CASES[case], strict=True, kube_version=f"v{KUBE_VERSION}")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("case", list(CASES))
def test_every_object_validates(chart: helm.Chart, dgd_validator: Any, case: str) -> None:
    docs = objects(render(chart, CASES[case]))
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == ["ConfigMap", "DynamoGraphDeployment", "Pod", "Service"]
    for doc in docs:
        if doc["kind"] == "DynamoGraphDeployment":
            errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in dgd_validator.iter_errors(doc)]
            assert errors == []
            for component in doc["spec"]["components"]:
                template = {
                    "apiVersion": "v1",
                    "kind": "PodTemplate",
                    "metadata": {"name": component["name"].lower()},
                    "template": component["podTemplate"],
                }
                kubernetes_validate.validate(template, KUBE_VERSION, strict=True)
        else:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def test_dgd_validation_catches_a_typo(dgd_validator: Any, chart: helm.Chart) -> None:
    # Proves the strict CRD check is live: the same object with one misspelt field must fail.
    dgd = copy.deepcopy(one(objects(render(chart, {})), "DynamoGraphDeployment"))
    dgd["spec"]["components"][0]["replica"] = 1
    messages = [e.message for e in dgd_validator.iter_errors(dgd)]
    assert any("'replica' was unexpected" in m for m in messages), messages


# --- bad values ------------------------------------------------------------------------------------


def _expectations(path: Path) -> tuple[str, str]:
    header = dict(line[2:].split(": ", 1) for line in path.read_text().splitlines() if line.startswith("# expect"))
    return header["expect-at"], header["expect"]


@pytest.mark.parametrize("path", BAD_VALUES, ids=[p.stem for p in BAD_VALUES])
def test_bad_values_fail_for_the_right_reason(chart: helm.Chart, path: Path) -> None:
    where, reason = _expectations(path)
    values = yaml.safe_load(path.read_text())
    with pytest.raises(helm.HelmValuesError) as info:
        render(chart, values)
    message = str(info.value)
    at = "" if where == "(root)" else f"'{where}'"
    lines = [line for line in message.splitlines() if line.startswith("- at ")]
    assert len(lines) == 1, message  # exactly one complaint: this value, nothing collateral
    assert at in lines[0] and reason in lines[0], message
    lint = helm.lint(str(CHART_DIR), values=values, strict=True, kube_version=f"v{KUBE_VERSION}")
    assert any(reason in e for e in lint["errors"]), lint


def test_memory_fraction_with_three_decimals_is_refused(chart: helm.Chart) -> None:
    with pytest.raises(
        helm.HelmRenderError, match=r"engine.freeGpuMemoryFraction=0.855 must have at most two decimals"
    ):
        render(chart, {"engine": {"freeGpuMemoryFraction": 0.855}})


def _out_of_bounds(prop: dict[str, Any]) -> list[Any]:
    """Values just outside what one settings property allows."""
    probes: list[Any] = []
    if "minimum" in prop:
        probes.append(prop["minimum"] - 1)
    if "exclusiveMinimum" in prop:
        probes.append(prop["exclusiveMinimum"])
    if "maximum" in prop:
        probes.append(prop["maximum"] + 1)
    if "enum" in prop:
        probes.append("not-a-choice")
    if prop["type"] == "boolean":
        probes.append("maybe")
    if prop["type"] == "integer":
        probes.append(1.5)
    return probes


SETTING_PROBES = [(name, bad) for name, prop in sorted(settings_schema().items()) for bad in _out_of_bounds(prop)]


@pytest.mark.parametrize(("name", "bad"), SETTING_PROBES)
def test_settings_bounds_match_semblend_config(chart: helm.Chart, name: str, bad: Any) -> None:
    # Whatever pydantic refuses at start-up, the chart refuses at install.
    with pytest.raises(ValueError):
        SemblendConfig.validated({name: bad})
    with pytest.raises(helm.HelmValuesError, match=f"/semblend/settings/{name}"):
        render(chart, {"semblend": {"settings": {name: bad}}})


# --- golden: the chart follows the Python code -----------------------------------------------------


def test_settings_schema_covers_semblend_config() -> None:
    schema = load_values_schema()
    settings = schema["properties"]["semblend"]["properties"]["settings"]
    assert settings["additionalProperties"] is False
    assert settings["properties"] == settings_schema(), "run: .venv/bin/python -m tests.helm.chart_schema --write"
    stale = set(CHART_MANAGED) - set(SemblendConfig.model_fields)
    assert not stale, f"CHART_MANAGED names fields SemblendConfig no longer has: {sorted(stale)}"


@pytest.mark.parametrize("case", list(CASES))
def test_semblend_env_loads_into_semblend_config(chart: helm.Chart, case: str) -> None:
    dgd = one(objects(render(chart, CASES[case])), "DynamoGraphDeployment")
    known = {env_name(n) for n in SemblendConfig.model_fields}
    router = main_container(components(dgd)["SemblendRouter"])
    for container in [router, *map(main_container, worker_components(dgd))]:
        names = [e["name"] for e in container["env"] if e["name"].startswith("SEMBLEND_")]
        assert len(names) == len(set(names)), "duplicate SEMBLEND_* entries"
        assert set(names) <= known, sorted(set(names) - known)
        cfg = SemblendConfig.load(env=plain_env(container))  # what the process will do at start-up
        assert cfg.mode == (CASES[case].get("semblend", {}).get("mode", "exact"))


@pytest.mark.parametrize("case", list(CASES))
def test_router_and_workers_agree_on_subjects_and_mode(chart: helm.Chart, case: str) -> None:
    rendered = render(chart, CASES[case])
    dgd = one(objects(rendered), "DynamoGraphDeployment")
    router_cfg = SemblendConfig.load(env=plain_env(main_container(components(dgd)["SemblendRouter"])))
    workers = worker_components(dgd)
    assert workers
    for worker in workers:
        container = main_container(worker)
        args = container["args"]
        uri = args[args.index("--endpoint") + 1]
        namespace, component, endpoint = uri.removeprefix("dyn://").split(".")
        published = Subjects.for_endpoint(namespace, component, endpoint)
        assert plain_env(container)["DYN_NAMESPACE"] == namespace
        worker_cfg = SemblendConfig.load(env=plain_env(container))
        # The router listens where the workers publish kv-events, and both use one set of semblend.* subjects.
        assert Subjects.for_config(router_cfg) == Subjects.for_config(worker_cfg) == published
        assert worker_cfg.connector_nats
        assert args[args.index("--kv-block-size") + 1] == str(worker_cfg.block_size) == str(router_cfg.block_size)
        assert worker_cfg.model_id == router_cfg.model_id == args[args.index("--served-model-name") + 1]
        settings = EngineConfigSettings.from_config(worker_cfg)
        for key, value in engine_env(settings).items():
            assert plain_env(container)[key] == value
    notes = next(text for path, text in rendered.items() if path.endswith("NOTES.txt"))
    assert Subjects.for_config(router_cfg).kv_events in notes


def test_frontend_reaches_only_the_router(chart: helm.Chart) -> None:
    dgd = one(objects(render(chart, {})), "DynamoGraphDeployment")
    comps = components(dgd)
    frontend_args = main_container(comps["Frontend"])["args"]
    router_env = plain_env(main_container(comps["SemblendRouter"]))
    frontend_ns = frontend_args[frontend_args.index("--namespace") + 1]
    assert frontend_ns == router_env["DYN_NAMESPACE"]
    assert frontend_ns != router_env[env_name("dynamo_namespace")]  # workers live in another Dynamo namespace
    assert {e["name"]: e["value"] for e in dgd["spec"]["env"]}["DYN_EVENT_PLANE"] == "nats"


def test_nats_defaults_to_the_platform_and_is_overridable(chart: helm.Chart) -> None:
    def nats_urls(values: dict[str, Any]) -> set[str]:
        dgd = one(objects(render(chart, values)), "DynamoGraphDeployment")
        urls = {e["value"] for e in dgd["spec"]["env"] if e["name"] == "NATS_SERVER"}
        urls |= {plain_env(main_container(c)).get(env_name("nats_url"), "") for c in worker_components(dgd)}
        return urls

    assert nats_urls({}) == {f"nats://dynamo-platform-nats.{NAMESPACE}:4222"}
    assert nats_urls({"platform": {"releaseName": "dp", "namespace": "dynamo-system"}}) == {
        "nats://dp-nats.dynamo-system:4222"
    }
    assert nats_urls({"nats": {"url": "nats://my-nats:4222"}}) == {"nats://my-nats:4222"}


def test_engine_config_map_loads_the_connector(chart: helm.Chart) -> None:
    docs = objects(render(chart, {}))
    engine = yaml.safe_load(one(docs, "ConfigMap")["data"]["engine.yaml"])
    assert engine["kv_connector_config"] == {
        "connector_module": CONNECTOR_MODULE,
        "connector_scheduler_class": CONNECTOR_SCHEDULER_CLASS,
        "connector_worker_class": CONNECTOR_WORKER_CLASS,
    }
    for worker in worker_components(one(docs, "DynamoGraphDeployment")):
        container = main_container(worker)
        path = container["args"][container["args"].index("--extra-engine-args") + 1]
        mount = next(m for m in container["volumeMounts"] if m["name"] == "engine-config")
        assert path == f"{mount['mountPath']}/engine.yaml"


def _engine_settings(values: dict[str, Any]) -> EngineConfigSettings:
    semblend, engine, workers = (values.get(k, {}) for k in ("semblend", "engine", "workers"))
    merged = {
        "mode": semblend.get("mode", "exact"),
        "isolation": semblend.get("isolation", "none"),
        "tokens_per_block": engine.get("tokensPerBlock", 32),
        "free_gpu_memory_fraction": engine.get("freeGpuMemoryFraction", 0.85),
        "event_buffer_max_size": engine.get("eventBufferMaxSize", 100_000),
        "enable_partial_reuse": engine.get("enablePartialReuse", False),
    }
    if workers.get("topology") == "disaggregated":
        merged["cache_transceiver_backend"] = workers.get("cacheTransceiverBackend", "DEFAULT")
    return EngineConfigSettings.model_validate(merged)


ENGINE_CASES = {
    **CASES,
    "odd-numbers": {
        "engine": {"tokensPerBlock": 64, "freeGpuMemoryFraction": 0.9, "eventBufferMaxSize": 2_000_000},
        "semblend": {"mode": "shifted", "isolation": "cache_salt"},
    },
    "partial-reuse-on": {"engine": {"enablePartialReuse": True, "freeGpuMemoryFraction": 1}},
}


@pytest.mark.parametrize("case", list(ENGINE_CASES))
def test_engine_yaml_is_byte_identical_to_render_engine_yaml(chart: helm.Chart, case: str) -> None:
    values = ENGINE_CASES[case]
    config_map = one(objects(render(chart, values)), "ConfigMap")
    assert config_map["data"]["engine.yaml"] == render_engine_yaml(_engine_settings(values))


def _launcher_present() -> bool:
    return importlib.util.find_spec("trtllm_connector.launcher") is not None


@pytest.mark.skipif(not _launcher_present(), reason="trtllm_connector.launcher (semblend-trtllm) has not landed yet")
@pytest.mark.parametrize("form", ["print-config", "serve --print-config"])
@pytest.mark.parametrize("case", ["defaults", "shifted-span-experiment", "discovery-only", "exact-production"])
def test_engine_yaml_matches_semblend_trtllm_print_config(chart: helm.Chart, case: str, form: str) -> None:
    # The launcher gets what a worker pod gets: its SEMBLEND_* env and the chart's engine numbers.
    values = CASES[case]
    settings = _engine_settings(values)
    dgd = one(objects(render(chart, values)), "DynamoGraphDeployment")
    env = {k: v for k, v in plain_env(main_container(worker_components(dgd)[0])).items() if k.startswith("SEMBLEND_")}
    subcommand = ["print-config"] if form == "print-config" else ["serve", values.get("model", {}).get("path", "m")]
    command = [
        sys.executable,
        "-m",
        "trtllm_connector.launcher",
        *subcommand,
        *([] if form == "print-config" else ["--print-config"]),
        "--free-gpu-memory-fraction",
        f"{settings.free_gpu_memory_fraction:.2f}",
        "--event-buffer-max-size",
        str(settings.event_buffer_max_size),
    ]
    done = subprocess.run(command, env={"PATH": "/usr/bin:/bin", **env}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    config_map = one(objects(render(chart, values)), "ConfigMap")
    assert done.stdout == config_map["data"]["engine.yaml"]


# --- labels, probes, security ----------------------------------------------------------------------


def test_labels_annotations_probes_and_security(chart: helm.Chart) -> None:
    docs = objects(render(chart, {}))
    for doc in docs:
        labels = doc["metadata"]["labels"]
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["helm.sh/chart"].startswith("semblend-dynamo-")
    dgd = one(docs, "DynamoGraphDeployment")
    for component in dgd["spec"]["components"]:
        pod = component["podTemplate"]
        assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
        security = main_container(component)["securityContext"]
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"]["drop"] == ["ALL"]
    router = main_container(components(dgd)["SemblendRouter"])
    port = int(plain_env(router)[env_name("metrics_port")])
    assert router["ports"] == [{"name": "metrics", "containerPort": port, "protocol": "TCP"}]
    for probe in ("livenessProbe", "readinessProbe"):
        assert router[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    service = one(docs, "Service")
    router_labels = components(dgd)["SemblendRouter"]["podTemplate"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= router_labels.items()
    test_pod = one(docs, "Pod")
    assert test_pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    url = test_pod["spec"]["containers"][0]["command"][-1]
    assert url == f"http://{service['metadata']['name']}.{NAMESPACE}.svc:{port}/healthz"


def test_disaggregated_topology_renders_prefill_and_decode(chart: helm.Chart) -> None:
    dgd = one(objects(render(chart, DISAGGREGATED)), "DynamoGraphDeployment")
    modes = {}
    for worker in worker_components(dgd):
        args = main_container(worker)["args"]
        modes[worker["type"]] = (args[args.index("--disaggregation-mode") + 1], worker["replicas"])
    assert modes == {"prefill": ("prefill", 2), "decode": ("decode", 3)}


def test_integral_settings_render_without_exponent(chart: helm.Chart) -> None:
    # Helm reads numbers as float64 and would print 1048576 as 1.048576e+06, which pydantic refuses as an int.
    values = {"semblend": {"settings": {"max_message_bytes": 1 << 20, "index_capacity": 2_000_000}}}
    dgd = one(objects(render(chart, values)), "DynamoGraphDeployment")
    cfg = SemblendConfig.load(env=plain_env(main_container(components(dgd)["SemblendRouter"])))
    assert (cfg.max_message_bytes, cfg.index_capacity) == (1 << 20, 2_000_000)


def test_values_yaml_is_documented_line_by_line() -> None:
    undocumented = []
    previous = ""
    for number, line in enumerate((CHART_DIR / "values.yaml").read_text().splitlines(), 1):
        text = line.strip()
        if not text:
            continue
        defines = re.match(r"^(- )?[A-Za-z0-9_./\"-]+:", text) is not None
        if defines and "#" not in text and not previous.startswith("#"):
            undocumented.append(f"{number}: {line}")
        previous = text
    assert undocumented == []
