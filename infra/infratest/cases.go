package infratest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/clusterd/clusterd/infra"
)

// machineSteps calls every step that acts on one machine with call, and
// returns each one's error by step name.
func machineSteps(ctx context.Context, e *env, call infra.Call) map[string]error {
	d := e.infra()
	v := e.h.Versions[1]
	return map[string]error{
		infra.StepPowerOff:       d.PowerOff(ctx, call),
		infra.StepPowerOn:        d.PowerOn(ctx, call),
		infra.StepResizeMachine:  d.ResizeMachine(ctx, call, e.h.Offerings[1]),
		infra.StepAttachISO:      d.AttachISO(ctx, call, iso(v)),
		infra.StepDetachISO:      d.DetachISO(ctx, call),
		infra.StepJoinNode:       d.JoinNode(ctx, call, v, infra.NodeCredentials{}),
		infra.StepDrainNode:      d.DrainNode(ctx, call),
		infra.StepUncordonNode:   d.UncordonNode(ctx, call),
		infra.StepUpgradeNode:    d.UpgradeNode(ctx, call, v),
		infra.StepDeleteNode:     d.DeleteNode(ctx, call),
		infra.StepDestroyMachine: d.DestroyMachine(ctx, call),
	}
}

// everyStep calls every step once on a ready fixture's machines with the
// calls that call makes, each asking for a visible change, and returns each
// one's error by step name.
func everyStep(ctx context.Context, e *env, f fixture, call func(machine string) infra.Call) map[string]error {
	d := e.infra()
	v := e.h.Versions[1]
	validate := f.external
	if validate == "" {
		validate = f.worker
	}
	_, provision := d.ProvisionMachine(ctx, call(""), f.spare, infra.RoleWorker, e.h.Offerings[0], e.h.Versions[0])
	_, wait := d.WaitAPI(ctx, call(""))
	return map[string]error{
		infra.StepProvisionMachine: provision,
		infra.StepPowerOff:         d.PowerOff(ctx, call(f.worker)),
		infra.StepPowerOn:          d.PowerOn(ctx, call(f.control)),
		infra.StepResizeMachine:    d.ResizeMachine(ctx, call(f.worker), e.h.Offerings[1]),
		infra.StepAttachISO:        d.AttachISO(ctx, call(f.worker), iso(v)),
		infra.StepDetachISO:        d.DetachISO(ctx, call(f.control)),
		infra.StepConfigureNetwork: d.ConfigureNetwork(ctx, call(""), []infra.Rule{{MachineID: f.worker, Kind: "nodeport", Port: 30080}}),
		infra.StepJoinNode:         d.JoinNode(ctx, call(f.worker), v, infra.NodeCredentials{}),
		infra.StepWaitAPI:          wait,
		infra.StepFetchKubeconfig:  d.FetchKubeconfig(ctx, call("")),
		infra.StepDeployProvider:   d.DeployProvider(ctx, call("")),
		infra.StepDeployAutoscaler: d.DeployAutoscaler(ctx, call(""), true, 1, 3),
		infra.StepDrainNode:        d.DrainNode(ctx, call(f.worker)),
		infra.StepUncordonNode:     d.UncordonNode(ctx, call(f.worker)),
		infra.StepUpgradeNode:      d.UpgradeNode(ctx, call(f.control), v),
		infra.StepValidateNode:     d.ValidateNode(ctx, call(validate)),
		infra.StepDeleteNode:       d.DeleteNode(ctx, call(f.worker)),
		infra.StepDestroyMachine:   d.DestroyMachine(ctx, call(f.control)),
	}
}

// Steps on a machine that does not exist are infra.ErrNotFound and create
// nothing; so is reading it.
func testNotFound(t *testing.T, e *env) {
	f := e.cluster(t)
	unknown := uuid.NewString()
	if m, err := e.infra().Machine(e.ctx, unknown); !errors.Is(err, infra.ErrNotFound) {
		t.Errorf("Machine(unknown) = %+v, %v; want infra.ErrNotFound", m, err)
	}
	before := e.snapshot(t, append(f.machines(), unknown), f.call.ClusterID)
	steps := machineSteps(e.ctx, e, f.on(unknown))
	delete(steps, infra.StepDestroyMachine) // a machine that is gone is destroyed (testDestroy)
	for _, step := range slices.Sorted(maps.Keys(steps)) {
		if err := steps[step]; !errors.Is(err, infra.ErrNotFound) {
			t.Errorf("%s of an unknown machine: err = %v; want infra.ErrNotFound", step, err)
		}
	}
	if after := e.snapshot(t, append(f.machines(), unknown), f.call.ClusterID); !reflect.DeepEqual(after, before) {
		t.Errorf("steps on an unknown machine changed the world:\n got %v\nwant %v", after, before)
	}
}

