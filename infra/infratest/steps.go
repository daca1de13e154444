package infratest

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/clusterd/clusterd/infra"
)

// stepCase is one step as the idempotency cases drive it: the fixture is
// brought to where a worker would call the step (prepare), the step is
// called (run), and its effect is checked against the world before it.
type stepCase struct {
	name string
	// external: the case needs a free EXTERNAL machine (f.external).
	external bool
	prepare  func(t *testing.T, e *env, f fixture)
	run      func(ctx context.Context, e *env, f fixture) error
	// target is the machine the step acts on ("" for the cluster); every
	// other machine of the fixture must be left as it was.
	target func(f fixture) string
	check  func(t *testing.T, e *env, f fixture, before world)
	// partial, when set, checks what an interrupted call left.
	partial func(t *testing.T, e *env, f fixture)
}

// stepCases are every step that the interface names.
func stepCases() []stepCase {
	worker := func(f fixture) string { return f.worker }
	none := func(fixture) string { return "" }
	ready := func(t *testing.T, e *env, f fixture) { e.ready(t, f) }
	unchanged := func(t *testing.T, e *env, f fixture, before world) {
		t.Helper()
		if after := e.fixtureWorld(t, f); !reflect.DeepEqual(after, before) {
			t.Errorf("a step that changes nothing in the model changed the world:\n got %v\nwant %v", after, before)
		}
	}
	return []stepCase{
		{
			name: infra.StepProvisionMachine, target: func(f fixture) string { return f.spare },
			run: func(ctx context.Context, e *env, f fixture) error {
				m, err := e.infra().ProvisionMachine(ctx, f.call, f.spare, infra.RoleWorker, e.h.Offerings[0], e.h.Versions[0])
				if err == nil && (m.ID != f.spare || m.ClusterID != f.call.ClusterID || m.Role != infra.RoleWorker) {
					return fmt.Errorf("ProvisionMachine returned %+v; want worker %s of cluster %s", m, f.spare, f.call.ClusterID)
				}
				return err
			},
			check: func(t *testing.T, e *env, f fixture, _ world) {
				m := e.machine(t, f.spare)
				if m.ClusterID != f.call.ClusterID || m.Role != infra.RoleWorker || m.Power != infra.PowerRunning || m.Joined || m.Offering != e.h.Offerings[0] {
					t.Errorf("provisioned machine %+v; want a running, unjoined %s worker of cluster %s", m, e.h.Offerings[0], f.call.ClusterID)
				}
				if got := ids(e.list(t, f.call.ClusterID)); !reflect.DeepEqual(got, []string{f.control, f.worker, f.spare}) {
					t.Errorf("Machines(cluster) = %v; want control, worker and the provisioned machine once, oldest first: %v", got, []string{f.control, f.worker, f.spare})
				}
			},
		},
		{
			name: infra.StepPowerOff, target: worker,
			run: func(ctx context.Context, e *env, f fixture) error { return e.infra().PowerOff(ctx, f.on(f.worker)) },
			check: func(t *testing.T, e *env, f fixture, _ world) {
				if m := e.machine(t, f.worker); m.Power != infra.PowerStopped {
					t.Errorf("after power_off: %+v; want %s", m, infra.PowerStopped)
				}
			},
		},
		{
			name: infra.StepPowerOn, target: worker,
			prepare: func(t *testing.T, e *env, f fixture) {
				must(t, "power_off", e.infra().PowerOff(e.ctx, f.on(f.worker)))
			},
			run: func(ctx context.Context, e *env, f fixture) error { return e.infra().PowerOn(ctx, f.on(f.worker)) },
			check: func(t *testing.T, e *env, f fixture, _ world) {
				if m := e.machine(t, f.worker); m.Power != infra.PowerRunning {
					t.Errorf("after power_on: %+v; want %s", m, infra.PowerRunning)
				}
			},
		},
		{
			name: infra.StepResizeMachine, target: worker,
			run: func(ctx context.Context, e *env, f fixture) error {
				return e.infra().ResizeMachine(ctx, f.on(f.worker), e.h.Offerings[1])
			},
			check: func(t *testing.T, e *env, f fixture, _ world) {
				if m := e.machine(t, f.worker); m.Offering != e.h.Offerings[1] {
					t.Errorf("after resize_machine: %+v; want offering %s", m, e.h.Offerings[1])
				}
			},
		},
		{
			name: infra.StepAttachISO, target: worker,
			run: func(ctx context.Context, e *env, f fixture) error {
				return e.infra().AttachISO(ctx, f.on(f.worker), iso(e.h.Versions[0]))
			},
			check: func(t *testing.T, e *env, f fixture, _ world) {
				if m := e.machine(t, f.worker); m.AttachedISO != iso(e.h.Versions[0]) {
					t.Errorf("after attach_iso: %+v; want %s attached", m, iso(e.h.Versions[0]))
				}
			},
		},
		{
			name: infra.StepDetachISO, target: worker,
			prepare: func(t *testing.T, e *env, f fixture) {
				must(t, "attach_iso", e.infra().AttachISO(e.ctx, f.on(f.worker), iso(e.h.Versions[0])))
			},
			run: func(ctx context.Context, e *env, f fixture) error { return e.infra().DetachISO(ctx, f.on(f.worker)) },
			check: func(t *testing.T, e *env, f fixture, _ world) {
				if m := e.machine(t, f.worker); m.AttachedISO != "" {
					t.Errorf("after detach_iso: %+v; want no ISO", m)
				}
			},
		},
		{
			// From one set of rules to another: one rule to keep, one to
			// add, one to remove.
			name: infra.StepConfigureNetwork, target: none,
			prepare: func(t *testing.T, e *env, f fixture) {
				must(t, "configure_network", e.infra().ConfigureNetwork(e.ctx, f.call, oldRules(f)))
			},
			run: func(ctx context.Context, e *env, f fixture) error {
				return e.infra().ConfigureNetwork(ctx, f.call, newRules(f))
			},
			check: func(t *testing.T, e *env, f fixture, _ world) {
				if got, want := e.rules(t, f.call.ClusterID), sortRules(newRules(f)); !reflect.DeepEqual(got, want) {
					t.Errorf("after configure_network: rules %+v; want %+v", got, want)
				}
			},
			partial: func(t *testing.T, e *env, f fixture) {
				if msg := addedBeforeRemoved(e.rules(t, f.call.ClusterID), oldRules(f), newRules(f)); msg != "" {
					t.Errorf("an interrupted configure_network left %s", msg)
				}
			},
		},
		{
			// The version joined is not the one provisioned, so that the
			// case sees join_node install it.
			name: infra.StepJoinNode, target: worker,
			prepare: func(t *testing.T, e *env, f fixture) {
				must(t, "attach_iso", e.infra().AttachISO(e.ctx, f.on(f.worker), iso(e.h.Versions[1])))
			},
			run: func(ctx context.Context, e *env, f fixture) error {
				return e.infra().JoinNode(ctx, f.on(f.worker), e.h.Versions[1], infra.NodeCredentials{})
			},
			check: func(t *testing.T, e *env, f fixture, _ world) {
				if m := e.machine(t, f.worker); !m.Joined || m.KubernetesVersion != e.h.Versions[1] {
					t.Errorf("after join_node: %+v; want joined at %s", m, e.h.Versions[1])
				}
			},
		},
		{
			name: infra.StepWaitAPI, target: none, prepare: ready,
			run: func(ctx context.Context, e *env, f fixture) error {
				ep, err := e.infra().WaitAPI(ctx, f.call)
				if err == nil && ep == "" {
					return errors.New("wait_api returned no endpoint")
				}
				return err
			},
			check: unchanged,
		},
		{
			name: infra.StepFetchKubeconfig, target: none, prepare: ready,
			run:   func(ctx context.Context, e *env, f fixture) error { return e.infra().FetchKubeconfig(ctx, f.call) },
			check: unchanged,
		},
		{
			name: infra.StepDeployProvider, target: none, prepare: ready,
			run:   func(ctx context.Context, e *env, f fixture) error { return e.infra().DeployProvider(ctx, f.call) },
			check: unchanged,
		},
		{
			name: infra.StepDeployAutoscaler, target: none, prepare: ready,
			run: func(ctx context.Context, e *env, f fixture) error {
				return e.infra().DeployAutoscaler(ctx, f.call, true, 1, 3)
			},
			check: unchanged,
		},
		{
			name: infra.StepDrainNode, target: worker, prepare: ready,
			run: func(ctx context.Context, e *env, f fixture) error { return e.infra().DrainNode(ctx, f.on(f.worker)) },
			check: func(t *testing.T, e *env, f fixture, _ world) {
				if m := e.machine(t, f.worker); !m.Cordoned || !m.Joined {
					t.Errorf("after drain_node: %+v; want cordoned, still joined", m)
				}
			},
		},
		{
			name: infra.StepUncordonNode, target: worker,
			prepare: func(t *testing.T, e *env, f fixture) {
				e.ready(t, f)
				must(t, "drain_node", e.infra().DrainNode(e.ctx, f.on(f.worker)))
			},
			run: func(ctx context.Context, e *env, f fixture) error { return e.infra().UncordonNode(ctx, f.on(f.worker)) },
			check: func(t *testing.T, e *env, f fixture, _ world) {
				if m := e.machine(t, f.worker); m.Cordoned {
					t.Errorf("after uncordon_node: %+v; want not cordoned", m)
				}
			},
		},
		{
			name: infra.StepUpgradeNode, target: worker,
			prepare: func(t *testing.T, e *env, f fixture) {
				e.ready(t, f)
				must(t, "drain_node", e.infra().DrainNode(e.ctx, f.on(f.worker)))
				must(t, "attach_iso", e.infra().AttachISO(e.ctx, f.on(f.worker), iso(e.h.Versions[1])))
			},
			run: func(ctx context.Context, e *env, f fixture) error {
				return e.infra().UpgradeNode(ctx, f.on(f.worker), e.h.Versions[1])
			},
			check: func(t *testing.T, e *env, f fixture, _ world) {
				if m := e.machine(t, f.worker); m.KubernetesVersion != e.h.Versions[1] || m.Cordoned || !m.Joined {
					t.Errorf("after upgrade_node: %+v; want joined at %s, uncordoned", m, e.h.Versions[1])
				}
			},
		},
		{
			name: infra.StepValidateNode, external: true, target: func(f fixture) string { return f.external },
			run: func(ctx context.Context, e *env, f fixture) error {
				return e.infra().ValidateNode(ctx, f.on(f.external))
			},
			check: func(t *testing.T, e *env, f fixture, _ world) {
				if m := e.machine(t, f.external); m.ClusterID != f.call.ClusterID || m.Role != infra.RoleWorker {
					t.Errorf("after validate_node: %+v; want a worker of cluster %s", m, f.call.ClusterID)
				}
			},
		},
		{
			name: infra.StepDeleteNode, target: worker, prepare: ready,
			run: func(ctx context.Context, e *env, f fixture) error { return e.infra().DeleteNode(ctx, f.on(f.worker)) },
			check: func(t *testing.T, e *env, f fixture, _ world) {
				checkFree(t, e, f.worker, f.call.ClusterID)
			},
		},
		{
			name: infra.StepDestroyMachine, target: worker, prepare: ready,
			run: func(ctx context.Context, e *env, f fixture) error {
				return e.infra().DestroyMachine(ctx, f.on(f.worker))
			},
			check: func(t *testing.T, e *env, f fixture, _ world) {
				checkGone(t, e, f.worker, f.call.ClusterID)
			},
		},
	}
}

