#!/usr/bin/env bash
# image.sh TAG...: build the clusterd image (deploy/Dockerfile) and tag it.
# The binary is built here, static (CGO_ENABLED=0, -trimpath) and stamped
# with VERSION and COMMIT (the Makefile's, else git describe), then copied
# with the host's CA bundle into a staged context, so the build pulls
# nothing. Needs a Docker engine (scripts/docker-setup.sh).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ $# -ge 1 ] || { echo "usage: $0 TAG..." >&2; exit 2; }

VERSION="${VERSION:-$(bash scripts/release.sh version 2>/dev/null || echo devel)}"
COMMIT="${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
CA="${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
[ -r "$CA" ] || { echo "image: no CA bundle at $CA (apt-get install ca-certificates, or set CA_BUNDLE)" >&2; exit 1; }

ctx="$(mktemp -d)"
trap 'rm -rf "$ctx"' EXIT
CGO_ENABLED=0 go build -trimpath \
	-ldflags "-s -w -X github.com/clusterd/clusterd/version.version=$VERSION -X github.com/clusterd/clusterd/version.commit=$COMMIT" \
	-o "$ctx/clusterd" ./cmd/clusterd
cp "$CA" "$ctx/ca-certificates.crt"
printf 'root:x:0:0:root:/:/sbin/nologin\nclusterd:x:65532:65532:clusterd:/data:/sbin/nologin\n' > "$ctx/passwd"
printf 'root:x:0:\nclusterd:x:65532:\n' > "$ctx/group"
mkdir -m 0750 "$ctx/data"
mkdir -m 1777 "$ctx/tmp"
cp deploy/Dockerfile "$ctx/Dockerfile"

tags=()
for t in "$@"; do tags+=(-t "$t"); done
# The classic builder: BuildKit is a separate package on Debian, and this
# Dockerfile needs nothing it adds.
# Its deprecation notice is printed only with a failure's output.
if ! DOCKER_BUILDKIT=0 docker build -q "${tags[@]}" \
	--build-arg VERSION="$VERSION" --build-arg COMMIT="$COMMIT" \
	--build-arg CREATED="$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
	"$ctx" >"$ctx.log" 2>&1; then
	cat "$ctx.log" >&2
	rm -f "$ctx.log"
	exit 1
fi
rm -f "$ctx.log"
echo "image: built $* (clusterd $VERSION, $(du -h "$ctx/clusterd" | cut -f1) binary)"