// ValidateNode of anything but a free, running EXTERNAL machine is
// infra.ErrUnusable and changes nothing; of two clusters validating one free
// machine at once, exactly one gets it.
func testUnusable(t *testing.T, e *env) {
	a, b := e.cluster(t), e.cluster(t)
	refuse := func(t *testing.T, what, id string) {
		t.Helper()
		before := e.snapshot(t, append(b.machines(), id), a.call.ClusterID, b.call.ClusterID)
		if err := e.infra().ValidateNode(e.ctx, a.on(id)); !errors.Is(err, infra.ErrUnusable) {
			t.Errorf("validate_node of %s: err = %v; want infra.ErrUnusable", what, err)
		}
		if after := e.snapshot(t, append(b.machines(), id), a.call.ClusterID, b.call.ClusterID); !reflect.DeepEqual(after, before) {
			t.Errorf("validate_node of %s changed the world:\n got %v\nwant %v", what, after, before)
		}
	}
	t.Run("unknown machine", func(t *testing.T) { refuse(t, "an unknown machine", uuid.NewString()) })
	t.Run("another cluster's worker", func(t *testing.T) { refuse(t, "another cluster's worker", b.worker) })
	t.Run("another cluster's control machine", func(t *testing.T) { refuse(t, "another cluster's control machine", b.control) })
	t.Run("stopped EXTERNAL machine", func(t *testing.T) {
		id := e.external(t)
		must(t, "power_off of a free machine", e.infra().PowerOff(e.ctx, a.on(id)))
		refuse(t, "a stopped EXTERNAL machine", id)
	})
	t.Run("two clusters race for one machine", func(t *testing.T) {
		race(t, e, a, b, e.infra(), e.infra(), 5)
	})
	t.Run("two servers race for one machine", func(t *testing.T) {
		if e.h.Peer == nil {
			t.Skip("the harness has no second server's driver (Harness.Peer is nil)")
		}
		race(t, e, a, b, e.infra(), e.h.Peer, 20)
	})
}

// race runs validate_node of one free machine for clusters a (through
// driver da) and b (through db) at the same moment, rounds times: exactly
// one wins each round, the other gets infra.ErrUnusable, and the machine
// is a worker of the winner's cluster.
func race(t *testing.T, e *env, a, b fixture, da, db infra.Infrastructure, rounds int) {
	t.Helper()
	twoWinners := 0
	for round := range rounds {
		id := e.external(t)
		errs := make([]error, 2)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i, c := range []fixture{a, b} {
			d := []infra.Infrastructure{da, db}[i]
			wg.Go(func() {
				<-start
				errs[i] = d.ValidateNode(e.ctx, c.on(id))
			})
		}
		close(start)
		wg.Wait()
		won := -1
		for i, err := range errs {
			switch {
			case err == nil && won < 0:
				won = i
			case err == nil:
				twoWinners++
				t.Errorf("round %d: both clusters validated machine %s", round, id)
			case !errors.Is(err, infra.ErrUnusable):
				t.Errorf("round %d: the losing validate_node: err = %v; want infra.ErrUnusable", round, err)
			}
		}
		if won < 0 {
			t.Fatalf("round %d: neither cluster validated machine %s: %v", round, id, errs)
		}
		winner := []fixture{a, b}[won].call.ClusterID
		if m := e.machine(t, id); m.ClusterID != winner || m.Role != infra.RoleWorker {
			t.Errorf("round %d: machine %+v; want a worker of the winner %s", round, m, winner)
		}
	}
	if twoWinners > 0 {
		t.Logf("%d of %d rounds had two winners", twoWinners, rounds)
	}
}

