package sim_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/infra/sim"
	"github.com/clusterd/clusterd/infra/sim/fault"
)

func inject(t *testing.T, s *sim.Simulator, f sim.Fault) sim.Fault {
	t.Helper()
	got, err := s.InjectFault(f)
	if err != nil {
		t.Fatalf("InjectFault(%+v): %v", f, err)
	}
	return got
}

// async runs a step in the background; its error arrives on the channel.
func async(fn func() error) <-chan error {
	done := make(chan error, 1)
	go func() { done <- fn() }()
	return done
}

func isStep(step string) func(sim.Held) bool {
	return func(h sim.Held) bool { return h.Step == step }
}

func TestFailFaultFiresCountTimes(t *testing.T) {
	forEachBackend(t, sim.Config{}, func(t *testing.T, s *sim.Simulator) {
		ctx := ctxT(t)
		c := newCluster(t, s)
		f := inject(t, s, sim.Fault{Step: infra.StepPowerOff, Mode: sim.ModeFail, Count: 2})
		if !strings.HasPrefix(f.ID, "f-") {
			t.Errorf("fault id = %q; want f-<n>", f.ID)
		}
		for i := range 2 {
			err := s.PowerOff(ctx, c.call(c.worker))
			if !errors.Is(err, sim.ErrInjected) || !strings.Contains(err.Error(), infra.StepPowerOff) {
				t.Errorf("run %d: err = %v; want ErrInjected naming %s", i, err, infra.StepPowerOff)
			}
			if m := machine(t, s, c.worker); m.Power != infra.PowerRunning {
				t.Errorf("run %d: a failed step changed the machine: %s", i, m.Power)
			}
		}
		if err := s.PowerOff(ctx, c.call(c.worker)); err != nil {
			t.Errorf("third run, fault spent: %v", err)
		}
		if fs := s.Faults(); len(fs) != 0 {
			t.Errorf("faults after firing their count = %+v; want none", fs)
		}
	})
}

func TestFaultUntilCleared(t *testing.T) {
	forEachBackend(t, sim.Config{}, func(t *testing.T, s *sim.Simulator) {
		ctx := ctxT(t)
		c := newCluster(t, s)
		f := inject(t, s, sim.Fault{Step: infra.StepJoinNode, Mode: sim.ModeFail})
		for i := range 3 {
			if err := s.JoinNode(ctx, c.call(c.worker), "1.30.2", infra.NodeCredentials{}); !errors.Is(err, sim.ErrInjected) {
				t.Errorf("run %d: err = %v; want ErrInjected", i, err)
			}
		}
		if fs := s.Faults(); len(fs) != 1 || fs[0] != f {
			t.Errorf("Faults() = %+v; want [%+v]", fs, f)
		}
		s.ClearFaults()
		if err := s.JoinNode(ctx, c.call(c.worker), "1.30.2", infra.NodeCredentials{}); err != nil {
			t.Errorf("after ClearFaults: %v", err)
		}
	})
}

func TestOldestMatchingFaultFiresFirst(t *testing.T) {
	forEachBackend(t, sim.Config{}, func(t *testing.T, s *sim.Simulator) {
		ctx := ctxT(t)
		c := newCluster(t, s)
		first := inject(t, s, sim.Fault{Step: infra.StepDrainNode, Mode: sim.ModeFail, Count: 1})
		inject(t, s, sim.Fault{Step: infra.StepPowerOn, Mode: sim.ModeFail}) // another step
		second := inject(t, s, sim.Fault{Step: infra.StepDrainNode, Mode: sim.ModeFail, Count: 1})
		for _, want := range []sim.Fault{first, second} {
			err := s.DrainNode(ctx, c.call(c.worker))
			if !errors.Is(err, sim.ErrInjected) || !strings.Contains(err.Error(), want.ID) {
				t.Errorf("err = %v; want fault %s to fire", err, want.ID)
			}
		}
		if err := s.DrainNode(ctx, c.call(c.worker)); err != nil {
			t.Errorf("both faults spent: %v", err)
		}
	})
}

