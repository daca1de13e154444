#!/usr/bin/env bash
# docker-setup.sh: make sure a Docker engine answers, for `make image` and
# the image tests. It installs Debian's docker.io when dockerd is missing and
# starts the daemon with no bridge network and no iptables rules
# (--bridge=none --iptables=false): containers here run only with
# --network host, so no traffic leaves loopback. Exit 1 when the engine
# cannot be started.
set -uo pipefail

if docker info >/dev/null 2>&1; then
	exit 0
fi
if ! command -v dockerd >/dev/null; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
		echo "docker: installing docker.io" >&2
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io >/dev/null 2>&1 ||
			{ apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io >/dev/null 2>&1; } ||
			{ echo "docker: apt-get install docker.io failed" >&2; exit 1; }
	else
		echo "docker: dockerd is not installed (apt-get install docker.io)" >&2
		exit 1
	fi
fi
log=/var/log/clusterd-dockerd.log
[ -w /var/log ] || log="${TMPDIR:-/tmp}/clusterd-dockerd.log"
echo "docker: starting dockerd --bridge=none --iptables=false (log: $log)" >&2
setsid nohup dockerd --bridge=none --iptables=false --ip6tables=false >"$log" 2>&1 </dev/null &
for _ in $(seq 1 60); do
	if docker info >/dev/null 2>&1; then
		exit 0
	fi
	sleep 1
done
echo "docker: dockerd did not answer within 60 s; its log ends:" >&2
tail -20 "$log" >&2
exit 1
