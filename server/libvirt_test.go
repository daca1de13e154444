package server

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/google/uuid"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/infra/libvirt"
	"github.com/clusterd/clusterd/infra/libvirt/libvirttest"
	"github.com/clusterd/clusterd/repository"
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
	ms := trackMachines(t, drv, id, made)
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
			libvirttest.RemoveDomain(raw, id)
		}
		libvirttest.RemovePool(raw, pool)
	})
	h := start(t, repotest.Backends(t)[0], append([]func(*Config){func(c *Config) {
		c.Infra = "libvirt"
		c.Libvirt = libvirt.Config{URI: uri, PoolDir: dir, Pool: pool}
	}}, mutate...)...)
	return h, raw, pool, made
}

// removeFilter undefines cluster id's network filter when the test ends.
// trackMachines lists cluster id's machines, adds them to made (removed
// when the test ends) and has the cluster's network filter removed too.
func trackMachines(t *testing.T, drv *libvirt.Driver, id string, made *[]string) []infra.Machine {
	t.Helper()
	removeFilter(t, id)
	ms, err := drv.Machines(tctx(t), id)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		*made = append(*made, m.ID)
	}
	return ms
}

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
	ms := trackMachines(t, drv, id, made)
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
		if strings.Contains(logs.String(), `"msg":"`+msg+`"`) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no log line %q", msg)
}

// openGuard lets every change through: the window between a guard's
// check and the change, stretched over a whole call.
type openGuard struct{}

func (openGuard) CheckHolder(context.Context, repository.Fence) error { return nil }

