// Package infratest is the conformance suite of infra.Infrastructure: what
// every driver (the simulator, libvirt, a third party's) must do that the
// interface's types cannot say. Every step is idempotent, called twice and
// after an interruption; reading an unknown machine, and every step on one
// but destroy_machine (gone is destroyed), is infra.ErrNotFound;
// validate_node of anything but a free running EXTERNAL machine, and of a
// machine another cluster has just taken (through this driver or another
// server's, Harness.Peer), and any
// step of a job on another cluster's machine, is infra.ErrUnusable; calls
// of a job that no longer holds its cluster are refused with
// infra.ErrFenced and change nothing; listings are complete and oldest
// first; network rules converge, adding before removing; delete_node
// leaves a free EXTERNAL machine; and steps on different clusters run side
// by side.
//
// A driver's test calls Run with a function that builds a Harness: the
// driver, and what the suite needs beyond the interface (jobs holding
// clusters, free machines). NewHolder makes the holding part from a
// repository.Store, so fencing is tested against the repository's real
// claims, adoptions and job ends:
//
//	func TestConformance(t *testing.T) {
//		infratest.Run(t, func(t *testing.T) infratest.Harness {
//			store := ... // the store the driver fences on
//			return infratest.Harness{Infra: myDriver(store), Holder: infratest.NewHolder(store)}
//		})
//	}
//
// A driver whose machines outlive the test sets Harness.Cleanup, which gets
// every machine and cluster id a group of cases used.
package infratest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/clusterd/clusterd/infra"
)

// Holder makes jobs hold clusters, so that the suite's calls carry real
// fencing tokens and the suite can take a cluster from a job the ways
// clusterd does. NewHolder is the implementation on clusterd's repository.
type Holder interface {
	// Hold makes a new job hold cluster clusterID, creating the cluster when
	// it does not exist, taking it from any job that holds it otherwise. It
	// returns the job's call (MachineID empty).
	Hold(ctx context.Context, clusterID string) (infra.Call, error)
	// Adopt moves call's job to another server as an adoption does: the job
	// keeps the cluster at its next attempt, returned in the call.
	Adopt(ctx context.Context, call infra.Call) (infra.Call, error)
	// Release ends call's job, leaving its cluster held by none.
	Release(ctx context.Context, call infra.Call) error
	// Fail fails call's job as recovery does when the job's server died:
	// the job is FAILED, and the cluster still names it as its current
	// operation until recovery takes the cluster over.
	Fail(ctx context.Context, call infra.Call) error
}

// Harness is a driver under test and what the suite needs beyond
// infra.Infrastructure. It assumes nothing about where the driver keeps its
// machines: only the fencing goes through the Holder.
type Harness struct {
	// Infra is the driver under test.
	Infra infra.Infrastructure
	// Holder makes jobs hold clusters on the store the driver fences on.
	Holder
	// External makes a free, running EXTERNAL machine (one that AddNodes
	// may take) and returns its id. Nil when the driver cannot: the cases
	// that need one are skipped, saying so.
	External func(ctx context.Context) (machineID string, err error)
	// Peer is a second server's driver on the same machines and the same
	// database as Infra (another clusterd process beside it), for the
	// cases where servers race: validate_node of one free machine by two
	// clusters through the two drivers must give it to exactly one. Nil:
	// those cases are skipped, saying so.
	Peer infra.Infrastructure
	// Offerings are two service offerings the driver knows, the second to
	// resize to (default "small", "medium").
	Offerings []string
	// Versions are two Kubernetes versions the driver can install, the
	// second to upgrade to (default "1.30.2", "1.31.1").
	Versions []string
	// Timeout bounds each group of cases, to catch a hung driver, not to
	// time it (default 30 minutes: the libvirt driver's Interrupted group,
	// 144 cases, ran past a 10-minute bound, 607 s in, beside two more make
	// test runs and a race run).
	Timeout time.Duration
	// Cleanup, when set, is called as each group ends, pass or fail, with
	// every machine and cluster id the group used (some may never have
	// been made, or be gone), so that a driver whose machines outlive the
	// test (domains, volumes, filters) removes them. Nil when they go with
	// the harness (the simulator's database).
	Cleanup func(ctx context.Context, machineIDs, clusterIDs []string) error
}

