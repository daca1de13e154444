#!/usr/bin/env bash
# Installs the OpenAPI validator that server's TestOpenAPIValidator runs on
# /openapi.json: @apidevtools/swagger-parser, pinned in
# tools/openapi-validator/package-lock.json, with Debian's nodejs and npm if
# they are missing. Idempotent: npm ci runs only when the lockfile changed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
	echo "openapi-validator: apt-get install nodejs npm" >&2
	sudo=()
	[ "$(id -u)" -eq 0 ] || sudo=(sudo)
	# Other engineers may run apt at the same time: wait for the lock.
	"${sudo[@]}" apt-get -o DPkg::Lock::Timeout=600 update -qq
	DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
		--no-install-recommends nodejs npm >/dev/null
fi

dir=tools/openapi-validator
# npm ci wipes node_modules; run it only when the lockfile changed.
stamp=$dir/node_modules/.clusterd-lock-sha256
lock="$(sha256sum "$dir/package-lock.json" | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$lock" ]; then
	echo "openapi-validator: npm ci ($dir)" >&2
	(cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
	echo "$lock" >"$stamp"
fi