// TestLibvirtOrphanMachinesAreRemoved: a domain of a destroyed cluster
// (made by a call that outlived its job) and one of a cluster the
// database does not know are removed once older than the grace, the first
// recorded in its cluster's history; the machines of a live cluster stay.
func TestLibvirtOrphanMachinesAreRemoved(t *testing.T) {
	h, raw, pool, made := startLibvirt(t, func(c *Config) {
		c.ScanInterval, c.ReconcileInterval, c.OrphanMachineGrace = 100*time.Millisecond, time.Hour, 500*time.Millisecond
	})
	ctx := tctx(t)
	drv := h.srv.libvirt
	live := h.create(t, "live", 1)
	liveID := strings.TrimPrefix(live.GetName(), "clusters/")
	liveMachines := trackMachines(t, drv, liveID, made)
	gone := h.create(t, "gone", 1)
	goneID := strings.TrimPrefix(gone.GetName(), "clusters/")
	removeFilter(t, goneID)
	op, err := h.clients.clusters.DeleteCluster(ctx, &clv1.DeleteClusterRequest{Name: gone.GetName()})
	if err != nil {
		t.Fatal(err)
	}
	if done := h.wait(t, op); done.GetError() != nil {
		t.Fatalf("delete failed: %v", done.GetError())
	}

	// Late calls, through a driver on the same pool whose guard let them
	// through: a worker of the destroyed cluster, and one of a cluster
	// the database never had.
	late, err := libvirt.New(ctx, libvirt.Config{URI: "test+unix:///default", PoolDir: h.srv.cfg.Libvirt.PoolDir, Pool: pool, Guard: openGuard{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = late.Close() })
	unknownID := uuid.NewString()
	removeFilter(t, unknownID)
	orphans := map[string]string{uuid.NewString(): goneID, uuid.NewString(): unknownID}
	for id, cluster := range orphans {
		*made = append(*made, id)
		if _, err := late.ProvisionMachine(ctx, infra.Call{ClusterID: cluster, Operation: "late", Attempt: 1}, id, infra.RoleWorker, "small", "1.30.2"); err != nil {
			t.Fatalf("provision a late machine of cluster %s: %v", cluster, err)
		}
	}
	// A machine of another deployment sharing the libvirtd, in a pool of
	// its own: its cluster is unknown here too, and it is not this
	// server's to judge.
	otherPool := "clusterd-test-" + uuid.NewString()[:8]
	otherDir, err := os.MkdirTemp("", "lv-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(otherDir) })
	other, err := libvirt.New(ctx, libvirt.Config{URI: "test+unix:///default", PoolDir: otherDir, Pool: otherPool, Guard: openGuard{}})
	if err != nil {
		t.Fatal(err)
	}
	othersID, othersCluster := uuid.NewString(), uuid.NewString()
	removeFilter(t, othersCluster)
	t.Cleanup(func() {
		libvirttest.RemoveDomain(raw, othersID)
		libvirttest.RemovePool(raw, otherPool)
		_ = other.Close()
	})
	if _, err := other.ProvisionMachine(ctx, infra.Call{ClusterID: othersCluster, Operation: "other", Attempt: 1}, othersID, infra.RoleWorker, "small", "1.30.2"); err != nil {
		t.Fatalf("provision a machine in another pool: %v", err)
	}

	deadline := time.Now().Add(time.Minute)
	for id := range orphans {
		for {
			_, err := raw.DomainLookupByName(libvirt.DomainName(id))
			if golibvirt.IsNotFound(err) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("orphan machine %s of cluster %s is still there: %v", id, orphans[id], err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if p, err := raw.StoragePoolLookupByName(pool); err != nil {
		t.Fatal(err)
	} else {
		// The volume goes after the domain (destroy, undefine, then the
		// volume): wait for it too.
		for id := range orphans {
			for {
				_, err := raw.StorageVolLookupByName(p, libvirt.DomainName(id)+".img")
				if err != nil {
					break
				}
				if time.Now().After(deadline) {
					t.Errorf("the volume of orphan machine %s is left", id)
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	// The scanner records the removal after the machine is gone: wait for
	// the entry too.
	var recorded []string
	for {
		recorded = recorded[:0]
		for _, e := range fxHistory(t, h, gone.GetName()) {
			if e.GetEvent() == repository.OrphanMachineRemoved {
				recorded = append(recorded, e.GetMessage())
				if e.GetFromState() != clv1.Cluster_DESTROYED || e.GetToState() != clv1.Cluster_DESTROYED {
					t.Errorf("the removal's history entry moves the cluster: %v -> %v", e.GetFromState(), e.GetToState())
				}
			}
		}
		if len(recorded) > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(recorded) != 1 {
		t.Errorf("history of the destroyed cluster: %d %s entries %q; want 1", len(recorded), repository.OrphanMachineRemoved, recorded)
	}
	for _, m := range liveMachines {
		if _, err := drv.Machine(ctx, m.ID); err != nil {
			t.Errorf("machine %s of the live cluster: %v; want it kept", m.ID, err)
		}
	}
	if _, err := drv.Machine(ctx, othersID); err != nil {
		t.Errorf("machine %s in another pool: %v; want it kept", othersID, err)
	}
	if c, err := h.clients.clusters.GetCluster(ctx, &clv1.GetClusterRequest{Name: live.GetName()}); err != nil || c.GetState() != clv1.Cluster_RUNNING {
		t.Errorf("the live cluster: %v, %v; want RUNNING", c.GetState(), err)
	}
}

// TestWatchBackoff: subscribing again to libvirt's events after failures
// in a row waits longer each time, up to a bound.
func TestWatchBackoff(t *testing.T) {
	want := []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second}
	for i, w := range want {
		if got := watchBackoff(i + 1); got != w {
			t.Errorf("watchBackoff(%d) = %v; want %v", i+1, got, w)
		}
	}
	if got := watchBackoff(1000); got != watchBackoffMax {
		t.Errorf("watchBackoff(1000) = %v; want %v", got, watchBackoffMax)
	}
}

// TestLibvirtTwoServersAddOneFreeMachineOnce: two servers sharing one
// database and one libvirtd each run an AddNodes of the same free machine
// into a cluster of their own, round after round. Exactly one operation
// gets past validate_node each round, the other fails there, and the
// machine is never the loser's in libvirt; the winner's succeeds, the
// machine joined to its cluster at the cluster's version.
func TestLibvirtTwoServersAddOneFreeMachineOnce(t *testing.T) {
	const rounds = 3
	var shared Config
	h1, _, _, made := startLibvirt(t, func(c *Config) { c.ServerID = "s1"; shared = *c })
	h2 := startOn(t, shared.Database, func(c *Config) {
		c.ServerID, c.Infra, c.Libvirt = "s2", "libvirt", shared.Libvirt
	})
	servers := []*harness{h1, h2}
	ctx := tctx(t)
	drv := h1.srv.libvirt
	twoWinners := 0
	for round := range rounds {
		clusters := make([]string, 2)
		for i, h := range servers {
			c := h.create(t, fmt.Sprintf("r%d-%d", round, i), 1)
			clusters[i] = c.GetName()
			trackMachines(t, drv, strings.TrimPrefix(c.GetName(), "clusters/"), made)
		}
		free, err := drv.CreateMachine(ctx, infra.RoleExternal)
		if err != nil {
			t.Fatal(err)
		}
		*made = append(*made, free.ID)
		ops := make([]*longrunningpb.Operation, 2)
		errs := make([]error, 2)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i, h := range servers {
			wg.Go(func() {
				<-start
				ops[i], errs[i] = h.clients.clusters.AddNodes(ctx, &clv1.AddNodesRequest{Name: clusters[i], Machines: []string{"machines/" + free.ID}})
			})
		}
		close(start)
		wg.Wait()
		var won []string
		for i, h := range servers {
			if errs[i] != nil {
				t.Fatalf("round %d: AddNodes through server %d: %v", round, i+1, errs[i])
			}
			done := h.wait(t, ops[i])
			if msg := done.GetError().GetMessage(); !strings.Contains(msg, "step validate_node failed") {
				won = append(won, clusters[i])
				if done.GetError() != nil {
					t.Errorf("round %d: the AddNodes through server %d got past validate_node and failed: %s", round, i+1, msg)
				}
			} else if !strings.Contains(msg, "is taking it") && !strings.Contains(msg, "belongs to cluster") {
				t.Errorf("round %d: the AddNodes through server %d failed at validate_node: %s; want another cluster taking or having the machine", round, i+1, msg)
			}
		}
		m, err := drv.Machine(ctx, free.ID)
		if err != nil {
			t.Fatal(err)
		}
		switch len(won) {
		case 1:
			if "clusters/"+m.ClusterID != won[0] || !m.Joined || m.KubernetesVersion != "1.30.2" || m.AttachedISO != "" {
				t.Errorf("round %d: the machine is %+v; want it joined to the winner (%s) at 1.30.2, its ISO detached", round, m, won[0])
			}
		case 2:
			twoWinners++
			t.Errorf("round %d: both AddNodes got past validate_node; the machine is in cluster %s", round, m.ClusterID)
		default:
			t.Errorf("round %d: neither AddNodes got past validate_node", round)
		}
	}
	t.Logf("%d of %d rounds had two winners", twoWinners, rounds)
}