// checkFree checks that machine id is a free, running EXTERNAL machine, no
// longer joined nor listed in cluster.
func checkFree(t *testing.T, e *env, id, cluster string) {
	t.Helper()
	if m := e.machine(t, id); m.ClusterID != "" || m.Role != infra.RoleExternal || m.Joined || m.Power != infra.PowerRunning {
		t.Errorf("after delete_node: %+v; want a free, running, unjoined %s machine", m, infra.RoleExternal)
	}
	for _, m := range e.list(t, cluster) {
		if m.ID == id {
			t.Errorf("after delete_node: Machines(%s) still lists %+v", cluster, m)
		}
	}
}

// checkGone checks that machine id is destroyed: not found, not listed.
func checkGone(t *testing.T, e *env, id, cluster string) {
	t.Helper()
	if m, err := e.infra().Machine(e.ctx, id); !errors.Is(err, infra.ErrNotFound) {
		t.Errorf("Machine(%s) after destroy_machine = %+v, %v; want infra.ErrNotFound", id, m, err)
	}
	for _, m := range e.list(t, cluster) {
		if m.ID == id {
			t.Errorf("after destroy_machine: Machines(%s) still lists %+v", cluster, m)
		}
	}
}

// prepareCase builds a fixture where the step is to be called.
func (e *env) prepareCase(t *testing.T, s stepCase) fixture {
	t.Helper()
	var ext string
	if s.external {
		ext = e.external(t)
	}
	f := e.cluster(t)
	f.external = ext
	if s.prepare != nil {
		s.prepare(t, e, f)
	}
	return f
}

