#!/usr/bin/env bash
# Installs and starts libvirt for clusterd's libvirt driver and its tests,
# without systemd. Idempotent: each command does only what is missing.
#
#   libvirt.sh install  apt-get install libvirt, QEMU, qemu-img and xorriso if missing
#   libvirt.sh start    start virtlogd and libvirtd when libvirtd does not answer;
#                       libvirt's `default` network never autostarts and is left inactive
#                       (no virbr0: tests talk only to loopback and unix sockets)
#   libvirt.sh check    succeed when libvirtd answers on qemu:///system and test+unix:///default
#
# With no argument: install, start, check.
set -euo pipefail

sudo=()
[ "$(id -u)" -eq 0 ] || sudo=(sudo)

install() {
	local missing=()
	command -v libvirtd >/dev/null || missing+=(libvirt-daemon-system)
	command -v virsh >/dev/null || missing+=(libvirt-clients)
	command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
	command -v qemu-img >/dev/null || missing+=(qemu-utils)
	command -v xorriso >/dev/null || missing+=(xorriso)
	[ ${#missing[@]} -eq 0 ] && return 0
	echo "libvirt: apt-get install ${missing[*]}" >&2
	# Other engineers may run apt at the same time: wait for the lock.
	"${sudo[@]}" apt-get -o DPkg::Lock::Timeout=600 update -qq
	# Without systemd the packages' services are not started; start does it.
	DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 "${sudo[@]}" apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
		--no-install-recommends "${missing[@]}" >/dev/null
}

answers() {
	"${sudo[@]}" virsh -c qemu:///system uri >/dev/null 2>&1
}

start() {
	# The default network would create virbr0 with a host address: never
	# autostart it.
	"${sudo[@]}" rm -f /etc/libvirt/qemu/networks/autostart/default.xml
	# Without udev, /dev/kvm may be root's alone (0600). libvirt then finds
	# its cached QEMU capabilities invalid at every look-up ("KVM was enabled
	# when probing, but it is not available now": QEMU runs as
	# libvirt-qemu) and probes QEMU again each time, so one domain
	# definition took a minute here. Give it Debian's udev permissions
	# (group kvm, 0660); clusterd's domains are type qemu (TCG) all the same.
	if [ -c /dev/kvm ] && getent group kvm >/dev/null && [ "$(stat -c %G:%a /dev/kvm)" != kvm:660 ]; then
		"${sudo[@]}" chgrp kvm /dev/kvm && "${sudo[@]}" chmod 0660 /dev/kvm
	fi
	if ! answers; then
		pgrep -x virtlogd >/dev/null || "${sudo[@]}" virtlogd -d
		pgrep -x libvirtd >/dev/null || "${sudo[@]}" libvirtd -d
		for _ in $(seq 1 100); do
			answers && break
			sleep 0.2
		done
	fi
	if "${sudo[@]}" virsh -c qemu:///system net-list --name 2>/dev/null | grep -qx default; then
		"${sudo[@]}" virsh -c qemu:///system net-destroy default >/dev/null
	fi
	"${sudo[@]}" virsh -c qemu:///system net-autostart default --disable >/dev/null 2>&1 || true
}

check() {
	answers || { echo "libvirt: libvirtd does not answer on qemu:///system" >&2; return 1; }
	"${sudo[@]}" virsh -c test+unix:///default list --all >/dev/null ||
		{ echo "libvirt: the test driver does not answer on test+unix:///default" >&2; return 1; }
	if "${sudo[@]}" virsh -c qemu:///system net-list --name | grep -qx default; then
		echo "libvirt: the default network is active" >&2
		return 1
	fi
	echo "libvirt: libvirtd $("${sudo[@]}" libvirtd --version | awk '{print $NF}') answers on qemu:///system and test+unix:///default"
}

case "${1:-all}" in
install) install ;;
start) start ;;
check) check ;;
all) install && start && check ;;
*) echo "usage: $0 [install|start|check]" >&2; exit 2 ;;
esac
