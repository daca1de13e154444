#!/usr/bin/env bash
# Builds the node image clusterd's libvirt machines boot directly (no disk
# image, no bootloader): Debian's cloud kernel and an initramfs holding
# busybox, the kernel modules for virtio (PCI, serial port, disk, SCSI), the
# cdrom and the ACPI power button, and the node agent (cmd/clusterd-agent),
# which /init runs and which powers the machine off on the power button.
# The kernel has no AHCI driver: the cdrom goes on virtio-scsi (any machine
# type) or on IDE (i440fx's PIIX), not on q35's SATA.
#
#   scripts/node-image.sh [OUT]      (default OUT: build/node-image)
#
# Writes OUT/vmlinuz and OUT/initrd.img, world-readable (libvirt may run
# qemu as another user). Idempotent: the Debian packages are downloaded
# once into OUT/cache (apt-get download and dpkg-deb -x: nothing is
# installed), and an output is replaced only when its content changes. Needs
# go, apt-get, dpkg-deb, cpio, gzip and depmod (kmod); installs cpio and
# kmod when missing. KERNEL_PACKAGE picks another kernel package.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-build/node-image}"
mkdir -p "$out/cache"
out="$(cd "$out" && pwd)"

need=()
command -v cpio >/dev/null || need+=(cpio)
command -v depmod >/dev/null || [ -x /usr/sbin/depmod ] || [ -x /sbin/depmod ] || need+=(kmod)
if [ ${#need[@]} -gt 0 ]; then
	echo "node-image: apt-get install ${need[*]}" >&2
	sudo=()
	[ "$(id -u)" -eq 0 ] || sudo=(sudo)
	"${sudo[@]}" apt-get -o DPkg::Lock::Timeout=600 update -qq
	DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
		--no-install-recommends "${need[@]}" >/dev/null
fi
export PATH="$PATH:/usr/sbin:/sbin"

# The kernel: the versioned package linux-image-cloud-amd64 depends on.
kernel_pkg="${KERNEL_PACKAGE:-}"
resolve_kernel() {
	apt-cache depends linux-image-cloud-amd64 2>/dev/null |
		awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { print $2; exit }'
}
if [ -z "$kernel_pkg" ]; then
	# A package already downloaded is used again (no apt index needed).
	cached="$(ls "$out/cache" | sed -n 's/^\(linux-image-[0-9][^_]*-cloud-amd64\)_.*\.deb$/\1/p' | sort -V | tail -n1)"
	kernel_pkg="${cached:-$(resolve_kernel)}"
fi
if [ -z "$kernel_pkg" ]; then
	apt-get -o DPkg::Lock::Timeout=600 update -qq 2>/dev/null || sudo apt-get -o DPkg::Lock::Timeout=600 update -qq
	kernel_pkg="$(resolve_kernel)"
fi
[ -n "$kernel_pkg" ] || { echo "node-image: cannot resolve linux-image-cloud-amd64's kernel package" >&2; exit 1; }

fetch() { # fetch PACKAGE: prints the path of its .deb in the cache
	local deb
	deb="$(ls "$out/cache/$1"_*.deb 2>/dev/null | head -n1 || true)"
	if [ -z "$deb" ]; then
		(cd "$out/cache" && apt-get download -qq "$1" 2>&1 | grep -v '^W: Download is performed unsandboxed' >&2 || true)
		deb="$(ls "$out/cache/$1"_*.deb 2>/dev/null | head -n1 || true)"
		[ -n "$deb" ] || { echo "node-image: apt-get download $1 failed" >&2; exit 1; }
	fi
	echo "$deb"
}
kernel_deb="$(fetch "$kernel_pkg")"
busybox_deb="$(fetch busybox-static)"

work="$(mktemp -d "$out/.work.XXXXXX")"
trap 'rm -rf "$work"' EXIT
dpkg-deb -x "$kernel_deb" "$work/kernel"
dpkg-deb -x "$busybox_deb" "$work/busybox"
kver="$(ls "$work/kernel/lib/modules")"

root="$work/root"
mkdir -p "$root"/{bin,dev,proc,sys,tmp,lib/modules/"$kver"}
cp "$work/busybox/bin/busybox" "$root/bin/busybox"
CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o "$root/bin/clusterd-agent" ./cmd/clusterd-agent

# The modules /init loads and everything they depend on (modules.dep of
# the whole kernel; the package ships none, depmod writes it). button and
# evdev give the agent the ACPI power button (libvirt's graceful shutdown).
modules=(virtio_pci virtio_console virtio_blk virtio_scsi ata_piix sr_mod button evdev)
kmods="$work/kernel/lib/modules/$kver"
depmod -b "$work/kernel" "$kver"
declare -A files=()
for m in "${modules[@]}"; do
	line="$(grep -E "(^|/)${m}\.ko(\.[a-z]+)?:" "$kmods/modules.dep")" ||
		{ echo "node-image: module $m is not in $kernel_pkg" >&2; exit 1; }
	for f in ${line/:/}; do files[$f]=1; done
done
for f in "${!files[@]}"; do
	mkdir -p "$root/lib/modules/$kver/$(dirname "$f")"
	cp "$kmods/$f" "$root/lib/modules/$kver/$f"
done
cp "$kmods"/modules.{order,builtin,builtin.modinfo} "$root/lib/modules/$kver/"
depmod -b "$root" "$kver"

cat >"$root/init" <<EOF
#!/bin/busybox sh
# The node image's init: mount the kernel's filesystems, load the virtio and
# cdrom drivers, and become the node agent.
/bin/busybox mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t sysfs sysfs /sys
/bin/busybox --install -s /bin
# The host swaps the version's ISO while the guest runs: the kernel must
# neither lock the tray while the agent reads the cdrom nor close it when the
# agent opens the device (QEMU then refuses the swap: "Tray ... is not open").
# The cdrom module takes both as parameters before sr_mod registers the
# drive (virtio-scsi scans asynchronously); the sysctls say the same again.
modprobe cdrom autoclose=0 lockdoor=0 || echo "init: modprobe cdrom failed"
for m in ${modules[*]}; do
	modprobe "\$m" || echo "init: modprobe \$m failed"
done
echo 0 >/proc/sys/dev/cdrom/lock || echo "init: cdrom lock not set"
echo 0 >/proc/sys/dev/cdrom/autoclose || echo "init: cdrom autoclose not set"
echo "init: modules loaded; starting clusterd-agent"
exec /bin/clusterd-agent
EOF
chmod 755 "$root/init"

# newc cpio with fixed owners and times, gzip without a name or time: the
# same inputs give the same bytes.
find "$root" -exec touch -h -d @0 {} +
(cd "$root" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --reproducible --quiet) |
	gzip -9n >"$work/initrd.img"
cp "$work/kernel/boot/vmlinuz-$kver" "$work/vmlinuz"

for f in vmlinuz initrd.img; do
	chmod 644 "$work/$f"
	if ! cmp -s "$work/$f" "$out/$f"; then
		mv "$work/$f" "$out/$f"
		echo "node-image: wrote $out/$f ($kernel_pkg)"
	fi
done
chmod 755 "$out"