// checkOthers checks that the step left every machine but its target as it was.
func checkOthers(t *testing.T, s stepCase, f fixture, before, after world) {
	t.Helper()
	for id, m := range before.Machines {
		if id == s.target(f) {
			continue
		}
		if !reflect.DeepEqual(after.Machines[id], m) {
			t.Errorf("%s on %q changed machine %s: %+v, then %+v", s.name, s.target(f), id, m, after.Machines[id])
		}
	}
}

// Every step called twice: the first call makes its change, the second
// succeeds and changes nothing more, and no other machine is touched.
func testIdempotent(t *testing.T, e *env) {
	for _, s := range stepCases() {
		t.Run(s.name, func(t *testing.T) {
			f := e.prepareCase(t, s)
			before := e.fixtureWorld(t, f)
			if err := s.run(e.ctx, e, f); err != nil {
				t.Fatalf("first %s: %v", s.name, err)
			}
			s.check(t, e, f, before)
			once := e.fixtureWorld(t, f)
			checkOthers(t, s, f, before, once)
			if err := s.run(e.ctx, e, f); err != nil {
				t.Fatalf("second %s (the step is done already; it must succeed): %v", s.name, err)
			}
			s.check(t, e, f, before)
			if twice := e.fixtureWorld(t, f); !reflect.DeepEqual(twice, once) {
				t.Errorf("the second %s changed the world again:\n got %v\nwant %v", s.name, twice, once)
			}
		})
	}
}

