"""The part of the chart's values.schema.json that mirrors SemblendConfig: ``semblend.settings``.

Every SemblendConfig field is either set by the chart itself (:data:`CHART_MANAGED`) or accepted under
``semblend.settings`` with the same name, type and bounds as the Python model. The tests compare the
committed schema with :func:`settings_schema`; after changing SemblendConfig, refresh it with

    .venv/bin/python -m tests.helm.chart_schema --write
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from semblend_dynamo.config import SemblendConfig

CHART_DIR = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "semblend-dynamo"
SCHEMA_PATH = CHART_DIR / "values.schema.json"

CHART_MANAGED: dict[str, str] = {
    "discovery_only": "semblend.mode",
    "exact_materialization_only": "semblend.mode",
    "isolation": "semblend.isolation",
    "block_size": "engine.tokensPerBlock",
    "model_id": "model.servedName",
    "nats_url": "nats.url",
    "nats_token": "nats.tokenSecret",
    "nats_user": "not supported by the chart (use nats.tokenSecret)",
    "nats_password": "not supported by the chart (use nats.tokenSecret)",
    "nats_creds_file": "not supported by the chart (use nats.tokenSecret)",
    "dynamo_namespace": "dynamo.workerNamespace",
    "worker_component": "dynamo.workerComponent",
    "worker_endpoint": "dynamo.workerEndpoint",
    "router_component": "dynamo.routerComponent",
    "router_namespace": "dynamo.namespace (the Frontend's)",
    "model_path": "model.path",
    "register_model": "always on: the Frontend reaches the router through its model card",
    "metrics_port": "router.metricsPort",
    "metrics_host": "router pods listen on 0.0.0.0",
    "audit_path": "audit.*",
    "connector_nats": "always on for workers: hints reach the connector over NATS",
    "worker_id": "per pod, left to the connector",
}
"""SemblendConfig fields the chart derives from its own values, with where they come from."""

_KEPT = ("type", "enum", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength")


def _property(prop: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in prop:
        target = defs[prop["$ref"].rsplit("/", 1)[-1]]
        out: dict[str, Any] = {"type": "string", "enum": list(target["enum"])}
    elif "anyOf" in prop:
        options = [o for o in prop["anyOf"] if o.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"cannot express {prop} in the values schema")
        out = {k: v for k, v in options[0].items() if k in _KEPT}
        out["type"] = [out["type"], "null"]
    else:
        out = {k: v for k, v in prop.items() if k in _KEPT}
    out["description"] = prop.get("description", "")
    return out


def settings_schema() -> dict[str, Any]:
    """JSON-schema properties of ``semblend.settings``, derived from SemblendConfig."""
    full = SemblendConfig.model_json_schema()
    defs = full.get("$defs", {})
    return {name: _property(prop, defs) for name, prop in full["properties"].items() if name not in CHART_MANAGED}


def load_values_schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="check or refresh semblend.settings in values.schema.json")
    parser.add_argument("--write", action="store_true", help="rewrite the schema file")
    args = parser.parse_args(argv)
    schema = load_values_schema()
    settings = schema["properties"]["semblend"]["properties"]["settings"]
    wanted = settings_schema()
    if settings["properties"] == wanted:
        print("values.schema.json semblend.settings is up to date")
        return 0
    if not args.write:
        print("values.schema.json semblend.settings is stale; rerun with --write", file=sys.stderr)
        return 1
    settings["properties"] = wanted
    SCHEMA_PATH.write_text(json.dumps(schema, indent=2) + "\n")
    print(f"rewrote {SCHEMA_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
