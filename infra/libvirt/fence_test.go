package libvirt_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/google/uuid"

	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/repository"
)

// TestAnOlderAttemptChangesNothing: after an adopted job's attempt 2 has
// changed a machine, the same job's attempt 1 (resumed after a pause, its
// guard check passed before the adoption) is refused by the token the
// domain records, and the domain stays as attempt 2 left it.
func TestAnOlderAttemptChangesNothing(t *testing.T) {
	e := newEnv(t, openGuard{})
	ctx := ctxT(t)
	c := cluster{id: uuid.NewString(), op: uuid.NewString()}
	e.track("", c.id)
	m := e.provision(t, c, infra.RoleWorker)
	second := c.call(m.ID)
	second.Attempt = 2
	if err := e.d.PowerOff(ctx, second); err != nil {
		t.Fatalf("power_off by attempt 2: %v", err)
	}
	first := c.call(m.ID)
	steps := map[string]func() error{
		infra.StepPowerOn:        func() error { return e.d.PowerOn(ctx, first) },
		infra.StepAttachISO:      func() error { return e.d.AttachISO(ctx, first, "kubernetes-1.30.2.iso") },
		infra.StepResizeMachine:  func() error { return e.d.ResizeMachine(ctx, first, "large") },
		infra.StepDrainNode:      func() error { return e.d.DrainNode(ctx, first) },
		infra.StepDeleteNode:     func() error { return e.d.DeleteNode(ctx, first) },
		infra.StepDestroyMachine: func() error { return e.d.DestroyMachine(ctx, first) },
		infra.StepProvisionMachine: func() error {
			_, err := e.d.ProvisionMachine(ctx, first, m.ID, infra.RoleWorker, "small", "1.30.2")
			return err
		},
	}
	for name, step := range steps {
		if err := step(); !errors.Is(err, infra.ErrFenced) {
			t.Errorf("%s by attempt 1 after attempt 2: %v; want ErrFenced", name, err)
		}
	}
	got := e.machine(t, m.ID)
	if got.Power != infra.PowerStopped || got.AttachedISO != "" || got.Offering != "small" || got.ClusterID != c.id {
		t.Fatalf("machine after refused calls: %+v; want it as attempt 2 left it", got)
	}
	if st := e.state(t, m.ID); st != golibvirt.DomainShutoff {
		t.Fatalf("domain state %d after a refused power_on; want shut off", st)
	}
	// The same attempt, and a later one, go on.
	if err := e.d.PowerOn(ctx, second); err != nil {
		t.Fatalf("power_on by attempt 2: %v", err)
	}
	third := second
	third.Attempt = 3
	if err := e.d.PowerOff(ctx, third); err != nil {
		t.Fatalf("power_off by attempt 3: %v", err)
	}
}

// TestAJobThatLostItsClusterChangesNothing: once recovery has failed the
// job, the guard refuses its calls before they change anything.
func TestAJobThatLostItsClusterChangesNothing(t *testing.T) {
	e := newEnv(t, nil)
	ctx := ctxT(t)
	c := e.newCluster(t)
	m := e.provision(t, c, infra.RoleWorker)
	if _, err := e.store.FinishJob(ctx, repository.Finish{JobID: c.op, Status: repository.JobFailed, Error: "owner server stopped"}); err != nil {
		t.Fatal(err)
	}
	if err := e.d.PowerOff(ctx, c.call(m.ID)); !errors.Is(err, infra.ErrFenced) {
		t.Fatalf("power_off by a failed job: %v; want ErrFenced", err)
	}
	if err := e.d.DestroyMachine(ctx, c.call(m.ID)); !errors.Is(err, infra.ErrFenced) {
		t.Fatalf("destroy_machine by a failed job: %v; want ErrFenced", err)
	}
	if _, err := e.d.ProvisionMachine(ctx, c.call(""), uuid.NewString(), infra.RoleWorker, "small", "1.30.2"); !errors.Is(err, infra.ErrFenced) {
		t.Fatalf("provision_machine by a failed job: %v; want ErrFenced", err)
	}
	if err := e.d.ConfigureNetwork(ctx, c.call(""), []infra.Rule{{MachineID: m.ID, Kind: "ssh", Port: 22}}); !errors.Is(err, infra.ErrFenced) {
		t.Fatalf("configure_network by a failed job: %v; want ErrFenced", err)
	}
	if st := e.state(t, m.ID); st != golibvirt.DomainRunning {
		t.Fatalf("domain state %d after a refused power_off; want running", st)
	}
	if ms, err := e.d.Machines(ctx, c.id); err != nil || len(ms) != 1 {
		t.Fatalf("machines after a refused provision: %+v, %v", ms, err)
	}
	if rs, err := e.d.Rules(ctx, c.id); err != nil || len(rs) != 0 {
		t.Fatalf("rules after a refused configure_network: %+v, %v", rs, err)
	}
}

// TestDestroyOfAGoneMachineSucceeds, and steps on it are ErrNotFound.
func TestDestroyOfAGoneMachineSucceeds(t *testing.T) {
	e := newEnv(t, nil)
	ctx := ctxT(t)
	c := e.newCluster(t)
	gone := uuid.NewString()
	if err := e.d.DestroyMachine(ctx, c.call(gone)); err != nil {
		t.Fatalf("destroy of a machine that never was: %v", err)
	}
	if err := e.d.PowerOn(ctx, c.call(gone)); !errors.Is(err, infra.ErrNotFound) {
		t.Fatalf("power_on of a gone machine: %v; want ErrNotFound", err)
	}
	if _, err := e.d.Machine(ctx, gone); !errors.Is(err, infra.ErrNotFound) {
		t.Fatalf("Machine of a gone machine: %v; want ErrNotFound", err)
	}
}