// Run runs the suite as subtests of t. newHarness is called once for each
// group of cases, with the group's t (register cleanups on it); the cases of
// a group share the harness, each on clusters and machines of its own, so
// a harness may also share its driver with other tests.
func Run(t *testing.T, newHarness func(t *testing.T) Harness) {
	groups := []struct {
		name string
		run  func(t *testing.T, e *env)
	}{
		{"Idempotent", testIdempotent},
		{"Interrupted", testInterrupted},
		{"NotFound", testNotFound},
		{"Unusable", testUnusable},
		{"OtherClustersMachines", testOtherClustersMachines},
		{"Fencing", testFencing},
		{"Listing", testListing},
		{"ConfigureNetwork", testConfigureNetwork},
		{"Destroy", testDestroy},
		{"DeleteNode", testDeleteNode},
		{"Concurrent", testConcurrent},
	}
	for _, g := range groups {
		t.Run(g.name, func(t *testing.T) {
			h := newHarness(t)
			if h.Infra == nil || h.Holder == nil {
				t.Fatal("the harness needs Infra and Holder")
			}
			if len(h.Offerings) < 2 {
				h.Offerings = []string{"small", "medium"}
			}
			if len(h.Versions) < 2 {
				h.Versions = []string{"1.30.2", "1.31.1"}
			}
			if h.Timeout <= 0 {
				h.Timeout = 30 * time.Minute
			}
			ctx, cancel := context.WithTimeout(context.Background(), h.Timeout)
			t.Cleanup(cancel)
			e := &env{h: h, ctx: ctx}
			if h.Cleanup != nil {
				t.Cleanup(func() {
					ctx, cancel := context.WithTimeout(context.Background(), h.Timeout)
					defer cancel()
					machines, clusters := e.used()
					if err := h.Cleanup(ctx, machines, clusters); err != nil {
						t.Errorf("clean up %d machines of %d clusters: %v", len(machines), len(clusters), err)
					}
				})
			}
			g.run(t, e)
		})
	}
}

// env is one group's harness and context, and the ids the group used.
type env struct {
	h   Harness
	ctx context.Context

	mu       sync.Mutex
	machines []string
	clusters []string
}

// use records machine and cluster ids for Harness.Cleanup.
func (e *env) use(machines []string, clusters ...string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.machines = append(e.machines, machines...)
	e.clusters = append(e.clusters, clusters...)
}

// used returns the ids use recorded.
func (e *env) used() (machines, clusters []string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.machines), slices.Clone(e.clusters)
}

// hold makes a new job hold cluster id, recording the cluster.
func (e *env) hold(ctx context.Context, id string) (infra.Call, error) {
	e.use(nil, id)
	return e.h.Hold(ctx, id)
}

func (e *env) infra() infra.Infrastructure { return e.h.Infra }

// iso names the binaries ISO of version, as clusterd's workers do.
func iso(version string) string { return "kubernetes-" + version + ".iso" }

// fixture is a cluster held by a job, with a control and a worker machine
// provisioned through the driver, and two ids for machines the case may add:
// spare (never provisioned unless the case does) and external (a free
// machine, once the case makes one).
type fixture struct {
	call     infra.Call
	control  string
	worker   string
	spare    string
	external string
}

// on is the fixture's call for machine id.
func (f fixture) on(id string) infra.Call {
	c := f.call
	c.MachineID = id
	return c
}

// machines are the ids of every machine the fixture knows of.
func (f fixture) machines() []string {
	ids := []string{f.control, f.worker, f.spare}
	if f.external != "" {
		ids = append(ids, f.external)
	}
	return ids
}

// cluster holds a new cluster and provisions its control and worker machines.
func (e *env) cluster(t *testing.T) fixture {
	t.Helper()
	id := uuid.NewString()
	call, err := e.hold(e.ctx, id)
	if err != nil {
		t.Fatalf("hold a new cluster: %v", err)
	}
	f := fixture{call: call, control: uuid.NewString(), worker: uuid.NewString(), spare: uuid.NewString()}
	e.use(f.machines())
	for _, m := range []struct {
		id   string
		role infra.Role
	}{{f.control, infra.RoleControl}, {f.worker, infra.RoleWorker}} {
		if _, err := e.infra().ProvisionMachine(e.ctx, f.call, m.id, m.role, e.h.Offerings[0], e.h.Versions[0]); err != nil {
			t.Fatalf("provision the %s machine of cluster %s: %v", m.role, id, err)
		}
	}
	return f
}

// ready makes the fixture's cluster what a create leaves: the ISO of the
// first version attached to both machines, both joined, the rules set.
func (e *env) ready(t *testing.T, f fixture) {
	t.Helper()
	for _, m := range []string{f.control, f.worker} {
		must(t, "attach_iso", e.infra().AttachISO(e.ctx, f.on(m), iso(e.h.Versions[0])))
		must(t, "join_node", e.infra().JoinNode(e.ctx, f.on(m), e.h.Versions[0], infra.NodeCredentials{}))
	}
	must(t, "configure_network", e.infra().ConfigureNetwork(e.ctx, f.call, baseRules(f)))
}

