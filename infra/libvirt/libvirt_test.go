package libvirt_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/google/uuid"

	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/infra/libvirt"
	"github.com/clusterd/clusterd/infra/libvirt/libvirttest"
	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/repository/repotest"
)

// testURI is the libvirt the tests drive: libvirt's in-memory test driver
// through libvirtd (make libvirt starts it), unless
// CLUSTERD_TEST_LIBVIRT_URI names another.
func testURI() string {
	if u := os.Getenv("CLUSTERD_TEST_LIBVIRT_URI"); u != "" {
		return u
	}
	return "test+unix:///default"
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// storeGuard is the store's holder check: Store.CheckHolder where the
// store has it, else an empty fenced transaction (the same check).
func storeGuard(s *repository.Store) libvirt.Guard {
	if g, ok := any(s).(libvirt.Guard); ok {
		return g
	}
	return fencedGuard{any(s).(fencer)}
}

type fencer interface {
	Fenced(ctx context.Context, f repository.Fence, fn func(*repository.Store) error) error
}

type fencedGuard struct{ f fencer }

func (g fencedGuard) CheckHolder(ctx context.Context, f repository.Fence) error {
	return g.f.Fenced(ctx, f, func(*repository.Store) error { return nil })
}

// openGuard lets every call through: the window between a guard's check
// and the change, stretched to the whole test.
type openGuard struct{}

func (openGuard) CheckHolder(context.Context, repository.Fence) error { return nil }

// env is one test's driver, store and raw libvirt connection (for checks
// and clean-up that do not trust the driver).
type env struct {
	d     *libvirt.Driver
	store *repository.Store
	raw   *golibvirt.Libvirt
	// filters is a raw connection to where the driver keeps network filters.
	filters *golibvirt.Libvirt
	pool    string
	// dsn is the store's database, for a peer's store (peer).
	dsn     string
	poolDir string
	record
}

// dial connects to uri, skipping the test when libvirtd does not answer
// (failing it under CI).
func dial(t *testing.T, uri string) *golibvirt.Libvirt {
	t.Helper()
	u, err := url.Parse(uri)
	if err != nil {
		t.Fatal(err)
	}
	l, err := golibvirt.ConnectToURI(u)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("libvirtd does not answer on %s (make libvirt starts it): %v", uri, err)
		}
		t.Skipf("libvirtd does not answer on %s (make libvirt starts it): %v", uri, err)
	}
	t.Cleanup(func() { _ = l.Disconnect() })
	return l
}

func newEnv(t *testing.T, guard libvirt.Guard) *env {
	t.Helper()
	return newEnvOn(t, repotest.Backends(t)[0], guard)
}

// newEnvOn is newEnv with its store on backend b.
func newEnvOn(t *testing.T, b repotest.Backend, guard libvirt.Guard) *env {
	t.Helper()
	e := &env{raw: dial(t, testURI()), pool: "clusterd-test-" + uuid.NewString()[:8]}
	filters := dial(t, "qemu:///system")
	e.filters = filters
	e.dsn = b.NewDSN(t)
	store, err := repository.Open(ctxT(t), e.dsn, repository.WithServerID("s1"))
	if err != nil {
		t.Fatalf("open %s store: %v", b.Name, err)
	}
	repotest.SeedCatalog(t, store)
	t.Cleanup(func() { _ = store.Close() })
	e.store = store
	if guard == nil {
		guard = storeGuard(e.store)
	}
	guard = recordingGuard{guard, e}
	e.poolDir = shortDir(t)
	d, err := libvirt.New(ctxT(t), libvirt.Config{URI: testURI(), PoolDir: e.poolDir, Pool: e.pool, Guard: guard, Takes: e.store, ShutdownTimeout: time.Minute})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	e.d = d
	t.Cleanup(func() {
		// Whatever the test made, whether the driver removed it or not:
		// its machines' domains, its pool with their volumes, its
		// clusters' network filters.
		e.mu.Lock()
		defer e.mu.Unlock()
		for id := range e.machines {
			libvirttest.RemoveDomain(e.raw, id)
		}
		libvirttest.RemovePool(e.raw, e.pool)
		for c := range e.clusters {
			if f, err := filters.NwfilterLookupByName(libvirt.FilterName(c)); err == nil {
				_ = filters.NwfilterUndefine(f)
			}
		}
		_ = d.Close()
	})
	return e
}

