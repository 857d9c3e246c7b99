"""``semblend-dynamo config``: validate settings and print the effective configuration."""

from __future__ import annotations

import argparse
import json

import yaml

from semblend_dynamo.config import add_config_arguments, config_from_args, redacted


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=["yaml", "json", "env"], default="yaml")
    add_config_arguments(parser)


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