// baseRules are the rules a created cluster of the fixture's shape has.
func baseRules(f fixture) []infra.Rule {
	return []infra.Rule{
		{MachineID: f.control, Kind: "api", Port: 6443},
		{MachineID: f.control, Kind: "ssh", Port: 22},
		{MachineID: f.worker, Kind: "ssh", Port: 22},
	}
}

// external makes a free running EXTERNAL machine, or skips the test.
func (e *env) external(t *testing.T) string {
	t.Helper()
	if e.h.External == nil {
		t.Skip("the harness makes no EXTERNAL machines (Harness.External is nil)")
	}
	id, err := e.h.External(e.ctx)
	if err != nil {
		t.Fatalf("make a free EXTERNAL machine: %v", err)
	}
	e.use([]string{id})
	return id
}

func must(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// machine reads machine id, failing the test if it cannot.
func (e *env) machine(t *testing.T, id string) infra.Machine {
	t.Helper()
	m, err := e.infra().Machine(e.ctx, id)
	if err != nil {
		t.Fatalf("Machine(%s): %v", id, err)
	}
	return norm(m)
}

// norm drops what two reads of one machine may differ in but its meaning:
// the time's location and monotonic reading.
func norm(m infra.Machine) infra.Machine {
	m.CreateTime = m.CreateTime.UTC().Round(0)
	return m
}

// world is everything of a fixture a step can change: each of its machines
// (nil when gone), the listing of its clusters and their rules.
type world struct {
	Machines map[string]*infra.Machine
	Listed   []infra.Machine
	Rules    map[string][]infra.Rule
}

// snapshot reads the world of the given machines and clusters.
func (e *env) snapshot(t *testing.T, machines []string, clusters ...string) world {
	t.Helper()
	w := world{Machines: map[string]*infra.Machine{}, Rules: map[string][]infra.Rule{}}
	for _, id := range machines {
		m, err := e.infra().Machine(e.ctx, id)
		switch {
		case errors.Is(err, infra.ErrNotFound):
			w.Machines[id] = nil
		case err != nil:
			t.Fatalf("Machine(%s): %v", id, err)
		default:
			m = norm(m)
			w.Machines[id] = &m
		}
	}
	w.Listed = e.list(t, clusters...)
	for _, c := range clusters {
		w.Rules[c] = e.rules(t, c)
	}
	return w
}

// fixtureWorld is the snapshot of a fixture and of the other clusters given.
func (e *env) fixtureWorld(t *testing.T, f fixture, others ...string) world {
	t.Helper()
	return e.snapshot(t, f.machines(), append([]string{f.call.ClusterID}, others...)...)
}

// String shows a world one machine a line, for failure messages.
func (w world) String() string {
	var b strings.Builder
	for _, id := range slices.Sorted(maps.Keys(w.Machines)) {
		if m := w.Machines[id]; m == nil {
			fmt.Fprintf(&b, "\n  %s: gone", id)
		} else {
			fmt.Fprintf(&b, "\n  %+v", *m)
		}
	}
	fmt.Fprintf(&b, "\n  listed: %d machines", len(w.Listed))
	for c, rs := range w.Rules {
		fmt.Fprintf(&b, "\n  rules of %s: %+v", c, rs)
	}
	return b.String()
}

// list is Machines(clusters...), normalized.
func (e *env) list(t *testing.T, clusters ...string) []infra.Machine {
	t.Helper()
	ms, err := e.infra().Machines(e.ctx, clusters...)
	if err != nil {
		t.Fatalf("Machines(%v): %v", clusters, err)
	}
	for i := range ms {
		ms[i] = norm(ms[i])
	}
	return ms
}

// rules is Rules(cluster), sorted by machine, kind and port (the interface
// promises the set, not an order).
func (e *env) rules(t *testing.T, cluster string) []infra.Rule {
	t.Helper()
	rs, err := e.infra().Rules(e.ctx, cluster)
	if err != nil {
		t.Fatalf("Rules(%s): %v", cluster, err)
	}
	return sortRules(rs)
}

func sortRules(rs []infra.Rule) []infra.Rule {
	rs = slices.Clone(rs)
	if rs == nil {
		rs = []infra.Rule{}
	}
	slices.SortFunc(rs, func(a, b infra.Rule) int {
		return cmp.Or(cmp.Compare(a.MachineID, b.MachineID), cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Port, b.Port))
	})
	return rs
}

// ids are the machines' ids in order.
func ids(ms []infra.Machine) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.ID
	}
	return out
}