// A job's steps on a machine of another cluster are infra.ErrUnusable and
// leave that cluster alone.
func testOtherClustersMachines(t *testing.T, e *env) {
	a, b := e.cluster(t), e.cluster(t)
	e.ready(t, a)
	e.ready(t, b)
	for _, target := range []string{b.worker, b.control} {
		before := e.snapshot(t, b.machines(), b.call.ClusterID)
		steps := machineSteps(e.ctx, e, a.on(target))
		for _, step := range slices.Sorted(maps.Keys(steps)) {
			if err := steps[step]; !errors.Is(err, infra.ErrUnusable) {
				t.Errorf("%s of another cluster's machine: err = %v; want infra.ErrUnusable", step, err)
			}
		}
		if after := e.snapshot(t, b.machines(), b.call.ClusterID); !reflect.DeepEqual(after, before) {
			t.Errorf("steps of cluster %s on cluster %s's machine changed it:\n got %v\nwant %v", a.call.ClusterID, b.call.ClusterID, after, before)
		}
	}
}

// Every step of a job that does not hold its cluster (at the call's
// attempt) is refused with infra.ErrFenced and changes nothing, however the
// job lost it; the holder's steps go through.
func testFencing(t *testing.T, e *env) {
	cases := []struct {
		name string
		// lose takes the cluster from f's job and returns the refused
		// call and the current holder's (none when nothing holds it).
		lose func(t *testing.T, f fixture) (refused, holder infra.Call)
	}{
		{"job ended", func(t *testing.T, f fixture) (infra.Call, infra.Call) {
			must(t, "release", e.h.Release(e.ctx, f.call))
			return f.call, infra.Call{}
		}},
		{"job failed, the cluster still names it", func(t *testing.T, f fixture) (infra.Call, infra.Call) {
			must(t, "fail", e.h.Fail(e.ctx, f.call))
			return f.call, infra.Call{}
		}},
		{"another job took the cluster", func(t *testing.T, f fixture) (infra.Call, infra.Call) {
			next, err := e.hold(e.ctx, f.call.ClusterID)
			must(t, "hold", err)
			return f.call, next
		}},
		{"job adopted at a later attempt", func(t *testing.T, f fixture) (infra.Call, infra.Call) {
			adopted, err := e.h.Adopt(e.ctx, f.call)
			must(t, "adopt", err)
			if adopted.Attempt <= f.call.Attempt {
				t.Fatalf("Adopt returned attempt %d after %d; want a later one", adopted.Attempt, f.call.Attempt)
			}
			return f.call, adopted
		}},
		{"job adopted twice", func(t *testing.T, f fixture) (infra.Call, infra.Call) {
			once, err := e.h.Adopt(e.ctx, f.call)
			must(t, "adopt", err)
			twice, err := e.h.Adopt(e.ctx, once)
			must(t, "adopt again", err)
			return once, twice
		}},
		{"no job", func(t *testing.T, f fixture) (infra.Call, infra.Call) {
			return infra.Call{ClusterID: f.call.ClusterID}, f.call
		}},
		{"another cluster's job", func(t *testing.T, f fixture) (infra.Call, infra.Call) {
			other, err := e.hold(e.ctx, uuid.NewString())
			must(t, "hold another cluster", err)
			return infra.Call{ClusterID: f.call.ClusterID, Operation: other.Operation, Attempt: other.Attempt}, f.call
		}},
		{"no such cluster", func(t *testing.T, f fixture) (infra.Call, infra.Call) {
			return infra.Call{ClusterID: uuid.NewString(), Operation: f.call.Operation, Attempt: f.call.Attempt}, f.call
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var ext string
			if e.h.External != nil {
				ext = e.external(t)
			}
			f := e.cluster(t)
			f.external = ext
			e.ready(t, f)
			refused, holder := tc.lose(t, f)
			before := e.fixtureWorld(t, f, refused.ClusterID)
			steps := everyStep(e.ctx, e, f, func(m string) infra.Call { c := refused; c.MachineID = m; return c })
			for _, step := range slices.Sorted(maps.Keys(steps)) {
				if err := steps[step]; !errors.Is(err, infra.ErrFenced) {
					t.Errorf("%s of a job that does not hold the cluster: err = %v; want infra.ErrFenced", step, err)
				}
			}
			if after := e.fixtureWorld(t, f, refused.ClusterID); !reflect.DeepEqual(after, before) {
				t.Errorf("refused steps changed the world:\n got %v\nwant %v", after, before)
			}
			if holder.Operation == "" {
				return
			}
			// The cluster's holder is not refused.
			holder.MachineID = f.worker
			must(t, "the holder's power_off", e.infra().PowerOff(e.ctx, holder))
			if m := e.machine(t, f.worker); m.Power != infra.PowerStopped {
				t.Errorf("the holder's power_off did not stop the machine: %+v", m)
			}
		})
	}
}

