package libvirt_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/google/uuid"

	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/infra/libvirt"
	"github.com/clusterd/clusterd/infra/libvirt/libvirttest"
)

// TestQEMUMachine boots one real VM (QEMU, TCG) on qemu:///system from the
// node image (make node-image's build/node-image, or the kernel and
// initramfs named by CLUSTERD_TEST_NODE_KERNEL and CLUSTERD_TEST_NODE_INITRD;
// skipped without one) and drives every step of one machine through it:
// its node agent answers over the virtio-serial channel once it has
// booted, installs each version from the ISO swapped into the running
// guest's cdrom, and finds its state on its disk after a reboot; power_off
// is a graceful shutdown the guest answers (the ACPI power button, which
// its agent handles), not the destroy that follows an unanswered one.
func TestQEMUMachine(t *testing.T) {
	kernel, initrd := os.Getenv("CLUSTERD_TEST_NODE_KERNEL"), os.Getenv("CLUSTERD_TEST_NODE_INITRD")
	if kernel == "" && initrd == "" {
		kernel, initrd = "../../build/node-image/vmlinuz", "../../build/node-image/initrd.img"
	}
	for _, f := range []*string{&kernel, &initrd} {
		abs, err := filepath.Abs(*f)
		if _, serr := os.Stat(abs); err != nil || serr != nil {
			t.Skipf("no node image at %s (make node-image, or CLUSTERD_TEST_NODE_KERNEL and CLUSTERD_TEST_NODE_INITRD)", *f)
		}
		*f = abs
	}
	const uri = "qemu:///system"
	raw := dial(t, uri)
	// QEMU runs as another user: the pool folder must be reachable by it.
	dir, err := os.MkdirTemp("/var/tmp", "clusterd-qemu-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	pool := "clusterd-test-" + uuid.NewString()[:8]
	ctx := ctxT(t)
	d, err := libvirt.New(ctx, libvirt.Config{URI: uri, PoolDir: dir, Pool: pool, Kernel: kernel, Initrd: initrd,
		Guard: openGuard{}, ShutdownTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	id := uuid.NewString()
	t.Cleanup(func() {
		libvirttest.RemoveDomain(raw, id)
		libvirttest.RemovePool(raw, pool)
		_ = d.Close()
	})
	c := infra.Call{ClusterID: uuid.NewString(), Operation: uuid.NewString(), Attempt: 1, MachineID: id}
	timed := func(name string, step func() error) {
		t.Helper()
		start := time.Now()
		if err := step(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		t.Logf("%-16s %v", name, time.Since(start).Round(time.Millisecond))
	}
	live := func() string {
		dom, err := raw.DomainLookupByName(libvirt.DomainName(id))
		if err != nil {
			t.Fatal(err)
		}
		x, err := raw.DomainGetXMLDesc(dom, 0)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	// waitAgent waits for the guest's agent to answer (it boots in about
	// 7 s here under TCG).
	waitAgent := func() error {
		var err error
		for deadline := time.Now().Add(3 * time.Minute); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
			if _, err = d.WaitAPI(ctx, c); err == nil {
				return nil
			}
		}
		return err
	}
	timed("provision", func() error {
		_, err := d.ProvisionMachine(ctx, c, id, infra.RoleControl, "small", "1.30.2")
		return err
	})
	if _, err := os.Stat(libvirt.AgentSocket(dir, id)); err != nil {
		t.Errorf("the agent channel's socket: %v", err)
	}
	timed("attach_iso", func() error { return d.AttachISO(ctx, c, "kubernetes-1.30.2.iso") })
	if x := live(); !strings.Contains(x, "kubernetes-1.30.2.iso") {
		t.Errorf("the running guest's cdrom has no ISO:\n%s", x)
	}
	timed("wait_api (boot)", waitAgent)
	timed("join_node", func() error { return d.JoinNode(ctx, c, "1.30.2", infra.NodeCredentials{}) })
	timed("fetch_kubeconfig", func() error { return d.FetchKubeconfig(ctx, c) })
	timed("deploy_provider", func() error { return d.DeployProvider(ctx, c) })
	timed("drain_node", func() error { return d.DrainNode(ctx, c) })
	timed("attach_iso", func() error { return d.AttachISO(ctx, c, "kubernetes-1.31.1.iso") })
	timed("upgrade_node", func() error { return d.UpgradeNode(ctx, c, "1.31.1") })
	if m, err := d.Machine(ctx, id); err != nil || m.KubernetesVersion != "1.31.1" || !m.Joined || m.Cordoned {
		t.Fatalf("after upgrade_node: %+v, %v; want joined at 1.31.1, uncordoned", m, err)
	}
	timed("detach_iso", func() error { return d.DetachISO(ctx, c) })
	if x := live(); strings.Contains(x, ".iso") {
		t.Errorf("the running guest's cdrom still has an ISO")
	}
	timed("resize_machine", func() error { return d.ResizeMachine(ctx, c, "large") })
	timed("power_off", func() error { return d.PowerOff(ctx, c) })
	if m, err := d.Machine(ctx, id); err != nil || m.Power != infra.PowerStopped {
		t.Fatalf("after power_off: %+v, %v", m, err)
	}
	if dom, err := raw.DomainLookupByName(libvirt.DomainName(id)); err != nil {
		t.Fatal(err)
	} else if st, reason, err := raw.DomainGetState(dom, 0); err != nil || golibvirt.DomainState(st) != golibvirt.DomainShutoff || golibvirt.DomainShutoffReason(reason) != golibvirt.DomainShutoffShutdown {
		t.Errorf("after power_off: state %d reason %d, %v; want shut off by the guest (reason %d), not destroyed (%d)",
			st, reason, err, golibvirt.DomainShutoffShutdown, golibvirt.DomainShutoffDestroyed)
	}
	timed("power_on", func() error { return d.PowerOn(ctx, c) })
	if x := live(); !strings.Contains(x, "<memory unit='KiB'>262144</memory>") {
		t.Errorf("the resize was not applied at the boot after it")
	}
	timed("wait_api (reboot)", waitAgent)
	// The agent kept its state on the machine's disk: joined at 1.31.1, so
	// joining at it again needs no ISO.
	timed("join_node (again)", func() error { return d.JoinNode(ctx, c, "1.31.1", infra.NodeCredentials{}) })
	timed("delete_node", func() error { return d.DeleteNode(ctx, c) })
	timed("destroy_machine", func() error { return d.DestroyMachine(ctx, c) })
	if _, err := raw.DomainLookupByName(libvirt.DomainName(id)); !golibvirt.IsNotFound(err) {
		t.Errorf("domain after destroy: %v", err)
	}
	if _, err := d.Machine(ctx, id); !errors.Is(err, infra.ErrNotFound) {
		t.Errorf("machine after destroy: %v", err)
	}
}
