package libvirt

import (
	"strings"
	"testing"

	"libvirt.org/go/libvirtxml"
)

// A machine's domain boots its kernel with the serial console its console
// log reads, the id its node agent reads, and without the boot-time timer
// check that panics a starved TCG guest (no_timer_check).
func TestDomainKernelCmdline(t *testing.T) {
	d := &Driver{kernel: "/img/vmlinuz", initrd: "/img/initrd.img"}
	x, err := d.domainXML(meta{ID: "6673255d-bbb7", Cluster: "c1", Role: "worker"}, Offering{CPUs: 1, MemoryMiB: 256}, "/pool/vol")
	if err != nil {
		t.Fatal(err)
	}
	var dom libvirtxml.Domain
	if err := dom.Unmarshal(x); err != nil {
		t.Fatal(err)
	}
	args := strings.Fields(dom.OS.Cmdline)
	for _, want := range []string{"console=ttyS0", "no_timer_check", "clusterd.machine=6673255d-bbb7"} {
		if !strings.Contains(" "+strings.Join(args, " ")+" ", " "+want+" ") {
			t.Errorf("kernel command line %q lacks %s", dom.OS.Cmdline, want)
		}
	}
}