// recordingGuard records the cluster and machine of every change the
// driver fences, so that the test's clean-up finds what calls made with ids
// the test did not choose (a conformance suite's) left behind.
type recordingGuard struct {
	libvirt.Guard
	e *env
}

func (g recordingGuard) CheckHolder(ctx context.Context, f repository.Fence) error {
	g.e.track(f.MachineID, f.ClusterID)
	return g.Guard.CheckHolder(ctx, f)
}

// env's record of what its test made, for clean-up.
type record struct {
	mu       sync.Mutex
	machines map[string]bool
	clusters map[string]bool
}

func (e *env) track(machine, cluster string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.machines == nil {
		e.machines, e.clusters = map[string]bool{}, map[string]bool{}
	}
	if machine != "" {
		e.machines[machine] = true
	}
	if cluster != "" {
		e.clusters[cluster] = true
	}
}

// cluster is a cluster held by a job (a claim in the store), whose calls
// the guard lets through while the job holds it.
type cluster struct {
	id, op string
}

func (c cluster) call(machine string) infra.Call {
	return infra.Call{ClusterID: c.id, Operation: c.op, Attempt: 1, MachineID: machine}
}

func (e *env) newCluster(t *testing.T) cluster {
	t.Helper()
	id := uuid.NewString()
	_, j, err := e.store.CreateCluster(ctxT(t),
		repository.NewCluster{ID: id, Account: "acme", DisplayName: "c-" + id[:8], Spec: repository.Spec{KubernetesVersion: "1.30.2", ControlNodeCount: 1, WorkerNodeCount: 1, ServiceOffering: "small"}},
		repository.NewJob{Kind: "create", ServerID: "s1", Deadline: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatalf("cluster %s held by a job: %v", id, err)
	}
	e.track("", id)
	return cluster{id: id, op: j.ID}
}

func (e *env) provision(t *testing.T, c cluster, role infra.Role) infra.Machine {
	t.Helper()
	return e.provisionID(t, c, role, uuid.NewString())
}

func (e *env) provisionID(t *testing.T, c cluster, role infra.Role, id string) infra.Machine {
	t.Helper()
	e.track(id, "")
	m, err := e.d.ProvisionMachine(ctxT(t), c.call(""), id, role, "small", "1.30.2")
	if err != nil {
		t.Fatalf("provision %s: %v", role, err)
	}
	return m
}

func (e *env) machine(t *testing.T, id string) infra.Machine {
	t.Helper()
	m, err := e.d.Machine(ctxT(t), id)
	if err != nil {
		t.Fatalf("Machine(%s): %v", id, err)
	}
	return m
}

// state is the domain's state as libvirt reports it.
func (e *env) state(t *testing.T, id string) golibvirt.DomainState {
	t.Helper()
	dom, err := e.raw.DomainLookupByName(libvirt.DomainName(id))
	if err != nil {
		t.Fatalf("domain of machine %s: %v", id, err)
	}
	st, _, err := e.raw.DomainGetState(dom, 0)
	if err != nil {
		t.Fatal(err)
	}
	return golibvirt.DomainState(st)
}

// twice runs a step twice: the second run must succeed too (idempotency),
// and the step's time is logged.
func twice(t *testing.T, name string, step func() error) {
	t.Helper()
	for i := range 2 {
		start := time.Now()
		if err := step(); err != nil {
			t.Fatalf("%s (run %d): %v", name, i+1, err)
		}
		t.Logf("%-18s run %d: %v", name, i+1, time.Since(start).Round(time.Microsecond))
	}
}

// TestStepsConverge drives a control and a worker machine through every
// step, each twice, and checks what a user would see of the machine (its
// record and its libvirt domain) after each.
func TestStepsConverge(t *testing.T) {
	e := newEnv(t, nil)
	ctx := ctxT(t)
	c := e.newCluster(t)
	start := time.Now()
	ctl := e.provision(t, c, infra.RoleControl)
	t.Logf("provision_machine  run 1: %v", time.Since(start).Round(time.Microsecond))
	wrk := e.provision(t, c, infra.RoleWorker)
	twice(t, "provision_machine", func() error {
		m, err := e.d.ProvisionMachine(ctx, c.call(""), wrk.ID, infra.RoleWorker, "small", "1.30.2")
		if err == nil && (m.ID != wrk.ID || !m.CreateTime.Equal(wrk.CreateTime)) {
			err = fmt.Errorf("provisioned again: %+v, first %+v", m, wrk)
		}
		return err
	})
	ms, err := e.d.Machines(ctx, c.id)
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 2 || ms[0].ID != ctl.ID || ms[1].ID != wrk.ID {
		t.Fatalf("Machines = %+v; want control then worker", ms)
	}
	got := e.machine(t, wrk.ID)
	want := infra.Machine{ID: wrk.ID, ClusterID: c.id, Role: infra.RoleWorker, Power: infra.PowerRunning,
		KubernetesVersion: "1.30.2", Offering: "small", CreateTime: got.CreateTime}
	if got != want || got.CreateTime.IsZero() {
		t.Fatalf("Machine = %+v; want %+v", got, want)
	}
	if st := e.state(t, wrk.ID); st != golibvirt.DomainRunning {
		t.Fatalf("domain state %d; want running", st)
	}

	for _, m := range []string{ctl.ID, wrk.ID} {
		twice(t, "attach_iso", func() error { return e.d.AttachISO(ctx, c.call(m), "kubernetes-1.30.2.iso") })
		twice(t, "join_node", func() error { return e.d.JoinNode(ctx, c.call(m), "1.30.2", infra.NodeCredentials{}) })
	}
	if m := e.machine(t, wrk.ID); !m.Joined || m.AttachedISO != "kubernetes-1.30.2.iso" || m.KubernetesVersion != "1.30.2" {
		t.Fatalf("after attach and join: %+v", m)
	}
	if x := e.xml(t, wrk.ID); !strings.Contains(x, "kubernetes-1.30.2.iso") {
		t.Fatalf("the domain's cdrom has no ISO:\n%s", x)
	}
	twice(t, "wait_api", func() error {
		ep, err := e.d.WaitAPI(ctx, c.call(""))
		if err == nil && !strings.Contains(ep, ctl.ID) {
			err = fmt.Errorf("endpoint %q is not the control machine's", ep)
		}
		return err
	})
	twice(t, "fetch_kubeconfig", func() error { return e.d.FetchKubeconfig(ctx, c.call("")) })
	twice(t, "deploy_provider", func() error { return e.d.DeployProvider(ctx, c.call("")) })
	twice(t, "deploy_autoscaler", func() error { return e.d.DeployAutoscaler(ctx, c.call(""), true, 1, 3) })

	rules := []infra.Rule{{MachineID: ctl.ID, Kind: "api", Port: 6443}, {MachineID: ctl.ID, Kind: "ssh", Port: 22}, {MachineID: wrk.ID, Kind: "ssh", Port: 22}}
	twice(t, "configure_network", func() error { return e.d.ConfigureNetwork(ctx, c.call(""), rules) })
	if got, err := e.d.Rules(ctx, c.id); err != nil || !sameRules(got, rules) {
		t.Fatalf("Rules = %+v, %v; want %+v", got, err, rules)
	}
	rules = append(rules[:1], infra.Rule{MachineID: wrk.ID, Kind: "nodeport", Port: 30080})
	twice(t, "configure_network", func() error { return e.d.ConfigureNetwork(ctx, c.call(""), rules) })
	if got, err := e.d.Rules(ctx, c.id); err != nil || !sameRules(got, rules) {
		t.Fatalf("Rules = %+v, %v; want %+v", got, err, rules)
	}

	twice(t, "configure_network", func() error { return e.d.ConfigureNetwork(ctx, c.call(""), nil) })
	if got, err := e.d.Rules(ctx, c.id); err != nil || len(got) != 0 {
		t.Fatalf("Rules after configuring none = %+v, %v", got, err)
	}
	if err := e.d.ConfigureNetwork(ctx, c.call(""), rules); err != nil {
		t.Fatal(err)
	}

	twice(t, "drain_node", func() error { return e.d.DrainNode(ctx, c.call(wrk.ID)) })
	if m := e.machine(t, wrk.ID); !m.Cordoned {
		t.Fatalf("drained machine not cordoned: %+v", m)
	}
	twice(t, "uncordon_node", func() error { return e.d.UncordonNode(ctx, c.call(wrk.ID)) })
	if m := e.machine(t, wrk.ID); m.Cordoned {
		t.Fatalf("uncordoned machine cordoned: %+v", m)
	}

	twice(t, "resize_machine", func() error { return e.d.ResizeMachine(ctx, c.call(wrk.ID), "large") })
	if m := e.machine(t, wrk.ID); m.Offering != "large" {
		t.Fatalf("resized machine's offering %q", m.Offering)
	}
	if x := e.xml(t, wrk.ID); !strings.Contains(x, "<memory unit='KiB'>262144</memory>") {
		t.Fatalf("the domain's memory is not large's 256 MiB:\n%s", x)
	}

	twice(t, "power_off", func() error { return e.d.PowerOff(ctx, c.call(wrk.ID)) })
	if m := e.machine(t, wrk.ID); m.Power != infra.PowerStopped || e.state(t, wrk.ID) != golibvirt.DomainShutoff {
		t.Fatalf("powered off machine: %+v, domain state %d", m, e.state(t, wrk.ID))
	}
	if err := e.d.JoinNode(ctx, c.call(wrk.ID), "1.30.2", infra.NodeCredentials{}); err == nil || !strings.Contains(err.Error(), "powered off") {
		t.Fatalf("join of a stopped machine: %v; want powered off", err)
	}
	twice(t, "power_on", func() error { return e.d.PowerOn(ctx, c.call(wrk.ID)) })
	if m := e.machine(t, wrk.ID); m.Power != infra.PowerRunning || e.state(t, wrk.ID) != golibvirt.DomainRunning {
		t.Fatalf("powered on machine: %+v", m)
	}

	twice(t, "attach_iso", func() error { return e.d.AttachISO(ctx, c.call(wrk.ID), "kubernetes-1.31.1.iso") })
	twice(t, "upgrade_node", func() error { return e.d.UpgradeNode(ctx, c.call(wrk.ID), "1.31.1") })
	if m := e.machine(t, wrk.ID); m.KubernetesVersion != "1.31.1" || m.Cordoned {
		t.Fatalf("upgraded machine: %+v", m)
	}
	twice(t, "detach_iso", func() error { return e.d.DetachISO(ctx, c.call(wrk.ID)) })
	if m := e.machine(t, wrk.ID); m.AttachedISO != "" || strings.Contains(e.xml(t, wrk.ID), ".iso") {
		t.Fatalf("detached machine still has an ISO: %+v", m)
	}

	twice(t, "delete_node", func() error { return e.d.DeleteNode(ctx, c.call(wrk.ID)) })
	if m := e.machine(t, wrk.ID); m.ClusterID != "" || m.Role != infra.RoleExternal || m.Joined {
		t.Fatalf("deleted node's machine is not free: %+v", m)
	}
	for _, m := range []string{wrk.ID, ctl.ID} {
		twice(t, "destroy_machine", func() error { return e.d.DestroyMachine(ctx, c.call(m)) })
		if _, err := e.d.Machine(ctx, m); !errors.Is(err, infra.ErrNotFound) {
			t.Fatalf("destroyed machine: %v; want ErrNotFound", err)
		}
		if _, err := e.raw.DomainLookupByName(libvirt.DomainName(m)); !golibvirt.IsNotFound(err) {
			t.Fatalf("destroyed machine's domain: %v; want none", err)
		}
	}
	p, err := e.raw.StoragePoolLookupByName(e.pool)
	if err != nil {
		t.Fatal(err)
	}
	if vols, _, err := e.raw.StoragePoolListAllVolumes(p, 1, 0); err != nil || len(vols) != 0 {
		t.Fatalf("volumes left after destroy: %v, %v", vols, err)
	}
	if got, err := e.d.Rules(ctx, c.id); err != nil || len(got) != 0 {
		t.Fatalf("the cluster's network filter outlived its last machine: %+v, %v", got, err)
	}
}

func (e *env) xml(t *testing.T, id string) string {
	t.Helper()
	dom, err := e.raw.DomainLookupByName(libvirt.DomainName(id))
	if err != nil {
		t.Fatal(err)
	}
	x, err := e.raw.DomainGetXMLDesc(dom, golibvirt.DomainXMLInactive)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

func sameRules(a, b []infra.Rule) bool {
	if len(a) != len(b) {
		return false
	}
	set := map[infra.Rule]bool{}
	for _, r := range a {
		set[r] = true
	}
	for _, r := range b {
		if !set[r] {
			return false
		}
	}
	return true
}

// TestNewRefusesAPoolFolderTooLongForSockets: the agents' sockets live in
// the pool folder, and a unix socket's path is at most 107 bytes.
func TestNewRefusesAPoolFolderTooLongForSockets(t *testing.T) {
	dir := "/var/lib/" + strings.Repeat("x", 60)
	_, err := libvirt.New(ctxT(t), libvirt.Config{URI: testURI(), PoolDir: dir, Guard: openGuard{}})
	if err == nil || !strings.Contains(err.Error(), "too long") {
		t.Fatalf("New with a %d-byte pool folder: %v; want it refused", len(dir), err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the refused pool folder was made: %v", err)
	}
}

// shortDir is a temporary folder with a short path: the agents' sockets
// in it must fit a unix socket's 107 bytes, which t.TempDir's long names
// may not leave room for.
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "lv-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// TestWatchSeesOutOfBandPowerChanges: a domain destroyed behind clusterd's
// back (virsh destroy), and started again, is reported with its cluster.
func TestWatchSeesOutOfBandPowerChanges(t *testing.T) {
	e := newEnv(t, nil)
	ctx := ctxT(t)
	c := e.newCluster(t)
	m := e.provision(t, c, infra.RoleWorker)
	observed := make(chan string, 64)
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- e.d.Watch(wctx, func(ids ...string) {
			for _, id := range ids {
				observed <- id
			}
		})
	}()
	t.Cleanup(func() {
		stop()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Watch ended with %v; want context.Canceled", err)
		}
	})
	dom, err := e.raw.DomainLookupByName(libvirt.DomainName(m.ID))
	if err != nil {
		t.Fatal(err)
	}
	// The subscription is in place once an event arrives: destroy and
	// start the domain until one does.
	deadline := time.After(2 * time.Minute)
	for seen := false; !seen; {
		_ = e.raw.DomainDestroy(dom)
		_ = e.raw.DomainCreate(dom)
		select {
		case id := <-observed:
			// Other tests' and other runs' domains on this libvirtd send
			// events too: only this cluster's count.
			seen = id == c.id
		case <-time.After(200 * time.Millisecond):
		case <-deadline:
			t.Fatal("no event for a domain destroyed and started out of band")
		}
	}
}
