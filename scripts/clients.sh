#!/usr/bin/env bash
# The example clients in clients/<language>/ (Go, Java, TypeScript, Python):
# install what they need, generate their code, build them, start a fresh
# bin/clusterd on a throwaway SQLite database, run each against it, stop it.
# Each client creates a cluster, follows its operation, decodes an ABORTED and
# an INVALID_ARGUMENT, and must print "client <language>: ok".
#
#   scripts/clients.sh          everything (what `make clients` and `make test` run)
#   scripts/clients.sh deps     only install: Debian packages (apt-get) and npm ci
#   scripts/clients.sh build    install, generate and build, run nothing
#
# Needs bin/clusterd and buf (make build tools). Generated code goes to
# clients/*/gen and builds to clients/*/build, clients/typescript/dist: all
# git-ignored. Only Debian's packages, the npm registry and the Go module
# proxy are used.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# What the Java and Python clients run on, from Debian: protoc 3.21 with
# grpc-java 1.41 and its runtime jars, python3-grpcio with python3-protobuf.
DEBIAN_PACKAGES=(
	protobuf-compiler protobuf-compiler-grpc protobuf-compiler-grpc-java-plugin
	libprotobuf-java libgrpc-java libnetty-java libperfmark-java libgoogle-gson-java
	libguava-java libgeronimo-annotation-1.3-spec-java libjsr305-java liberror-prone-java
	python3-grpcio python3-protobuf
)
# The jars of /usr/share/java the Java client compiles and runs with.
JARS=(
	grpc-api grpc-context grpc-core grpc-netty grpc-protobuf grpc-protobuf-lite grpc-stub
	protobuf guava perfmark-api gson geronimo-annotation-1.3-spec jsr305 error_prone_annotations
	netty-buffer netty-codec netty-codec-http netty-codec-http2 netty-codec-socks netty-common
	netty-handler netty-handler-proxy netty-resolver netty-transport
)
PYTHON=/usr/bin/python3 # Debian's, which python3-grpcio is for (not a pyenv shim)

step() { echo "== clients: $* =="; }

deps() {
	local missing=()
	for p in "${DEBIAN_PACKAGES[@]}"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
	done
	if [ "${#missing[@]}" -gt 0 ]; then
		step "apt-get install ${missing[*]}"
		local sudo=()
		[ "$(id -u)" -eq 0 ] || sudo=(sudo)
		# Other engineers may run apt at the same time: wait for the lock.
		"${sudo[@]}" apt-get -o DPkg::Lock::Timeout=600 update -qq
		DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
			--no-install-recommends "${missing[@]}" >/dev/null
	fi
	# npm ci wipes node_modules; run it only when the lockfile changed.
	local lock stamp=clients/typescript/node_modules/.clusterd-lock-sha256
	lock="$(sha256sum clients/typescript/package-lock.json | cut -d' ' -f1)"
	if [ "$(cat "$stamp" 2>/dev/null)" != "$lock" ]; then
		step "npm ci (clients/typescript)"
		(cd clients/typescript && npm ci --no-audit --no-fund --loglevel=error)
		echo "$lock" >"$stamp"
	fi
}

build() {
	step "generate (buf, local plugins)"
	for lang in python java typescript; do
		buf generate --template "clients/$lang/buf.gen.yaml"
	done
	step "build"
	go build -o bin/client-go ./clients/go
	local cp="" jar
	for jar in "${JARS[@]}"; do
		[ -f "/usr/share/java/$jar.jar" ] || { echo "clients: /usr/share/java/$jar.jar is missing" >&2; exit 1; }
		cp="$cp${cp:+:}/usr/share/java/$jar.jar"
	done
	rm -rf clients/java/build && mkdir -p clients/java/build/classes
	find clients/java/gen clients/java/src -name '*.java' >clients/java/build/sources
	javac -nowarn -encoding UTF-8 -d clients/java/build/classes -cp "$cp" @clients/java/build/sources
	echo "clients/java/build/classes:$cp" >clients/java/build/classpath
	(cd clients/typescript && rm -rf dist && npx --no-install tsc -p tsconfig.json)
	"$PYTHON" -m py_compile clients/python/client.py
}

# run starts bin/clusterd on free ports and runs every client against it.
run() {
	local dir log pid addr
	dir="$(mktemp -d)"
	log="$dir/clusterd.log"
	step "start bin/clusterd"
	bin/clusterd --database "sqlite:$dir/clusterd.db" --grpc-addr 127.0.0.1:0 --http-addr 127.0.0.1:0 \
		--server-id clients-run 2>"$log" &
	pid=$!
	# shellcheck disable=SC2064
	trap "kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf '$dir'" EXIT
	for _ in $(seq 300); do
		addr="$(sed -n 's/.*msg="clusterd ready".* grpc=\([^ ]*\).*/\1/p' "$log")"
		[ -n "$addr" ] && break
		kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; echo "clients: bin/clusterd exited" >&2; exit 1; }
		sleep 0.1
	done
	[ -n "$addr" ] || { cat "$log" >&2; echo "clients: bin/clusterd not ready after 30s" >&2; exit 1; }
	echo "bin/clusterd serves gRPC on $addr"

	local cp passed=0 failed=0 lang start out
	cp="$(cat clients/java/build/classpath)"
	declare -A cmd=(
		[go]="bin/client-go -addr $addr"
		[java]="java -cp $cp dev.clusterd.example.Client --addr $addr"
		[typescript]="node clients/typescript/dist/src/client.js --addr $addr"
		[python]="$PYTHON clients/python/client.py --addr $addr"
	)
	for lang in go java typescript python; do
		step "run $lang"
		start=$(date +%s%N)
		if out="$(timeout 120 ${cmd[$lang]} 2>&1)" && grep -qx "client $lang: ok" <<<"$out"; then
			passed=$((passed + 1))
		else
			failed=$((failed + 1))
			echo "client $lang: FAILED" >&2
		fi
		echo "$out"
		echo "client $lang took $((($(date +%s%N) - start) / 1000000)) ms"
	done
	if [ "$failed" -ne 0 ]; then
		echo "--- bin/clusterd log ---" >&2
		tail -50 "$log" >&2
	fi
	echo "clients: $passed passed, $failed failed"
	[ "$failed" -eq 0 ]
}

case "${1:-all}" in
deps) deps ;;
build) deps && build ;;
all) deps && build && run ;;
*)
	echo "usage: $0 [deps|build|all]" >&2
	exit 2
	;;
esac