func TestClusterFaultSparesOtherClusters(t *testing.T) {
	forEachBackend(t, sim.Config{}, func(t *testing.T, s *sim.Simulator) {
		ctx := ctxT(t)
		a, b := newCluster(t, s), newCluster(t, s)
		inject(t, s, sim.Fault{Step: infra.StepUpgradeNode, Mode: sim.ModeFail, ClusterID: a.id})
		if err := s.UpgradeNode(ctx, b.call(b.worker), "1.31.0"); err != nil {
			t.Errorf("other cluster's step: %v", err)
		}
		if err := s.UpgradeNode(ctx, a.call(a.worker), "1.31.0"); !errors.Is(err, sim.ErrInjected) {
			t.Errorf("the fault's cluster: err = %v; want ErrInjected", err)
		}
	})
}

func TestDelayFault(t *testing.T) {
	forEachBackend(t, sim.Config{}, func(t *testing.T, s *sim.Simulator) {
		ctx := ctxT(t)
		c := newCluster(t, s)
		const delay = 30 * time.Millisecond
		inject(t, s, sim.Fault{Step: infra.StepAttachISO, Mode: sim.ModeDelay, Delay: delay, Count: 1})
		start := time.Now()
		if err := s.AttachISO(ctx, c.call(c.worker), "a.iso"); err != nil {
			t.Fatalf("delayed step: %v", err)
		}
		if took := time.Since(start); took < delay {
			t.Errorf("delayed step took %v; want at least %v", took, delay)
		}
		if m := machine(t, s, c.worker); m.AttachedISO != "a.iso" {
			t.Errorf("delayed step did not run: ISO %q", m.AttachedISO)
		}

		// A delay longer than the caller's deadline ends with the deadline.
		inject(t, s, sim.Fault{Step: infra.StepDetachISO, Mode: sim.ModeDelay, Delay: time.Hour})
		short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		defer cancel()
		if err := s.DetachISO(short, c.call(c.worker)); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("step delayed past its deadline: err = %v; want DeadlineExceeded", err)
		}
		if m := machine(t, s, c.worker); m.AttachedISO != "a.iso" {
			t.Errorf("a step that timed out in its delay ran: ISO %q", m.AttachedISO)
		}
	})
}

func TestHoldBlocksUntilReleased(t *testing.T) {
	since := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	cfg := sim.Config{Clock: func() time.Time { return since }}
	forEachBackend(t, cfg, func(t *testing.T, s *sim.Simulator) {
		ctx := ctxT(t)
		c := newCluster(t, s)
		f := inject(t, s, sim.Fault{Step: infra.StepJoinNode, Mode: sim.ModeHold, ClusterID: c.id})
		call := c.call(c.worker)
		done := async(func() error { return s.JoinNode(ctx, call, "1.30.2", infra.NodeCredentials{}) })

		h, err := s.WaitHeld(ctx, isStep(infra.StepJoinNode))
		if err != nil {
			t.Fatalf("WaitHeld: %v", err)
		}
		want := sim.Held{FaultID: f.ID, Step: infra.StepJoinNode, ClusterID: c.id, Operation: call.Operation, MachineID: c.worker, Since: since}
		if h != want {
			t.Errorf("held = %+v; want %+v", h, want)
		}
		if got := s.ListHeld(); len(got) != 1 || got[0] != want {
			t.Errorf("ListHeld() = %+v; want [%+v]", got, want)
		}
		if m := machine(t, s, c.worker); m.Joined {
			t.Error("a held step ran")
		}
		select {
		case err := <-done:
			t.Fatalf("held step returned before release: %v", err)
		default:
		}

		n, err := s.ReleaseHeld(f.ID)
		if err != nil || n != 1 {
			t.Errorf("ReleaseHeld = %d, %v; want 1", n, err)
		}
		if err := <-done; err != nil {
			t.Errorf("released step: %v", err)
		}
		if m := machine(t, s, c.worker); !m.Joined {
			t.Error("released step did not run")
		}
		if got := s.ListHeld(); len(got) != 0 {
			t.Errorf("ListHeld() after release = %+v; want none", got)
		}

		// The fault (count 0) holds the next step too; ReleaseAll lets it go.
		done = async(func() error { return s.JoinNode(ctx, call, "1.30.2", infra.NodeCredentials{}) })
		if _, err := s.WaitHeld(ctx, isStep(infra.StepJoinNode)); err != nil {
			t.Fatalf("WaitHeld: %v", err)
		}
		if n := s.ReleaseAll(); n != 1 {
			t.Errorf("ReleaseAll = %d; want 1", n)
		}
		if err := <-done; err != nil {
			t.Errorf("released step: %v", err)
		}
	})
}