// TestJoinNeedsTheVersionsISO: the agent installs what the attached ISO
// holds, so a join without it, or with another version's, fails and the
// machine stays unjoined.
func TestJoinNeedsTheVersionsISO(t *testing.T) {
	e := newEnv(t, nil)
	ctx := ctxT(t)
	c := e.newCluster(t)
	m := e.provision(t, c, infra.RoleWorker)
	if err := e.d.JoinNode(ctx, c.call(m.ID), "1.30.2", infra.NodeCredentials{}); err == nil || !strings.Contains(err.Error(), "no ISO attached") {
		t.Fatalf("join without an ISO: %v; want no ISO attached", err)
	}
	if err := e.d.AttachISO(ctx, c.call(m.ID), "kubernetes-1.29.9.iso"); err != nil {
		t.Fatal(err)
	}
	if err := e.d.JoinNode(ctx, c.call(m.ID), "1.30.2", infra.NodeCredentials{}); err == nil || !strings.Contains(err.Error(), `holds version "1.29.9"`) {
		t.Fatalf("join with another version's ISO: %v", err)
	}
	if got := e.machine(t, m.ID); got.Joined {
		t.Fatalf("machine joined without its version's ISO: %+v", got)
	}
}

// TestExternalMachinesAreValidatedOnce: a free EXTERNAL machine is listed
// with no cluster, validates into one cluster as a worker (again: still
// success), and is unusable for another; a stopped one and a missing one
// are unusable.
func TestExternalMachinesAreValidatedOnce(t *testing.T) {
	e := newEnv(t, nil)
	ctx := ctxT(t)
	free, err := e.d.CreateMachine(ctx, infra.RoleExternal)
	if err != nil {
		t.Fatal(err)
	}
	e.track(free.ID, "")
	all, err := e.d.Machines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var listed *infra.Machine
	for i := range all {
		if all[i].ID == free.ID {
			listed = &all[i]
		}
	}
	if listed == nil || listed.ClusterID != "" || listed.Role != infra.RoleExternal || listed.Power != infra.PowerRunning {
		t.Fatalf("the free machine in Machines(): %+v", listed)
	}
	a, b := e.newCluster(t), e.newCluster(t)
	for range 2 {
		if err := e.d.ValidateNode(ctx, a.call(free.ID)); err != nil {
			t.Fatalf("validate: %v", err)
		}
	}
	if m := e.machine(t, free.ID); m.ClusterID != a.id || m.Role != infra.RoleWorker {
		t.Fatalf("validated machine: %+v", m)
	}
	if err := e.d.ValidateNode(ctx, b.call(free.ID)); !errors.Is(err, infra.ErrUnusable) {
		t.Fatalf("validate into a second cluster: %v; want ErrUnusable", err)
	}
	if err := e.d.ValidateNode(ctx, b.call(uuid.NewString())); !errors.Is(err, infra.ErrUnusable) {
		t.Fatalf("validate of a missing machine: %v; want ErrUnusable", err)
	}
	stopped, err := e.d.CreateMachine(ctx, infra.RoleExternal)
	if err != nil {
		t.Fatal(err)
	}
	e.track(stopped.ID, "")
	if _, err := e.d.SetMachinePower(ctx, stopped.ID, infra.PowerStopped); err != nil {
		t.Fatal(err)
	}
	if err := e.d.ValidateNode(ctx, b.call(stopped.ID)); !errors.Is(err, infra.ErrUnusable) {
		t.Fatalf("validate of a stopped machine: %v; want ErrUnusable", err)
	}
	if m := e.machine(t, stopped.ID); m.ClusterID != "" {
		t.Fatalf("a refused validate took the machine: %+v", m)
	}
}

// TestMachinesListsClusterdDomainsOldestFirst: only domains carrying
// clusterd's metadata are machines (a foreign domain named like one is
// not), by cluster, oldest first.
func TestMachinesListsClusterdDomainsOldestFirst(t *testing.T) {
	e := newEnv(t, nil)
	ctx := ctxT(t)
	foreign := uuid.NewString()
	e.track(foreign, "")
	if _, err := e.raw.DomainDefineXML("<domain type='test'><name>clusterd-" + foreign + "</name><memory unit='MiB'>64</memory><os><type>hvm</type></os></domain>"); err != nil {
		t.Fatal(err)
	}
	c, other := e.newCluster(t), e.newCluster(t)
	// Created in the reverse of their ids' order, so that oldest first is
	// not by id.
	ids := []string{uuid.NewString(), uuid.NewString(), uuid.NewString()}
	slices.Sort(ids)
	slices.Reverse(ids)
	var want []string
	for _, id := range ids {
		want = append(want, e.provisionID(t, c, infra.RoleWorker, id).ID)
		time.Sleep(2 * time.Millisecond) // distinct creation times
	}
	o := e.provision(t, other, infra.RoleControl)
	ms, err := e.d.Machines(ctx, c.id)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range ms {
		got = append(got, m.ID)
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("Machines(c) = %v; want %v", got, want)
	}
	ms, err = e.d.Machines(ctx, c.id, other.id)
	if err != nil || len(ms) != 4 || ms[3].ID != o.ID {
		t.Fatalf("Machines(c, other) = %+v, %v; want c's three then other's", ms, err)
	}
	if _, err := e.d.Machine(ctx, foreign); !errors.Is(err, infra.ErrNotFound) {
		t.Fatalf("Machine(a domain without clusterd metadata): %v; want ErrNotFound", err)
	}
}
