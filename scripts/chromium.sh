#!/usr/bin/env bash
# Makes sure Debian's chromium is installed, for the web view's browser test
# (server/web_test.go drives it headless through the DevTools protocol).
# Idempotent: does nothing when /usr/bin/chromium exists. Prints the browser's
# version on success.
set -euo pipefail

if ! command -v chromium >/dev/null; then
	echo "chromium: apt-get install chromium" >&2
	sudo=()
	[ "$(id -u)" -eq 0 ] || sudo=(sudo)
	# Other engineers may run apt at the same time: wait for the lock.
	"${sudo[@]}" apt-get -o DPkg::Lock::Timeout=600 update -qq
	DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
		--no-install-recommends chromium fonts-dejavu-core >/dev/null
fi
chromium --version 2>/dev/null  # its wrapper script complains about large memory sizes on stderr