func TestHoldCountAndRelease(t *testing.T) {
	forEachBackend(t, sim.Config{}, func(t *testing.T, s *sim.Simulator) {
		ctx := ctxT(t)
		c := newCluster(t, s)
		f := inject(t, s, sim.Fault{Step: infra.StepDrainNode, Mode: sim.ModeHold, Count: 1})
		done := async(func() error { return s.DrainNode(ctx, c.call(c.worker)) })
		if _, err := s.WaitHeld(ctx, nil); err != nil {
			t.Fatal(err)
		}
		// The fault is spent, so the next drain runs straight through.
		if err := s.DrainNode(ctx, c.call(c.control)); err != nil {
			t.Errorf("drain after the hold was spent: %v", err)
		}
		// Its held step can still be released by its id.
		if n, err := s.ReleaseHeld(f.ID); err != nil || n != 1 {
			t.Errorf("ReleaseHeld of a spent fault = %d, %v; want 1", n, err)
		}
		if err := <-done; err != nil {
			t.Errorf("released step: %v", err)
		}
		if _, err := s.ReleaseHeld(f.ID); !errors.Is(err, fault.ErrUnknown) {
			t.Errorf("ReleaseHeld of a spent fault holding nothing: err = %v; want fault.ErrUnknown", err)
		}
		if _, err := s.ReleaseHeld("f-999"); !errors.Is(err, fault.ErrUnknown) {
			t.Errorf("ReleaseHeld of an unknown fault: err = %v; want fault.ErrUnknown", err)
		}
		live := inject(t, s, sim.Fault{Step: infra.StepDrainNode, Mode: sim.ModeHold})
		if n, err := s.ReleaseHeld(live.ID); err != nil || n != 0 {
			t.Errorf("ReleaseHeld of a fault holding nothing = %d, %v; want 0, nil", n, err)
		}
	})
}

func TestClearFaultsReleasesHeldSteps(t *testing.T) {
	forEachBackend(t, sim.Config{}, func(t *testing.T, s *sim.Simulator) {
		ctx := ctxT(t)
		a, b := newCluster(t, s), newCluster(t, s)
		inject(t, s, sim.Fault{Step: infra.StepPowerOff, Mode: sim.ModeHold})
		inject(t, s, sim.Fault{Step: infra.StepDeployProvider, Mode: sim.ModeHold})
		doneA := async(func() error { return s.PowerOff(ctx, a.call(a.worker)) })
		doneB := async(func() error { return s.DeployProvider(ctx, b.call("")) })
		for _, id := range []string{a.id, b.id} {
			if _, err := s.WaitHeld(ctx, func(h sim.Held) bool { return h.ClusterID == id }); err != nil {
				t.Fatal(err)
			}
		}
		if got := s.ListHeld(); len(got) != 2 {
			t.Errorf("ListHeld() = %+v; want 2", got)
		}
		s.ClearFaults()
		for name, done := range map[string]<-chan error{"power_off": doneA, "deploy_provider": doneB} {
			if err := <-done; err != nil {
				t.Errorf("%s after ClearFaults: %v", name, err)
			}
		}
		if fs, hs := s.Faults(), s.ListHeld(); len(fs)+len(hs) != 0 {
			t.Errorf("after ClearFaults: faults %+v, held %+v; want none", fs, hs)
		}
		if m := machine(t, s, a.worker); m.Power != infra.PowerStopped {
			t.Errorf("released power_off did not run: %s", m.Power)
		}
	})
}