// Machines lists exactly the machines of the clusters asked (every machine
// when none is), oldest first; Machine reads what Machines lists; Rules lists
// a cluster's rules and no other's.
func testListing(t *testing.T, e *env) {
	var ext string
	if e.h.External != nil {
		ext = e.external(t)
	}
	a := e.cluster(t)
	b := e.cluster(t)
	created := []string{a.control, a.worker, b.control, b.worker}
	if ext != "" {
		created = append([]string{ext}, created...)
	}
	must(t, "configure_network", e.infra().ConfigureNetwork(e.ctx, a.call, baseRules(a)))

	checkListing(t, "Machines(a)", e.list(t, a.call.ClusterID), []string{a.control, a.worker}, created, false)
	checkListing(t, "Machines(b)", e.list(t, b.call.ClusterID), []string{b.control, b.worker}, created, false)
	checkListing(t, "Machines(b, a)", e.list(t, b.call.ClusterID, a.call.ClusterID), []string{a.control, a.worker, b.control, b.worker}, created, false)
	checkListing(t, "Machines()", e.list(t), created, created, true)
	if got := e.list(t, uuid.NewString()); len(got) != 0 {
		t.Errorf("Machines(a cluster with none) = %+v; want none", got)
	}
	for _, m := range e.list(t) {
		if slices.Contains(created, m.ID) {
			if got := e.machine(t, m.ID); got != m {
				t.Errorf("Machine(%s) = %+v; Machines() lists %+v", m.ID, got, m)
			}
		}
	}
	for _, m := range e.list(t, a.call.ClusterID) {
		if m.ClusterID != a.call.ClusterID {
			t.Errorf("Machines(a) lists %+v of another cluster", m)
		}
	}
	if ext != "" {
		if m := e.machine(t, ext); m.ClusterID != "" || m.Role != infra.RoleExternal || m.Power != infra.PowerRunning {
			t.Errorf("Harness.External made %+v; want a free, running %s machine", m, infra.RoleExternal)
		}
	}
	if got, want := e.rules(t, a.call.ClusterID), sortRules(baseRules(a)); !reflect.DeepEqual(got, want) {
		t.Errorf("Rules(a) = %+v; want %+v", got, want)
	}
	if got := e.rules(t, b.call.ClusterID); len(got) != 0 {
		t.Errorf("Rules(b) = %+v; want none (only a's rules were configured)", got)
	}
	if got := e.rules(t, uuid.NewString()); len(got) != 0 {
		t.Errorf("Rules(a cluster with none) = %+v; want none", got)
	}
}

// checkListing checks that got lists exactly want (only the machines of
// created, when others may be listed too: all), each once, oldest first:
// create times never go back, and machines created one after the other are
// listed in that order unless their create times are equal.
func checkListing(t *testing.T, what string, got []infra.Machine, want, created []string, all bool) {
	t.Helper()
	if all {
		got = slices.DeleteFunc(slices.Clone(got), func(m infra.Machine) bool { return !slices.Contains(created, m.ID) })
	}
	if g := slices.Sorted(slices.Values(ids(got))); !reflect.DeepEqual(g, slices.Sorted(slices.Values(want))) {
		t.Errorf("%s lists %v; want %v, each once", what, ids(got), want)
		return
	}
	for i, m := range got {
		if m.CreateTime.IsZero() {
			t.Errorf("%s: machine %s has no create time", what, m.ID)
		}
		for _, n := range got[i+1:] {
			switch {
			case m.CreateTime.After(n.CreateTime):
				t.Errorf("%s lists %s (created %s) before %s (created %s); want oldest first", what, m.ID, m.CreateTime, n.ID, n.CreateTime)
			case m.CreateTime.Before(n.CreateTime) && slices.Index(created, m.ID) > slices.Index(created, n.ID):
				t.Errorf("%s: machine %s, made after %s, has the earlier create time", what, m.ID, n.ID)
			}
		}
	}
}

// oldRules and newRules are two sets of a fixture's rules that share one
// rule: converging from one to the other adds one and removes one.
func oldRules(f fixture) []infra.Rule {
	return []infra.Rule{{MachineID: f.control, Kind: "api", Port: 6443}, {MachineID: f.worker, Kind: "ssh", Port: 22}}
}

