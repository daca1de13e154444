// Package libvirttest removes what a test of the libvirt driver made on a
// shared libvirtd, through a connection of the test's own (not the driver
// under test), so every test leaves the daemon as it found it, even when it
// fails or the driver did not clean up.
package libvirttest

import (
	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/clusterd/clusterd/infra/libvirt"
)

// RemoveDomain destroys and undefines machineID's domain; gone is fine.
func RemoveDomain(raw *golibvirt.Libvirt, machineID string) {
	if dom, err := raw.DomainLookupByName(libvirt.DomainName(machineID)); err == nil {
		_ = raw.DomainDestroy(dom)
		_ = raw.DomainUndefineFlags(dom, 0)
	}
}

// RemovePool deletes every volume of the storage pool named pool, then
// stops and undefines the pool; gone is fine.
func RemovePool(raw *golibvirt.Libvirt, pool string) {
	p, err := raw.StoragePoolLookupByName(pool)
	if err != nil {
		return
	}
	vols, _, _ := raw.StoragePoolListAllVolumes(p, 1, 0)
	for _, v := range vols {
		_ = raw.StorageVolDelete(v, 0)
	}
	_ = raw.StoragePoolDestroy(p)
	_ = raw.StoragePoolUndefine(p)
}
