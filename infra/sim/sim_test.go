package sim_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/infra/sim"
	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/repository/repotest"
)

// Every test runs on every backend the simulator's machines can live in.
func forEachBackend(t *testing.T, cfg sim.Config, fn func(t *testing.T, s *sim.Simulator)) {
	t.Helper()
	for _, b := range repotest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			fn(t, newSim(t, repotest.Open(t, b), cfg))
		})
	}
}

// stores remembers each test simulator's store, so that helpers can write
// the cluster and job rows every fenced step needs.
var stores sync.Map // *sim.Simulator -> *repository.Store

func newSim(t *testing.T, store *repository.Store, cfg sim.Config) *sim.Simulator {
	s, err := sim.Open(context.Background(), store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stores.Store(s, store)
	t.Cleanup(func() { stores.Delete(s) })
	return s
}

func storeOf(s *sim.Simulator) *repository.Store {
	v, _ := stores.Load(s)
	return v.(*repository.Store)
}

// holder makes cluster id exist, held by a new job, as a claim would, and
// returns the job: every step must name a job that holds its cluster.
func holder(t *testing.T, s *sim.Simulator, id string) string {
	t.Helper()
	_, j, err := storeOf(s).CreateCluster(ctxT(t),
		repository.NewCluster{ID: id, Account: "acme", DisplayName: "c-" + id[:8], Spec: repository.Spec{KubernetesVersion: "1.30.2", ControlNodeCount: 1, WorkerNodeCount: 1, ServiceOffering: "medium"}},
		repository.NewJob{Kind: "create", ServerID: "s1", Deadline: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatalf("cluster %s held by a job: %v", id, err)
	}
	return j.ID
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// cluster is a cluster of the simulator with one control and one worker
// machine, provisioned through the steps.
type cluster struct {
	id      string
	op      string // the job holding it
	control string
	worker  string
}

func (c cluster) call(machine string) infra.Call {
	return infra.Call{ClusterID: c.id, Operation: c.op, MachineID: machine}
}

func newCluster(t *testing.T, s *sim.Simulator) cluster {
	t.Helper()
	c := cluster{id: uuid.NewString(), control: uuid.NewString(), worker: uuid.NewString()}
	c.op = holder(t, s, c.id)
	for _, m := range []struct {
		id   string
		role infra.Role
	}{{c.control, infra.RoleControl}, {c.worker, infra.RoleWorker}} {
		if _, err := s.ProvisionMachine(ctxT(t), c.call(""), m.id, m.role, "medium", "1.30.2"); err != nil {
			t.Fatalf("provision %s: %v", m.role, err)
		}
	}
	return c
}

func machine(t *testing.T, s *sim.Simulator, id string) infra.Machine {
	t.Helper()
	m, err := s.Machine(ctxT(t), id)
	if err != nil {
		t.Fatalf("Machine(%s): %v", id, err)
	}
	return m
}

func freeMachine(t *testing.T, s *sim.Simulator) infra.Machine {
	t.Helper()
	m, err := s.CreateMachine(ctxT(t), infra.RoleExternal)
	if err != nil {
		t.Fatalf("CreateMachine(EXTERNAL): %v", err)
	}
	return m
}

// world is everything a step can change: every machine and the rules of the
// clusters given.
type world struct {
	Machines []infra.Machine
	Rules    map[string][]infra.Rule
}

func snapshot(t *testing.T, s *sim.Simulator, clusters ...string) world {
	t.Helper()
	ms, err := s.Machines(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	w := world{Machines: ms, Rules: map[string][]infra.Rule{}}
	for _, c := range clusters {
		if w.Rules[c], err = s.Rules(ctxT(t), c); err != nil {
			t.Fatal(err)
		}
	}
	return w
}

func TestProvisionMachine(t *testing.T) {
	forEachBackend(t, sim.Config{}, func(t *testing.T, s *sim.Simulator) {
		ctx := ctxT(t)
		c := newCluster(t, s)
		m := machine(t, s, c.worker)
		want := infra.Machine{
			ID: c.worker, ClusterID: c.id, Role: infra.RoleWorker, Power: infra.PowerRunning,
			KubernetesVersion: "1.30.2", Offering: "medium", CreateTime: m.CreateTime,
		}
		if m != want || m.CreateTime.IsZero() {
			t.Errorf("provisioned %+v; want %+v", m, want)
		}

		other := newCluster(t, s)
		if _, err := s.ProvisionMachine(ctx, other.call(""), c.worker, infra.RoleWorker, "medium", "1.30.2"); !errors.Is(err, infra.ErrUnusable) {
			t.Errorf("provision of another cluster's machine id: err = %v; want ErrUnusable", err)
		}
		refused := []struct {
			name string
			call infra.Call
			id   string
			role infra.Role
		}{
			{"id not a UUID", c.call(""), "control-0", infra.RoleControl},
			{"upper-case UUID", c.call(""), "0191E4B6-7A5C-7C9E-9D6B-1A2B3C4D5E6F", infra.RoleControl},
			{"no cluster", infra.Call{}, uuid.NewString(), infra.RoleControl},
			{"external role", c.call(""), uuid.NewString(), infra.RoleExternal},
		}
		for _, tt := range refused {
			if _, err := s.ProvisionMachine(ctx, tt.call, tt.id, tt.role, "medium", "1.30.2"); err == nil {
				t.Errorf("%s: provision succeeded; want an error", tt.name)
			}
		}
	})
}

// Every step run twice leaves the world as running it once did, without an
// error: an operation run again after an interruption converges.
func TestStepsAreIdempotent(t *testing.T) {
	type env struct {
		s    *sim.Simulator
		c    cluster
		free infra.Machine
	}
	rules := func(c cluster) []infra.Rule {
		return []infra.Rule{{MachineID: c.control, Kind: "api", Port: 6443}, {MachineID: c.control, Kind: "ssh", Port: 22}, {MachineID: c.worker, Kind: "ssh", Port: 22}}
	}
	tests := []struct {
		step  string
		setup func(ctx context.Context, e env) error
		run   func(ctx context.Context, e env) error
		// check looks at the world after the step.
		check func(t *testing.T, e env, w world)
	}{
		{
			step: infra.StepProvisionMachine,
			run: func(ctx context.Context, e env) error {
				_, err := e.s.ProvisionMachine(ctx, e.c.call(""), e.c.worker, infra.RoleWorker, "medium", "1.30.2")
				return err
			},
			check: func(t *testing.T, e env, w world) {
				if n := len(w.Machines); n != 3 {
					t.Errorf("%d machines; want the 3 there were", n)
				}
			},
		},
		{
			step: infra.StepPowerOff,
			run:  func(ctx context.Context, e env) error { return e.s.PowerOff(ctx, e.c.call(e.c.worker)) },
			check: func(t *testing.T, e env, w world) {
				if m := find(w, e.c.worker); m.Power != infra.PowerStopped {
					t.Errorf("power = %s; want STOPPED", m.Power)
				}
			},
		},
		{
			step:  infra.StepPowerOn,
			setup: func(ctx context.Context, e env) error { return e.s.PowerOff(ctx, e.c.call(e.c.worker)) },
			run:   func(ctx context.Context, e env) error { return e.s.PowerOn(ctx, e.c.call(e.c.worker)) },
			check: func(t *testing.T, e env, w world) {
				if m := find(w, e.c.worker); m.Power != infra.PowerRunning {
					t.Errorf("power = %s; want RUNNING", m.Power)
				}
			},
		},
		{
			step:  infra.StepUncordonNode,
			setup: func(ctx context.Context, e env) error { return e.s.DrainNode(ctx, e.c.call(e.c.worker)) },
			run:   func(ctx context.Context, e env) error { return e.s.UncordonNode(ctx, e.c.call(e.c.worker)) },
			check: func(t *testing.T, e env, w world) {
				if m := find(w, e.c.worker); m.Cordoned {
					t.Error("still cordoned after uncordon_node")
				}
			},
		},
		{
			step: infra.StepResizeMachine,
			run:  func(ctx context.Context, e env) error { return e.s.ResizeMachine(ctx, e.c.call(e.c.worker), "large") },
			check: func(t *testing.T, e env, w world) {
				if m := find(w, e.c.worker); m.Offering != "large" {
					t.Errorf("offering = %s; want large", m.Offering)
				}
			},
		},
		{
			step: infra.StepAttachISO,
			run: func(ctx context.Context, e env) error {
				return e.s.AttachISO(ctx, e.c.call(e.c.worker), "k8s-1.31.iso")
			},
			check: func(t *testing.T, e env, w world) {
				if m := find(w, e.c.worker); m.AttachedISO != "k8s-1.31.iso" {
					t.Errorf("ISO = %q; want k8s-1.31.iso", m.AttachedISO)
				}
			},
		},
		{
			step: infra.StepDetachISO,
			setup: func(ctx context.Context, e env) error {
				return e.s.AttachISO(ctx, e.c.call(e.c.worker), "k8s-1.31.iso")
			},
			run: func(ctx context.Context, e env) error { return e.s.DetachISO(ctx, e.c.call(e.c.worker)) },
			check: func(t *testing.T, e env, w world) {
				if m := find(w, e.c.worker); m.AttachedISO != "" {
					t.Errorf("ISO = %q; want none", m.AttachedISO)
				}
			},
		},
		{
			step: infra.StepConfigureNetwork,
			run:  func(ctx context.Context, e env) error { return e.s.ConfigureNetwork(ctx, e.c.call(""), rules(e.c)) },
			check: func(t *testing.T, e env, w world) {
				if got, want := w.Rules[e.c.id], sortRules(rules(e.c)); !reflect.DeepEqual(got, want) {
					t.Errorf("rules = %+v; want %+v", got, want)
				}
			},
		},
		{
			step: infra.StepJoinNode,
			run: func(ctx context.Context, e env) error {
				return e.s.JoinNode(ctx, e.c.call(e.c.worker), "1.30.2", infra.NodeCredentials{})
			},
			check: func(t *testing.T, e env, w world) {
				if m := find(w, e.c.worker); !m.Joined {
					t.Error("not joined")
				}
			},
		},
		{
			step: infra.StepWaitAPI,
			run: func(ctx context.Context, e env) error {
				ep, err := e.s.WaitAPI(ctx, e.c.call(""))
				if want := "https://" + e.c.id[:8] + ".clusterd.sim:6443"; err == nil && ep != want {
					return fmt.Errorf("endpoint %q; want %q", ep, want)
				}
				return err
			},
		},
		{step: infra.StepFetchKubeconfig, run: func(ctx context.Context, e env) error { return e.s.FetchKubeconfig(ctx, e.c.call("")) }},
		{step: infra.StepDeployProvider, run: func(ctx context.Context, e env) error { return e.s.DeployProvider(ctx, e.c.call("")) }},
		{step: infra.StepDeployAutoscaler, run: func(ctx context.Context, e env) error { return e.s.DeployAutoscaler(ctx, e.c.call(""), true, 1, 5) }},
		{
			step: infra.StepDrainNode,
			run:  func(ctx context.Context, e env) error { return e.s.DrainNode(ctx, e.c.call(e.c.worker)) },
			check: func(t *testing.T, e env, w world) {
				if m := find(w, e.c.worker); !m.Cordoned {
					t.Error("not cordoned")
				}
			},
		},
		{
			step: infra.StepDeleteNode,
			setup: func(ctx context.Context, e env) error {
				return errors.Join(e.s.JoinNode(ctx, e.c.call(e.c.worker), "1.30.2", infra.NodeCredentials{}), e.s.DrainNode(ctx, e.c.call(e.c.worker)),
					e.s.AttachISO(ctx, e.c.call(e.c.worker), "x.iso"))
			},
			run: func(ctx context.Context, e env) error { return e.s.DeleteNode(ctx, e.c.call(e.c.worker)) },
			check: func(t *testing.T, e env, w world) {
				m := find(w, e.c.worker)
				if m.ClusterID != "" || m.Role != infra.RoleExternal || m.Joined || m.Cordoned || m.AttachedISO != "" || m.Power != infra.PowerRunning {
					t.Errorf("deleted node = %+v; want a free, running EXTERNAL machine without ISO", m)
				}
			},
		},
		{
			step:  infra.StepUpgradeNode,
			setup: func(ctx context.Context, e env) error { return e.s.DrainNode(ctx, e.c.call(e.c.worker)) },
			run:   func(ctx context.Context, e env) error { return e.s.UpgradeNode(ctx, e.c.call(e.c.worker), "1.31.0") },
			check: func(t *testing.T, e env, w world) {
				if m := find(w, e.c.worker); m.KubernetesVersion != "1.31.0" || m.Cordoned {
					t.Errorf("upgraded node = %+v; want 1.31.0, uncordoned", m)
				}
			},
		},
		{
			step: infra.StepValidateNode,
			run:  func(ctx context.Context, e env) error { return e.s.ValidateNode(ctx, e.c.call(e.free.ID)) },
			check: func(t *testing.T, e env, w world) {
				m := find(w, e.free.ID)
				if m.ClusterID != e.c.id || m.Role != infra.RoleWorker || m.Joined || m.KubernetesVersion != e.free.KubernetesVersion {
					t.Errorf("validated machine = %+v; want an unjoined WORKER of %s", m, e.c.id)
				}
			},
		},
		{
			step:  infra.StepDestroyMachine,
			setup: func(ctx context.Context, e env) error { return e.s.ConfigureNetwork(ctx, e.c.call(""), rules(e.c)) },
			run:   func(ctx context.Context, e env) error { return e.s.DestroyMachine(ctx, e.c.call(e.c.control)) },
			check: func(t *testing.T, e env, w world) {
				if slices.ContainsFunc(w.Machines, func(m infra.Machine) bool { return m.ID == e.c.control }) {
					t.Error("machine still there")
				}
				if got, want := w.Rules[e.c.id], []infra.Rule{{MachineID: e.c.worker, Kind: "ssh", Port: 22}}; !reflect.DeepEqual(got, want) {
					t.Errorf("rules = %+v; want only the worker's %+v", got, want)
				}
			},
		},
	}
	covered := map[string]bool{}
	for _, tt := range tests {
		covered[tt.step] = true
	}
	for _, step := range infra.Steps() {
		if !covered[step] {
			t.Errorf("step %s has no idempotency test", step)
		}
	}
	forEachBackend(t, sim.Config{}, func(t *testing.T, s *sim.Simulator) {
		for _, tt := range tests {
			t.Run(tt.step, func(t *testing.T) {
				ctx := ctxT(t)
				e := env{s: s, c: newCluster(t, s), free: freeMachine(t, s)}
				if tt.setup != nil {
					if err := tt.setup(ctx, e); err != nil {
						t.Fatalf("setup: %v", err)
					}
				}
				if err := tt.run(ctx, e); err != nil {
					t.Fatalf("first run: %v", err)
				}
				once := snapshot(t, s, e.c.id)
				if tt.check != nil {
					tt.check(t, e, once)
				}
				if err := tt.run(ctx, e); err != nil {
					t.Fatalf("second run: %v", err)
				}
				if twice := snapshot(t, s, e.c.id); !reflect.DeepEqual(twice, once) {
					t.Errorf("second run changed the world:\n got %+v\nwant %+v", twice, once)
				}
				// Clean up so later subtests see only their own machines.
				for _, id := range []string{e.c.control, e.c.worker, e.free.ID} {
					if err := s.DestroyMachine(ctx, e.c.call(id)); err != nil {
						t.Fatalf("cleanup: %v", err)
					}
				}
			})
		}
	})
}

func find(w world, id string) infra.Machine {
	for _, m := range w.Machines {
		if m.ID == id {
			return m
		}
	}
	return infra.Machine{}
}

func sortRules(rs []infra.Rule) []infra.Rule {
	return slices.SortedFunc(slices.Values(rs), func(a, b infra.Rule) int {
		return cmp.Or(cmp.Compare(a.MachineID, b.MachineID), cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Port, b.Port))
	})
}

func TestDestroyMissingMachineSucceeds(t *testing.T) {
	forEachBackend(t, sim.Config{}, func(t *testing.T, s *sim.Simulator) {
		c := newCluster(t, s)
		if err := s.DestroyMachine(ctxT(t), c.call(uuid.NewString())); err != nil {
			t.Errorf("destroying a machine that never existed: %v", err)
		}
	})
}

func TestStepsOnAMissingMachine(t *testing.T) {
	forEachBackend(t, sim.Config{}, func(t *testing.T, s *sim.Simulator) {
		ctx := ctxT(t)
		c := newCluster(t, s)
		call := c.call(uuid.NewString())
		for name, err := range map[string]error{
			"power_on":  s.PowerOn(ctx, call),
			"power_off": s.PowerOff(ctx, call),
			"join_node": s.JoinNode(ctx, call, "1.30.2", infra.NodeCredentials{}),
		} {
			if !errors.Is(err, infra.ErrNotFound) {
				t.Errorf("%s of a missing machine: err = %v; want infra.ErrNotFound", name, err)
			}
		}
		if _, err := s.Machine(ctx, call.MachineID); !errors.Is(err, infra.ErrNotFound) {
			t.Errorf("Machine of a missing machine: err = %v; want infra.ErrNotFound", err)
		}
	})
}

func TestStepsLeaveOtherClustersMachinesAlone(t *testing.T) {
	forEachBackend(t, sim.Config{}, func(t *testing.T, s *sim.Simulator) {
		ctx := ctxT(t)
		a, b := newCluster(t, s), newCluster(t, s)
		before := snapshot(t, s)
		wrong := a.call(b.worker)
		for name, err := range map[string]error{
			"power_off":       s.PowerOff(ctx, wrong),
			"drain_node":      s.DrainNode(ctx, wrong),
			"delete_node":     s.DeleteNode(ctx, wrong),
			"destroy_machine": s.DestroyMachine(ctx, wrong),
		} {
			if !errors.Is(err, infra.ErrUnusable) {
				t.Errorf("%s of another cluster's machine: err = %v; want infra.ErrUnusable", name, err)
			}
		}
		if after := snapshot(t, s); !reflect.DeepEqual(after, before) {
			t.Errorf("steps on another cluster's machine changed the world:\n got %+v\nwant %+v", after, before)
		}
	})
}

func TestJoinNodeNeedsARunningMachine(t *testing.T) {
	forEachBackend(t, sim.Config{}, func(t *testing.T, s *sim.Simulator) {
		ctx := ctxT(t)
		c := newCluster(t, s)
		if err := s.PowerOff(ctx, c.call(c.worker)); err != nil {
			t.Fatal(err)
		}
		err := s.JoinNode(ctx, c.call(c.worker), "1.30.2", infra.NodeCredentials{})
		if want := fmt.Sprintf("machine %s is powered off", c.worker); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("join of a stopped machine: err = %v; want %q", err, want)
		}
		if m := machine(t, s, c.worker); m.Joined {
			t.Error("a stopped machine joined")
		}
	})
}

func TestWaitAPINeedsARunningControlMachine(t *testing.T) {
	forEachBackend(t, sim.Config{}, func(t *testing.T, s *sim.Simulator) {
		ctx := ctxT(t)
		c := newCluster(t, s)
		if err := s.PowerOff(ctx, c.call(c.control)); err != nil {
			t.Fatal(err)
		}
		if _, err := s.WaitAPI(ctx, c.call("")); err == nil {
			t.Error("wait_api with the control machine stopped succeeded")
		}
		empty := cluster{id: uuid.NewString()}
		for name, err := range map[string]error{
			"fetch_kubeconfig":  s.FetchKubeconfig(ctx, empty.call("")),
			"deploy_provider":   s.DeployProvider(ctx, empty.call("")),
			"deploy_autoscaler": s.DeployAutoscaler(ctx, empty.call(""), false, 0, 0),
		} {
			if err == nil {
				t.Errorf("%s of a cluster without machines succeeded", name)
			}
		}
	})
}

func TestConfigureNetworkConverges(t *testing.T) {
	forEachBackend(t, sim.Config{}, func(t *testing.T, s *sim.Simulator) {
		ctx := ctxT(t)
		c, other := newCluster(t, s), newCluster(t, s)
		otherRules := []infra.Rule{{MachineID: other.worker, Kind: "ssh", Port: 22}}
		if err := s.ConfigureNetwork(ctx, other.call(""), otherRules); err != nil {
			t.Fatal(err)
		}
		steps := [][]infra.Rule{
			{{MachineID: c.control, Kind: "api", Port: 6443}, {MachineID: c.control, Kind: "ssh", Port: 22}},
			// One kept, one removed, two added (one a duplicate in the request).
			{{MachineID: c.control, Kind: "ssh", Port: 22}, {MachineID: c.worker, Kind: "nodeport", Port: 30080},
				{MachineID: c.worker, Kind: "nodeport", Port: 30080}},
			{},
		}
		for i, want := range steps {
			if err := s.ConfigureNetwork(ctx, c.call(""), want); err != nil {
				t.Fatalf("converge %d: %v", i, err)
			}
			got, err := s.Rules(ctx, c.id)
			if err != nil {
				t.Fatal(err)
			}
			if want := slices.Compact(sortRules(want)); !slices.Equal(got, want) {
				t.Errorf("after converge %d: rules = %+v; want %+v", i, got, want)
			}
		}
		if got, _ := s.Rules(ctx, other.id); !reflect.DeepEqual(got, otherRules) {
			t.Errorf("other cluster's rules = %+v; want them untouched: %+v", got, otherRules)
		}
		if err := s.ConfigureNetwork(ctx, c.call(""), []infra.Rule{{MachineID: c.worker, Kind: "ssh", Port: 0}}); err == nil {
			t.Error("a rule without a port was accepted")
		}
	})
}

// SPEC §6: rules converge without a revoke-all window. A reader polling the
// rules while the cluster flips between two sets must never find a machine
// without any of the rules both sets give it.
func TestConfigureNetworkHasNoRevokeAllWindow(t *testing.T) {
	forEachBackend(t, sim.Config{}, func(t *testing.T, s *sim.Simulator) {
		ctx := ctxT(t)
		c := newCluster(t, s)
		// Each machine's rules differ completely between the two sets, so
		// deleting before adding would leave it with none.
		a := []infra.Rule{{MachineID: c.control, Kind: "api", Port: 6443}, {MachineID: c.worker, Kind: "ssh", Port: 22}}
		b := []infra.Rule{{MachineID: c.control, Kind: "ssh", Port: 22}, {MachineID: c.worker, Kind: "nodeport", Port: 30080}}
		if err := s.ConfigureNetwork(ctx, c.call(""), a); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		var (
			wg    sync.WaitGroup
			reads int
			bad   []string
		)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				rs, err := s.Rules(ctx, c.id)
				if err != nil {
					bad = append(bad, err.Error())
					return
				}
				reads++
				for _, m := range []string{c.control, c.worker} {
					if !slices.ContainsFunc(rs, func(r infra.Rule) bool { return r.MachineID == m }) {
						bad = append(bad, fmt.Sprintf("read %d: machine %s has no rule: %+v", reads, m, rs))
					}
				}
			}
		}()
		for i := range 50 {
			want := a
			if i%2 == 0 {
				want = b
			}
			if err := s.ConfigureNetwork(ctx, c.call(""), want); err != nil {
				t.Errorf("converge %d: %v", i, err)
				break
			}
		}
		close(done)
		wg.Wait()
		if len(bad) > 0 {
			t.Errorf("%d of %d reads saw a machine without rules; first: %s", len(bad), reads, bad[0])
		}
		t.Logf("%d concurrent reads", reads)
	})
}

