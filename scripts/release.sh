#!/usr/bin/env bash
# release.sh version | previous | tag
#   version   the build's version: git describe against the release tags,
#             or, in a clone without tags, the same form computed from
#             CHANGELOG.md's "## vX.Y.Z (date, commit SHA)" lines.
#   previous  the commit of the newest release that HEAD contains and is
#             not HEAD itself: what make lint's buf breaking and
#             TestRollingUpgrade compare against. Exit 1 when there is none
#             (a shallow clone, or no release yet).
#   tag       make the missing tags vX.Y.Z of CHANGELOG.md's releases.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# releases prints "version commit" for each release of CHANGELOG.md, newest first.
releases() {
	sed -n 's/^## \(v[0-9][0-9.]*\) ([^,]*, commit \([0-9a-f]\{40\}\))$/\1 \2/p' CHANGELOG.md
}

case "${1:-}" in
version)
	if v="$(git describe --tags --match 'v[0-9]*' --dirty 2>/dev/null)"; then
		echo "$v"
		exit 0
	fi
	dirty=""
	git diff --quiet HEAD 2>/dev/null || dirty="-dirty"
	while read -r version commit; do
		if git merge-base --is-ancestor "$commit" HEAD 2>/dev/null; then
			n="$(git rev-list --count "$commit..HEAD")"
			if [ "$n" = 0 ]; then
				echo "$version$dirty"
			else
				echo "$version-$n-g$(git rev-parse --short HEAD)$dirty"
			fi
			exit 0
		fi
	done < <(releases)
	echo "$(git rev-parse --short HEAD 2>/dev/null || echo devel)$dirty"
	;;
previous)
	head="$(git rev-parse HEAD)"
	while read -r version commit; do
		if [ "$commit" != "$head" ] && git merge-base --is-ancestor "$commit" HEAD 2>/dev/null; then
			echo "$commit"
			exit 0
		fi
	done < <(releases)
	echo "release.sh: no release of CHANGELOG.md is in this clone's history (shallow clone?)" >&2
	exit 1
	;;
tag)
	while read -r version commit; do
		if ! git rev-parse -q --verify "refs/tags/$version" >/dev/null; then
			git tag -a "$version" "$commit" -m "clusterd $version"
			echo "tagged $version at $commit"
		fi
	done < <(releases)
	;;
*)
	echo "usage: $0 version|previous|tag" >&2
	exit 2
	;;
esac
