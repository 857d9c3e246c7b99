"""``semblend-dynamo config``: validate settings and print the effective configuration."""

from __future__ import annotations

import argparse
import json

import yaml

from semblend_dynamo.config import add_config_arguments, config_from_args, redacted

EXAMPLES = """examples:
  semblend-dynamo config                                  # the defaults, as YAML
  semblend-dynamo config --config semblend.yaml --format env
  SEMBLEND_MIN_SIMILARITY=0.7 semblend-dynamo config --format json
  semblend-dynamo config --exact-materialization-only 0 --isolation cache_salt   # shifted spans need isolation
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=["yaml", "json", "env"], default="yaml", help="output format (yaml)")
    add_config_arguments(parser)  # every setting: this command validates them all


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    if args.format == "env":
        for key, value in sorted(redacted(cfg.to_env()).items()):
            print(f"{key}={value}")
    elif args.format == "json":
        print(json.dumps(redacted(cfg.model_dump(mode="json")), indent=2, sort_keys=True))
    else:
        print(yaml.safe_dump(redacted(cfg.model_dump(mode="json")), sort_keys=True), end="")
    return 0