func TestValidateNode(t *testing.T) {
	for _, b := range repotest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			store := repotest.Open(t, b)
			testValidateNode(t, store, newSim(t, store, sim.Config{}))
		})
	}
}

func testValidateNode(t *testing.T, store *repository.Store, s *sim.Simulator) {
	ctx := ctxT(t)
	c, other := newCluster(t, s), newCluster(t, s)

	free := freeMachine(t, s)
	if err := s.ValidateNode(ctx, c.call(free.ID)); err != nil {
		t.Fatalf("validate of a free machine: %v", err)
	}
	if m := machine(t, s, free.ID); m.ClusterID != c.id || m.Role != infra.RoleWorker || m.Joined {
		t.Errorf("adopted machine = %+v; want an unjoined WORKER of %s", m, c.id)
	}
	if err := s.ValidateNode(ctx, c.call(free.ID)); err != nil {
		t.Errorf("validate again by the same cluster: %v", err)
	}

	stopped := freeMachine(t, s)
	if _, err := s.SetMachinePower(ctx, stopped.ID, infra.PowerStopped); err != nil {
		t.Fatal(err)
	}
	// The API cannot make a free machine that is not EXTERNAL; the store can.
	freeControl, err := store.CreateMachine(ctx, repository.Machine{ID: uuid.NewString(), Role: "CONTROL", Power: "RUNNING"})
	if err != nil {
		t.Fatal(err)
	}
	unusable := []struct {
		name    string
		machine string
	}{
		{"not EXTERNAL", freeControl.ID},
		{"another cluster's worker", c.worker},
		{"taken by another cluster", free.ID},
		{"powered off", stopped.ID},
		{"no such machine", uuid.NewString()},
	}
	for _, tt := range unusable {
		before := snapshot(t, s)
		err := s.ValidateNode(ctx, other.call(tt.machine))
		if !errors.Is(err, infra.ErrUnusable) {
			t.Errorf("%s: err = %v; want infra.ErrUnusable", tt.name, err)
		}
		if after := snapshot(t, s); !reflect.DeepEqual(after, before) {
			t.Errorf("%s: a refused validate changed the world", tt.name)
		}
	}
	// A CONTROL machine that is free (deleted from its cluster) is EXTERNAL
	// again, and usable.
	if err := s.DeleteNode(ctx, c.call(c.control)); err != nil {
		t.Fatal(err)
	}
	if err := s.ValidateNode(ctx, other.call(c.control)); err != nil {
		t.Errorf("validate of a machine back in the pool: %v", err)
	}
}