func TestHeldStepEndsWithItsContext(t *testing.T) {
	forEachBackend(t, sim.Config{}, func(t *testing.T, s *sim.Simulator) {
		c := newCluster(t, s)
		inject(t, s, sim.Fault{Step: infra.StepResizeMachine, Mode: sim.ModeHold})
		ctx, cancel := context.WithCancel(ctxT(t))
		done := async(func() error { return s.ResizeMachine(ctx, c.call(c.worker), "large") })
		if _, err := s.WaitHeld(ctxT(t), isStep(infra.StepResizeMachine)); err != nil {
			t.Fatal(err)
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled held step: err = %v; want context.Canceled", err)
		}
		if got := s.ListHeld(); len(got) != 0 {
			t.Errorf("ListHeld() after cancellation = %+v; want none", got)
		}
		if m := machine(t, s, c.worker); m.Offering != "medium" {
			t.Errorf("a cancelled held step ran: offering %s", m.Offering)
		}
	})
}

func TestWaitHeldEndsWithItsContext(t *testing.T) {
	s := sim.New(nil, sim.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if _, err := s.WaitHeld(ctx, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("WaitHeld with nothing held: err = %v; want DeadlineExceeded", err)
	}
}

func TestInvalidFaultsAreRefused(t *testing.T) {
	s := sim.New(nil, sim.Config{})
	tests := []struct {
		name string
		f    sim.Fault
	}{
		{"unknown step", sim.Fault{Step: "reboot", Mode: sim.ModeFail}},
		{"no step", sim.Fault{Mode: sim.ModeFail}},
		{"no mode", sim.Fault{Step: infra.StepPowerOn}},
		{"unknown mode", sim.Fault{Step: infra.StepPowerOn, Mode: "EXPLODE"}},
		{"negative count", sim.Fault{Step: infra.StepPowerOn, Mode: sim.ModeFail, Count: -1}},
		{"delay without duration", sim.Fault{Step: infra.StepPowerOn, Mode: sim.ModeDelay}},
		{"negative delay", sim.Fault{Step: infra.StepPowerOn, Mode: sim.ModeDelay, Delay: -time.Second}},
		{"duration on a hold", sim.Fault{Step: infra.StepPowerOn, Mode: sim.ModeHold, Delay: time.Second}},
	}
	for _, tt := range tests {
		if _, err := s.InjectFault(tt.f); !errors.Is(err, fault.ErrInvalid) {
			t.Errorf("%s: err = %v; want fault.ErrInvalid", tt.name, err)
		}
	}
	if fs := s.Faults(); len(fs) != 0 {
		t.Errorf("refused faults were stored: %+v", fs)
	}
	for _, step := range infra.Steps() {
		if _, err := s.InjectFault(sim.Fault{Step: step, Mode: sim.ModeFail}); err != nil {
			t.Errorf("fault on step %s: %v", step, err)
		}
	}
}

func TestStepDelay(t *testing.T) {
	const delay = 30 * time.Millisecond
	forEachBackend(t, sim.Config{StepDelay: delay}, func(t *testing.T, s *sim.Simulator) {
		ctx := ctxT(t)
		free := freeMachine(t, s)
		c := uuid.NewString()
		op := holder(t, s, c)
		start := time.Now()
		if err := s.ValidateNode(ctx, infra.Call{ClusterID: c, Operation: op, MachineID: free.ID}); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took < delay {
			t.Errorf("step took %v; want at least the step delay %v", took, delay)
		}
	})
	forEachBackend(t, sim.Config{StepDelay: time.Hour}, func(t *testing.T, s *sim.Simulator) {
		free := freeMachine(t, s)
		// The deadline ends the step while it sleeps (an hour, were the
		// sleep deaf to its context).
		ctx, cancel := context.WithTimeout(ctxT(t), 20*time.Millisecond)
		defer cancel()
		c := uuid.NewString()
		op := holder(t, s, c)
		if err := s.ValidateNode(ctx, infra.Call{ClusterID: c, Operation: op, MachineID: free.ID}); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("step whose context ends in its delay: err = %v; want DeadlineExceeded", err)
		}
		if m := machine(t, s, free.ID); m.ClusterID != "" {
			t.Errorf("a step cancelled in its delay ran: %+v", m)
		}
	})
}
