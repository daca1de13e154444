package server

import (
	"bytes"
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
	h, raw, pool, made := startLibvirt(t)
	ctx := tctx(t)
	drv := h.srv.libvirt
	began := time.Now()
	c := h.create(t, "lv", 1)
	t.Logf("create (1 control + 1 worker): %v", time.Since(began).Round(time.Millisecond))
	id := strings.TrimPrefix(c.GetName(), "clusters/")
	removeFilter(t, id)
	ms, err := drv.Machines(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		*made = append(*made, m.ID)
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
	for _, m := range *made {
		if st := domainState(t, raw, m); st != golibvirt.DomainShutoff {
			t.Errorf("domain of machine %s after stop: state %d; want shut off", m, st)
		}
	}
	began = time.Now()
	op, err = h.clients.clusters.StartCluster(ctx, &clv1.StartClusterRequest{Name: c.GetName()})
	run("start", op, err)
	for _, m := range *made {
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
	for _, m := range *made {
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

// startLibvirt starts a server with --infra libvirt on libvirt's test
// driver (skipping the test when libvirtd does not answer, failing it
// under CI) in a storage pool of its own. It returns the server, a raw
// connection for checks, the pool, and the list of machines the test made,
// which the clean-up removes with the pool, whatever the test left.
func startLibvirt(t *testing.T, mutate ...func(*Config)) (*harness, *golibvirt.Libvirt, string, *[]string) {
	t.Helper()
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
	made := new([]string)
	t.Cleanup(func() {
		for _, id := range *made {
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
	h := start(t, repotest.Backends(t)[0], append([]func(*Config){func(c *Config) {
		c.Infra = "libvirt"
		c.Libvirt = libvirt.Config{URI: uri, PoolDir: dir, Pool: pool}
	}}, mutate...)...)
	return h, raw, pool, made
}

// removeFilter undefines cluster id's network filter when the test ends.
func removeFilter(t *testing.T, id string) {
	t.Cleanup(func() {
		if q, err := golibvirt.ConnectToURI(&url.URL{Scheme: "qemu", Path: "/system"}); err == nil {
			if f, err := q.NwfilterLookupByName(libvirt.FilterName(id)); err == nil {
				_ = q.NwfilterUndefine(f)
			}
			_ = q.Disconnect()
		}
	})
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

// TestLibvirtOutOfBandPowerAlertsAndRecovers: a domain of a RUNNING
// cluster destroyed behind clusterd's back takes the cluster to ALERT on
// libvirt's event alone (the reconcile interval is an hour: no sweep
// runs), and started again, reconciliation brings the cluster back to
// RUNNING.
func TestLibvirtOutOfBandPowerAlertsAndRecovers(t *testing.T) {
	var logs logBuffer
	h, _, _, made := startLibvirt(t, withJSONLog(&logs), func(c *Config) {
		c.ScanInterval, c.ReconcileInterval = 100*time.Millisecond, time.Hour
	})
	ctx := tctx(t)
	drv := h.srv.libvirt
	c := h.create(t, "lv", 1)
	id := strings.TrimPrefix(c.GetName(), "clusters/")
	removeFilter(t, id)
	ms, err := drv.Machines(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		*made = append(*made, m.ID)
	}
	if len(ms) != 2 {
		t.Fatalf("machines of the cluster: %+v; want a control and a worker", ms)
	}
	// Only a change made once the subscription is in place is reported.
	waitLog(t, &logs, libvirt.WatchingMessage)
	worker := ms[0]
	if worker.Role != infra.RoleWorker {
		worker = ms[1]
	}
	if _, err := drv.SetMachinePower(ctx, worker.ID, infra.PowerStopped); err != nil {
		t.Fatal(err)
	}
	h.waitState(t, c.GetName(), clv1.Cluster_ALERT)
	if _, err := drv.SetMachinePower(ctx, worker.ID, infra.PowerRunning); err != nil {
		t.Fatal(err)
	}
	h.waitState(t, c.GetName(), clv1.Cluster_RUNNING)
	op, err := h.clients.clusters.DeleteCluster(ctx, &clv1.DeleteClusterRequest{Name: c.GetName()})
	if err != nil {
		t.Fatal(err)
	}
	if done := h.wait(t, op); done.GetError() != nil {
		t.Fatalf("delete failed: %v", done.GetError())
	}
}

// waitLog waits for a log line whose message is msg.
func waitLog(t *testing.T, logs *logBuffer, msg string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		logs.mu.Lock()
		seen := bytes.Contains(logs.buf.Bytes(), []byte(`"msg":"`+msg+`"`))
		logs.mu.Unlock()
		if seen {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no log line %q", msg)
}