func TestValidateNodeRaceHasOneWinner(t *testing.T) {
	forEachBackend(t, sim.Config{}, func(t *testing.T, s *sim.Simulator) {
		ctx := ctxT(t)
		free := freeMachine(t, s)
		const n = 8
		var (
			wg       sync.WaitGroup
			start    = make(chan struct{})
			errs     = make([]error, n)
			clusters = make([]string, n)
			ops      = make([]string, n)
		)
		for i := range n {
			clusters[i] = uuid.NewString()
			ops[i] = holder(t, s, clusters[i])
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				errs[i] = s.ValidateNode(ctx, infra.Call{ClusterID: clusters[i], Operation: ops[i], MachineID: free.ID})
			}()
		}
		close(start)
		wg.Wait()
		winner := -1
		for i, err := range errs {
			switch {
			case err == nil && winner >= 0:
				t.Errorf("clusters %d and %d both adopted the machine", winner, i)
			case err == nil:
				winner = i
			case !errors.Is(err, infra.ErrUnusable):
				t.Errorf("loser %d: err = %v; want infra.ErrUnusable", i, err)
			}
		}
		if winner < 0 {
			t.Fatal("no cluster adopted the machine")
		}
		if m := machine(t, s, free.ID); m.ClusterID != clusters[winner] {
			t.Errorf("machine belongs to %q; want the winner %s", m.ClusterID, clusters[winner])
		}
	})
}