func newRules(f fixture) []infra.Rule {
	return []infra.Rule{{MachineID: f.control, Kind: "api", Port: 6443}, {MachineID: f.worker, Kind: "ssh", Port: 2222}}
}

// addedBeforeRemoved says what is wrong with rules read while a
// configure_network converged from one set to another, adding before
// removing: they hold every rule of one of the sets (all of from while it
// adds, all of to while it removes), and no rule of neither. It is empty
// when nothing is wrong.
func addedBeforeRemoved(rules, from, to []infra.Rule) string {
	all := func(want []infra.Rule) bool {
		return !slices.ContainsFunc(want, func(r infra.Rule) bool { return !slices.Contains(rules, r) })
	}
	if !all(from) && !all(to) {
		return fmt.Sprintf("rules %+v, holding neither all of %+v nor all of %+v: something was removed before all was added", rules, from, to)
	}
	for _, r := range rules {
		if !slices.Contains(from, r) && !slices.Contains(to, r) {
			return fmt.Sprintf("rules %+v, with %+v that neither %+v nor %+v has", rules, r, from, to)
		}
	}
	return ""
}

// ConfigureNetwork converges a cluster's rules to exactly the ones asked,
// adding the missing ones before removing the extra ones, which a reader
// sees (addedBeforeRemoved); the rules of other clusters are left alone.
func testConfigureNetwork(t *testing.T, e *env) {
	a, b := e.cluster(t), e.cluster(t)
	one, two := oldRules(a), newRules(a)
	must(t, "configure_network of b", e.infra().ConfigureNetwork(e.ctx, b.call, baseRules(b)))
	must(t, "configure_network", e.infra().ConfigureNetwork(e.ctx, a.call, one))
	bRules := e.rules(t, b.call.ClusterID)

	stop := make(chan struct{})
	var (
		wg    sync.WaitGroup
		reads int
		bad   []string
	)
	wg.Go(func() {
		for {
			rs, err := e.infra().Rules(e.ctx, a.call.ClusterID)
			reads++
			if err != nil {
				bad = append(bad, fmt.Sprintf("Rules: %v", err))
			} else if msg := addedBeforeRemoved(rs, one, two); msg != "" {
				bad = append(bad, "read "+msg)
			}
			select {
			case <-stop:
				return
			default:
			}
		}
	})
	for i := range 20 {
		want := [][]infra.Rule{two, one}[i%2]
		if err := e.infra().ConfigureNetwork(e.ctx, a.call, want); err != nil {
			t.Errorf("configure_network %d: %v", i, err)
		}
		if got := e.rules(t, a.call.ClusterID); !reflect.DeepEqual(got, sortRules(want)) {
			t.Errorf("after configure_network %d: rules %+v; want %+v", i, got, sortRules(want))
		}
	}
	close(stop)
	wg.Wait()
	for _, s := range bad[:min(len(bad), 5)] {
		t.Error(s)
	}
	t.Logf("%d reads of the rules while they were reconfigured", reads)
	if got := e.rules(t, b.call.ClusterID); !reflect.DeepEqual(got, bRules) {
		t.Errorf("configuring a's rules changed b's: %+v, then %+v", bRules, got)
	}
	must(t, "configure_network to none", e.infra().ConfigureNetwork(e.ctx, a.call, nil))
	if got := e.rules(t, a.call.ClusterID); len(got) != 0 {
		t.Errorf("after configure_network to none: rules %+v; want none", got)
	}
}

// DestroyMachine of a machine that is gone, or never was, succeeds; a
// destroyed machine is gone from every read.
func testDestroy(t *testing.T, e *env) {
	f := e.cluster(t)
	e.ready(t, f)
	before := e.snapshot(t, f.machines(), f.call.ClusterID)
	if err := e.infra().DestroyMachine(e.ctx, f.on(uuid.NewString())); err != nil {
		t.Errorf("destroy_machine of a machine that never was: %v; want success", err)
	}
	if after := e.snapshot(t, f.machines(), f.call.ClusterID); !reflect.DeepEqual(after, before) {
		t.Errorf("destroying a machine that never was changed the world:\n got %v\nwant %v", after, before)
	}
	must(t, "destroy_machine", e.infra().DestroyMachine(e.ctx, f.on(f.worker)))
	checkGone(t, e, f.worker, f.call.ClusterID)
	for _, m := range e.list(t) {
		if m.ID == f.worker {
			t.Errorf("Machines() still lists the destroyed machine: %+v", m)
		}
	}
	if err := e.infra().DestroyMachine(e.ctx, f.on(f.worker)); err != nil {
		t.Errorf("destroy_machine of a destroyed machine: %v; want success", err)
	}
	if got := ids(e.list(t, f.call.ClusterID)); !reflect.DeepEqual(got, []string{f.control}) {
		t.Errorf("Machines(cluster) after destroying the worker = %v; want the control machine %s", got, f.control)
	}
}

