package server

import (
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/google/uuid"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/infra/libvirt"
	"github.com/clusterd/clusterd/repository/repotest"
)

// TestLibvirtClusterLifecycle: with --infra libvirt on libvirt's test
// driver, a cluster is created on domains (each joined at the cluster's
// version from its ISO, its rules in the cluster's network filter),
// stopped and started (the domains with it), upgraded (the new version's
// ISO, the agents report it), and deleted, leaving no domain, volume or
// filter of it.
func TestLibvirtClusterLifecycle(t *testing.T) {
	const uri = "test+unix:///default"
	u, _ := url.Parse(uri)
	raw, err := golibvirt.ConnectToURI(u)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("libvirtd does not answer on %s (make libvirt starts it): %v", uri, err)
		}
		t.Skipf("libvirtd does not answer on %s (make libvirt starts it): %v", uri, err)
	}
	t.Cleanup(func() { _ = raw.Disconnect() })
	pool := "clusterd-test-" + uuid.NewString()[:8]
	dir, err := os.MkdirTemp("", "lv-") // short: agent sockets live in it
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	h := start(t, repotest.Backends(t)[0], func(c *Config) {
		c.Infra = "libvirt"
		c.Libvirt = libvirt.Config{URI: uri, PoolDir: dir, Pool: pool}
	})
	var made []string
	t.Cleanup(func() {
		for _, id := range made {
			if dom, err := raw.DomainLookupByName(libvirt.DomainName(id)); err == nil {
				_ = raw.DomainDestroy(dom)
				_ = raw.DomainUndefineFlags(dom, 0)
			}
		}
		if p, err := raw.StoragePoolLookupByName(pool); err == nil {
			vols, _, _ := raw.StoragePoolListAllVolumes(p, 1, 0)
			for _, v := range vols {
				_ = raw.StorageVolDelete(v, 0)
			}
			_ = raw.StoragePoolDestroy(p)
			_ = raw.StoragePoolUndefine(p)
		}
	})
	ctx := tctx(t)
	drv := h.srv.libvirt
	began := time.Now()
	c := h.create(t, "lv", 1)
	t.Logf("create (1 control + 1 worker): %v", time.Since(began).Round(time.Millisecond))
	id := strings.TrimPrefix(c.GetName(), "clusters/")
	t.Cleanup(func() {
		if q, err := golibvirt.ConnectToURI(&url.URL{Scheme: "qemu", Path: "/system"}); err == nil {
			if f, err := q.NwfilterLookupByName(libvirt.FilterName(id)); err == nil {
				_ = q.NwfilterUndefine(f)
			}
			_ = q.Disconnect()
		}
	})
	ms, err := drv.Machines(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		made = append(made, m.ID)
	}
	if len(ms) != 2 {
		t.Fatalf("machines of the cluster: %+v; want a control and a worker", ms)
	}
	for _, m := range ms {
		if !m.Joined || m.KubernetesVersion != "1.30.2" || m.Power != infra.PowerRunning {
			t.Errorf("machine after create: %+v", m)
		}
	}
	if rules, err := drv.Rules(ctx, id); err != nil || len(rules) == 0 {
		t.Errorf("the cluster's rules: %+v, %v; want its filter's", rules, err)
	}

	run := func(name string, op *longrunningpb.Operation, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if done := h.wait(t, op); done.GetError() != nil {
			t.Fatalf("%s failed: %v", name, done.GetError())
		}
		t.Logf("%s: %v", name, time.Since(began).Round(time.Millisecond))
	}
	began = time.Now()
	op, err := h.clients.clusters.StopCluster(ctx, &clv1.StopClusterRequest{Name: c.GetName()})
	run("stop", op, err)
	for _, m := range made {
		if st := domainState(t, raw, m); st != golibvirt.DomainShutoff {
			t.Errorf("domain of machine %s after stop: state %d; want shut off", m, st)
		}
	}
	began = time.Now()
	op, err = h.clients.clusters.StartCluster(ctx, &clv1.StartClusterRequest{Name: c.GetName()})
	run("start", op, err)
	for _, m := range made {
		if st := domainState(t, raw, m); st != golibvirt.DomainRunning {
			t.Errorf("domain of machine %s after start: state %d; want running", m, st)
		}
	}
	began = time.Now()
	op, err = h.clients.clusters.UpgradeCluster(ctx, &clv1.UpgradeClusterRequest{Name: c.GetName(), KubernetesVersion: "1.30.5"})
	run("upgrade", op, err)
	if ms, err = drv.Machines(ctx, id); err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.KubernetesVersion != "1.30.5" || !m.Joined || m.Cordoned {
			t.Errorf("machine after upgrade: %+v", m)
		}
	}

	began = time.Now()
	op, err = h.clients.clusters.DeleteCluster(ctx, &clv1.DeleteClusterRequest{Name: c.GetName()})
	run("delete", op, err)
	for _, m := range made {
		if _, err := raw.DomainLookupByName(libvirt.DomainName(m)); !golibvirt.IsNotFound(err) {
			t.Errorf("domain of machine %s after delete: %v; want none", m, err)
		}
	}
	if p, err := raw.StoragePoolLookupByName(pool); err == nil {
		if vols, _, _ := raw.StoragePoolListAllVolumes(p, 1, 0); len(vols) != 0 {
			t.Errorf("%d volumes left after delete", len(vols))
		}
	}
	if rules, err := drv.Rules(ctx, id); err != nil || len(rules) != 0 {
		t.Errorf("rules after delete: %+v, %v; want the filter gone", rules, err)
	}
}

func domainState(t *testing.T, raw *golibvirt.Libvirt, id string) golibvirt.DomainState {
	t.Helper()
	dom, err := raw.DomainLookupByName(libvirt.DomainName(id))
	if err != nil {
		t.Fatalf("domain of machine %s: %v", id, err)
	}
	st, _, err := raw.DomainGetState(dom, 0)
	if err != nil {
		t.Fatal(err)
	}
	return golibvirt.DomainState(st)
}