func TestOutOfBandMachines(t *testing.T) {
	forEachBackend(t, sim.Config{}, func(t *testing.T, s *sim.Simulator) {
		ctx := ctxT(t)
		m := freeMachine(t, s)
		if m.ClusterID != "" || m.Role != infra.RoleExternal || m.Power != infra.PowerRunning || m.KubernetesVersion != "" {
			t.Errorf("new machine = %+v; want a free, running EXTERNAL machine", m)
		}
		for _, role := range []infra.Role{infra.RoleControl, infra.RoleWorker, ""} {
			if _, err := s.CreateMachine(ctx, role); err == nil {
				t.Errorf("CreateMachine(%q) succeeded; only EXTERNAL machines exist without a cluster", role)
			}
		}
		// Out of band: faults on power steps do not apply.
		for _, step := range []string{infra.StepPowerOn, infra.StepPowerOff} {
			if _, err := s.InjectFault(sim.Fault{Step: step, Mode: sim.ModeFail}); err != nil {
				t.Fatal(err)
			}
		}
		got, err := s.SetMachinePower(ctx, m.ID, infra.PowerStopped)
		if err != nil || got.Power != infra.PowerStopped {
			t.Errorf("SetMachinePower(STOPPED) = %+v, %v", got, err)
		}
		if _, err := s.SetMachinePower(ctx, m.ID, "ASLEEP"); err == nil {
			t.Error("SetMachinePower(ASLEEP) succeeded")
		}
		if _, err := s.SetMachinePower(ctx, uuid.NewString(), infra.PowerRunning); !errors.Is(err, infra.ErrNotFound) {
			t.Errorf("SetMachinePower of a missing machine: err = %v; want infra.ErrNotFound", err)
		}
		all, err := s.Machines(ctx)
		if err != nil || len(all) != 1 || all[0].ID != m.ID || all[0].Power != infra.PowerStopped {
			t.Errorf("Machines() = %+v, %v; want the one stopped machine", all, err)
		}
	})
}
