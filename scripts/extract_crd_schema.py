"""Extract one version's openAPIV3Schema from the DynamoGraphDeployment CRD into tests/data.

The full CRD (the DynamoGraphDeployment CRD YAML of Dynamo's operator) is 1.6 MB; the chart tests need only the schema of the version the chart renders.

    .venv/bin/python scripts/extract_crd_schema.py dynamo-graph-deployment-crd.yaml \
        --version v1beta1 --out tests/data/dgd-v1beta1.schema.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml


def extract(crd: dict, version: str) -> dict:
    """The openAPIV3Schema of ``version``, with the CRD's group/kind recorded for the tests."""
    for entry in crd["spec"]["versions"]:
        if entry["name"] == version:
            schema = dict(entry["schema"]["openAPIV3Schema"])
            schema["x-semblend-source"] = {
                "group": crd["spec"]["group"],
                "kind": crd["spec"]["names"]["kind"],
                "version": version,
            }
            return schema
    known = ", ".join(v["name"] for v in crd["spec"]["versions"])
    raise SystemExit(f"version {version!r} not in the CRD (has: {known})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("crd", type=Path)
    parser.add_argument("--version", default="v1beta1")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    crd = yaml.safe_load(args.crd.read_text())
    schema = extract(crd, args.version)
    args.out.write_text(json.dumps(schema, sort_keys=True, separators=(",", ":")) + "\n")
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