// DeleteNode makes a cluster's machine a free EXTERNAL machine, which
// another cluster can then take.
func testDeleteNode(t *testing.T, e *env) {
	a, b := e.cluster(t), e.cluster(t)
	e.ready(t, a)
	must(t, "delete_node", e.infra().DeleteNode(e.ctx, a.on(a.worker)))
	checkFree(t, e, a.worker, a.call.ClusterID)
	if got := ids(e.list(t, a.call.ClusterID)); !reflect.DeepEqual(got, []string{a.control}) {
		t.Errorf("Machines(a) after delete_node = %v; want the control machine %s", got, a.control)
	}
	must(t, "validate_node of the freed machine by another cluster", e.infra().ValidateNode(e.ctx, b.on(a.worker)))
	if m := e.machine(t, a.worker); m.ClusterID != b.call.ClusterID || m.Role != infra.RoleWorker {
		t.Errorf("after validate_node by b: %+v; want a worker of %s", m, b.call.ClusterID)
	}
	if got := ids(e.list(t, b.call.ClusterID)); !slices.Contains(got, a.worker) {
		t.Errorf("Machines(b) = %v; want it to list the machine it took, %s", got, a.worker)
	}
	must(t, "attach_iso to the taken machine", e.infra().AttachISO(e.ctx, b.on(a.worker), iso(e.h.Versions[1])))
	must(t, "join_node of the taken machine", e.infra().JoinNode(e.ctx, b.on(a.worker), e.h.Versions[1], infra.NodeCredentials{}))
	if m := e.machine(t, a.worker); !m.Joined || m.KubernetesVersion != e.h.Versions[1] {
		t.Errorf("after join_node by b: %+v; want joined at %s", m, e.h.Versions[1])
	}
}

// concurrency is how many clusters the concurrent case drives at once.
const concurrency = 8

// Steps of different clusters run side by side: each cluster's sequence
// succeeds, and the listings agree with what each did.
func testConcurrent(t *testing.T, e *env) {
	type result struct {
		f   fixture
		err error
	}
	results := make([]result, concurrency)
	var wg sync.WaitGroup
	for i := range concurrency {
		wg.Go(func() {
			f, err := e.concurrentCluster(i)
			results[i] = result{f, err}
		})
	}
	wg.Wait()
	var clusters, all []string
	for i, r := range results {
		if r.err != nil {
			t.Fatalf("cluster %d: %v", i, r.err)
		}
		clusters = append(clusters, r.f.call.ClusterID)
		all = append(all, r.f.control, r.f.worker)
	}
	var inClusters []string
	for i, r := range results {
		f := r.f
		want := []string{f.control, f.worker}
		switch i % 3 {
		case 0:
			want = want[:1]
			checkGone(t, e, f.worker, f.call.ClusterID)
		case 1:
			want = want[:1]
			checkFree(t, e, f.worker, f.call.ClusterID)
		}
		inClusters = append(inClusters, want...)
		ms := e.list(t, f.call.ClusterID)
		if !reflect.DeepEqual(ids(ms), want) {
			t.Errorf("Machines(cluster %d) = %v; want %v", i, ids(ms), want)
			continue
		}
		for _, m := range ms {
			wantOff := e.h.Offerings[0]
			if m.ID == f.worker {
				wantOff = e.h.Offerings[1]
			}
			if !m.Joined || m.Cordoned || m.Power != infra.PowerRunning || m.KubernetesVersion != e.h.Versions[1] || m.Offering != wantOff {
				t.Errorf("cluster %d: machine %+v; want running, joined, uncordoned at %s, offering %s", i, m, e.h.Versions[1], wantOff)
			}
		}
		if got, want := e.rules(t, f.call.ClusterID), sortRules(controlRules(f)); !reflect.DeepEqual(got, want) {
			t.Errorf("Rules(cluster %d) = %+v; want %+v", i, got, want)
		}
	}
	got := e.list(t, clusters...)
	if g := slices.Sorted(slices.Values(ids(got))); !reflect.DeepEqual(g, slices.Sorted(slices.Values(inClusters))) {
		t.Errorf("Machines(every cluster) = %v; want %v", ids(got), inClusters)
	}
	var listed []string
	for _, m := range e.list(t) {
		if slices.Contains(all, m.ID) {
			listed = append(listed, m.ID)
		}
	}
	var exist []string
	for i, r := range results {
		exist = append(exist, r.f.control)
		if i%3 != 0 {
			exist = append(exist, r.f.worker)
		}
	}
	if g := slices.Sorted(slices.Values(listed)); !reflect.DeepEqual(g, slices.Sorted(slices.Values(exist))) {
		t.Errorf("Machines() lists %v of the clusters' machines; want %v, each once", listed, exist)
	}
}