// interruptions is how many points, spread over an uninterrupted call's
// duration, an interrupted call's context ends at (besides before it).
const interruptions = 8

// Every step interrupted by its context ending, before the call and at
// points spread over the time an uninterrupted call of it took, then
// called again as a rerun of the operation would: the rerun succeeds and
// the step's effect is as if it had run once. What an interrupted call
// leaves must already meet the step's invariant (partial), if it has one.
func testInterrupted(t *testing.T, e *env) {
	for _, s := range stepCases() {
		t.Run(s.name, func(t *testing.T) {
			f := e.prepareCase(t, s)
			before := e.fixtureWorld(t, f)
			start := time.Now()
			if err := s.run(e.ctx, e, f); err != nil {
				t.Fatalf("%s: %v", s.name, err)
			}
			took := time.Since(start)
			s.check(t, e, f, before)
			for i := range interruptions {
				cut := took * time.Duration(i) / interruptions
				t.Run(fmt.Sprintf("at%d", i), func(t *testing.T) {
					f := e.prepareCase(t, s)
					before := e.fixtureWorld(t, f)
					ctx, cancel := context.WithTimeout(e.ctx, cut)
					err := s.run(ctx, e, f)
					cancel()
					t.Logf("%s interrupted after %s of %s: %v", s.name, cut, took, err)
					if err == nil {
						// It finished in time: success means the change is made.
						s.check(t, e, f, before)
					}
					if s.partial != nil {
						s.partial(t, e, f)
					}
					if err := s.run(e.ctx, e, f); err != nil {
						t.Fatalf("%s after an interrupted one: %v", s.name, err)
					}
					s.check(t, e, f, before)
					checkOthers(t, s, f, before, e.fixtureWorld(t, f))
				})
			}
		})
	}
}
