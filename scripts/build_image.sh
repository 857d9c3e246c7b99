#!/usr/bin/env bash
# Build the semblend-dynamo image (deploy/docker/Dockerfile): the wheel first (dist/), then the image with docker,
# podman or buildah, whichever exists. Usage: scripts/build_image.sh [IMAGE[:TAG]] [extra build args...]
# Default IMAGE: semblend-dynamo:<package version>, the chart's default image.repository:image.tag.
# DYNAMO_IMAGE=... overrides the base (default: the Dynamo 1.6.1 TensorRT-LLM runtime on NGC).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
VERSION="$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -1)"
IMAGE="${1:-semblend-dynamo:${VERSION}}"
shift $(( $# > 0 ? 1 : 0 ))
BUILDER=""
for tool in docker podman buildah; do
  if command -v "$tool" >/dev/null 2>&1; then BUILDER="$tool"; break; fi
done
if [ -z "$BUILDER" ]; then
  echo "build_image.sh: none of docker, podman or buildah is installed" >&2
  exit 2
fi
# The wheel carries the span aligner's compiled library, so it is tagged for this platform (py3-none-linux_x86_64):
# build the image for the same architecture.
PLATFORM="$("$PY" -c 'import sysconfig; print(sysconfig.get_platform().replace("-", "_").replace(".", "_"))')"
rm -f "dist/semblend_dynamo-${VERSION}-py3-none-${PLATFORM}.whl"
"$PY" -m build --wheel --outdir dist . >/dev/null
ARGS=(--file deploy/docker/Dockerfile --tag "$IMAGE" --build-arg "SEMBLEND_VERSION=${VERSION}")
ARGS+=(--build-arg "WHEEL_PLATFORM=${PLATFORM}")
if [ -n "${DYNAMO_IMAGE:-}" ]; then ARGS+=(--build-arg "DYNAMO_IMAGE=${DYNAMO_IMAGE}"); fi
if [ "$BUILDER" = buildah ]; then
  buildah bud "${ARGS[@]}" "$@" .
else
  "$BUILDER" build "${ARGS[@]}" "$@" .
fi
echo "built $IMAGE with $BUILDER; push it and set image.repository / image.tag (docs/deploy.md)" >&2