// controlRules are the rules the concurrent case gives a cluster.
func controlRules(f fixture) []infra.Rule {
	return []infra.Rule{{MachineID: f.control, Kind: "api", Port: 6443}, {MachineID: f.control, Kind: "ssh", Port: 22}}
}

// concurrentCluster creates a cluster and runs a create, a resize and an
// upgrade of it, then destroys (i%3 == 0) or deletes (i%3 == 1) its worker,
// or keeps it. It runs on a goroutine of its own, so it returns its first
// error instead of failing the test.
func (e *env) concurrentCluster(i int) (fixture, error) {
	ctx, d := e.ctx, e.infra()
	id := uuid.NewString()
	call, err := e.hold(ctx, id)
	if err != nil {
		return fixture{}, fmt.Errorf("hold: %w", err)
	}
	f := fixture{call: call, control: uuid.NewString(), worker: uuid.NewString()}
	e.use([]string{f.control, f.worker})
	v0, v1 := e.h.Versions[0], e.h.Versions[1]
	steps := []struct {
		name string
		do   func() error
	}{
		{"provision control", func() error {
			_, err := d.ProvisionMachine(ctx, call, f.control, infra.RoleControl, e.h.Offerings[0], v0)
			return err
		}},
		{"provision worker", func() error {
			_, err := d.ProvisionMachine(ctx, call, f.worker, infra.RoleWorker, e.h.Offerings[0], v0)
			return err
		}},
		{"attach control", func() error { return d.AttachISO(ctx, f.on(f.control), iso(v0)) }},
		{"attach worker", func() error { return d.AttachISO(ctx, f.on(f.worker), iso(v0)) }},
		{"join control", func() error { return d.JoinNode(ctx, f.on(f.control), v0, infra.NodeCredentials{}) }},
		{"join worker", func() error { return d.JoinNode(ctx, f.on(f.worker), v0, infra.NodeCredentials{}) }},
		{"configure network", func() error { return d.ConfigureNetwork(ctx, call, controlRules(f)) }},
		{"wait api", func() error { _, err := d.WaitAPI(ctx, call); return err }},
		{"power off worker", func() error { return d.PowerOff(ctx, f.on(f.worker)) }},
		{"resize worker", func() error { return d.ResizeMachine(ctx, f.on(f.worker), e.h.Offerings[1]) }},
		{"power on worker", func() error { return d.PowerOn(ctx, f.on(f.worker)) }},
	}
	for _, m := range []string{f.control, f.worker} {
		steps = append(steps, []struct {
			name string
			do   func() error
		}{
			{"drain " + m, func() error { return d.DrainNode(ctx, f.on(m)) }},
			{"attach " + m, func() error { return d.AttachISO(ctx, f.on(m), iso(v1)) }},
			{"upgrade " + m, func() error { return d.UpgradeNode(ctx, f.on(m), v1) }},
		}...)
	}
	switch i % 3 {
	case 0:
		steps = append(steps, struct {
			name string
			do   func() error
		}{"destroy worker", func() error { return d.DestroyMachine(ctx, f.on(f.worker)) }})
	case 1:
		steps = append(steps, struct {
			name string
			do   func() error
		}{"delete worker's node", func() error { return d.DeleteNode(ctx, f.on(f.worker)) }})
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			return f, fmt.Errorf("%s: %w", s.name, err)
		}
	}
	return f, nil
}
