package sim_test

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/infra/sim"
	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
)

// everyStep calls each step that changes something once with call, and
// returns the error of each.
func everyStep(ctx context.Context, s *sim.Simulator, c cluster, call func(machine string) infra.Call) map[string]error {
	_, provision := s.ProvisionMachine(ctx, call(""), c.worker, infra.RoleWorker, "medium", "1.30.2")
	_, wait := s.WaitAPI(ctx, call(""))
	return map[string]error{
		infra.StepProvisionMachine: provision,
		infra.StepPowerOn:          s.PowerOn(ctx, call(c.worker)),
		infra.StepPowerOff:         s.PowerOff(ctx, call(c.worker)),
		infra.StepResizeMachine:    s.ResizeMachine(ctx, call(c.worker), "large"),
		infra.StepAttachISO:        s.AttachISO(ctx, call(c.worker), "k.iso"),
		infra.StepDetachISO:        s.DetachISO(ctx, call(c.worker)),
		infra.StepConfigureNetwork: s.ConfigureNetwork(ctx, call(""), []infra.Rule{{MachineID: c.worker, Kind: "ssh", Port: 22}}),
		infra.StepJoinNode:         s.JoinNode(ctx, call(c.worker), "1.31.1", infra.NodeCredentials{}),
		infra.StepWaitAPI:          wait,
		infra.StepFetchKubeconfig:  s.FetchKubeconfig(ctx, call("")),
		infra.StepDeployProvider:   s.DeployProvider(ctx, call("")),
		infra.StepDeployAutoscaler: s.DeployAutoscaler(ctx, call(""), true, 1, 3),
		infra.StepDrainNode:        s.DrainNode(ctx, call(c.worker)),
		infra.StepUncordonNode:     s.UncordonNode(ctx, call(c.worker)),
		infra.StepUpgradeNode:      s.UpgradeNode(ctx, call(c.worker), "1.31.1"),
		infra.StepValidateNode:     s.ValidateNode(ctx, call(c.worker)),
		infra.StepDeleteNode:       s.DeleteNode(ctx, call(c.worker)),
		infra.StepDestroyMachine:   s.DestroyMachine(ctx, call(c.worker)),
	}
}

// Every step of a job that does not hold its cluster is refused with
// infra.ErrFenced and changes nothing, whatever the reason: another job
// holds it, the job was failed (by recovery) while the cluster still names
// it, nothing holds it, the job or the cluster does not exist.
func TestStepsOfAJobThatDoesNotHoldItsClusterAreRefused(t *testing.T) {
	forEachBackend(t, sim.Config{}, func(t *testing.T, s *sim.Simulator) {
		ctx := ctxT(t)
		store := storeOf(s)
		c := newCluster(t, s)
		failed := newCluster(t, s)
		// Recovery failed the job; the cluster still names it until someone
		// takes it over.
		if _, err := store.FinishJob(ctx, repository.Finish{JobID: failed.op, Status: repository.JobFailed, Error: "owner server stopped"}); err != nil {
			t.Fatal(err)
		}
		released := newCluster(t, s)
		rc, err := store.GetCluster(ctx, released.id)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := store.FinishJob(ctx, repository.Finish{JobID: released.op, Status: repository.JobFailed,
			Release: &repository.Transition{ClusterID: rc.ID, Expect: rc.Expect(), Event: lifecycle.CreateFailed}}); err != nil {
			t.Fatal(err)
		}
		cases := []struct {
			name string
			c    cluster
			call func(machine string) infra.Call
			want string
		}{
			{"another job holds the cluster", c, func(m string) infra.Call {
				return infra.Call{ClusterID: c.id, Operation: failed.op, MachineID: m}
			}, "held by operation " + c.op},
			{"the job was failed", failed, failed.call, "the job is FAILED"},
			{"nothing holds the cluster", released, released.call, "no operation holds the cluster"},
			{"no job", c, func(m string) infra.Call { return infra.Call{ClusterID: c.id, MachineID: m} }, "names no job"},
			{"no such job", c, func(m string) infra.Call {
				return infra.Call{ClusterID: c.id, Operation: "0191e4b6-7a5c-7c9e-9d6b-1a2b3c4d5e6f", MachineID: m}
			}, "the job does not exist"},
		}
		for _, tc := range cases {
			before := snapshot(t, s, c.id, failed.id, released.id)
			refusedBefore := s.Refused()
			for step, err := range everyStep(ctx, s, tc.c, tc.call) {
				if !errors.Is(err, infra.ErrFenced) || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("%s: %s: err = %v; want infra.ErrFenced saying %q", tc.name, step, err, tc.want)
				}
			}
			if after := snapshot(t, s, c.id, failed.id, released.id); !reflect.DeepEqual(after, before) {
				t.Errorf("%s: refused steps changed the world:\n got %+v\nwant %+v", tc.name, after, before)
			}
			if got := s.Refused() - refusedBefore; got != 18 {
				t.Errorf("%s: Refused() grew by %d; want 18", tc.name, got)
			}
		}
		// The log has them too, every one marked refused with its reason.
		calls, err := sim.Calls(ctx, store, failed.id)
		if err != nil {
			t.Fatal(err)
		}
		refused := 0
		for _, call := range calls {
			if call.Refused {
				refused++
				if call.Reason != "the job is FAILED" || call.Fence.JobID != failed.op {
					t.Errorf("logged refusal %+v; want job %s refused because it is FAILED", call, failed.op)
				}
			}
		}
		if refused != 18 {
			t.Errorf("the log has %d refused calls on %s; want 18", refused, failed.id)
		}
	})
}

// The case: a step held (a slow infrastructure, a paused server)
// while its job is failed and another operation takes the cluster over is
// refused when it goes on, and changes nothing.
func TestHeldStepOfAJobThatLostItsClusterChangesNothing(t *testing.T) {
	forEachBackend(t, sim.Config{}, func(t *testing.T, s *sim.Simulator) {
		ctx := ctxT(t)
		store := storeOf(s)
		c := newCluster(t, s)
		f := inject(t, s, sim.Fault{Step: infra.StepPowerOff, Mode: sim.ModeHold, ClusterID: c.id})
		done := async(func() error { return s.PowerOff(ctx, c.call(c.worker)) })
		if _, err := s.WaitHeld(ctx, isStep(infra.StepPowerOff)); err != nil {
			t.Fatal(err)
		}
		// Recovery: the job fails, the cluster is taken over by another job.
		if _, err := store.FinishJob(ctx, repository.Finish{JobID: c.op, Status: repository.JobFailed, Error: "owner server stopped"}); err != nil {
			t.Fatal(err)
		}
		held, err := store.GetCluster(ctx, c.id)
		if err != nil {
			t.Fatal(err)
		}
		_, recovery, err := store.Claim(ctx, repository.Transition{ClusterID: c.id, Expect: held.Expect(), History: repository.RecoveryStarted},
			repository.NewJob{Kind: "recover", ServerID: "s2", Deadline: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.ReleaseHeld(f.ID); err != nil {
			t.Fatal(err)
		}
		if err := <-done; !errors.Is(err, infra.ErrFenced) || !strings.Contains(err.Error(), recovery.ID) {
			t.Errorf("held power_off released after the takeover: err = %v; want infra.ErrFenced naming %s", err, recovery.ID)
		}
		if m := machine(t, s, c.worker); m.Power != infra.PowerRunning {
			t.Errorf("the fenced power_off stopped the machine: %+v", m)
		}
		// The new holder's step goes through.
		s.ClearFaults()
		if err := s.PowerOff(ctx, infra.Call{ClusterID: c.id, Operation: recovery.ID, MachineID: c.worker}); err != nil {
			t.Errorf("the new holder's power_off: %v", err)
		}
	})
}

// Steps racing the job's loss: however the writes interleave, every call the
// log shows as accepted was made while the job held the cluster (before the
// history entry that released it), and every call after it was refused.
func TestFencingOrdersStepsAgainstTheLossOfTheCluster(t *testing.T) {
	forEachBackend(t, sim.Config{}, func(t *testing.T, s *sim.Simulator) {
		ctx := ctxT(t)
		store := storeOf(s)
		c := newCluster(t, s)
		const workers = 4
		var (
			wg       sync.WaitGroup
			accepted atomic.Int64
			bad      = make(chan error, workers)
			stop     = make(chan struct{})
			enough   = make(chan struct{})
			once     sync.Once
		)
		for i := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for n := 0; ; n++ {
					var err error
					if (i+n)%2 == 0 {
						err = s.PowerOff(ctx, c.call(c.worker))
					} else {
						err = s.PowerOn(ctx, c.call(c.worker))
					}
					switch {
					case errors.Is(err, infra.ErrFenced):
						return
					case err != nil:
						bad <- err
						return
					}
					if accepted.Add(1) >= 40 {
						once.Do(func() { close(enough) })
					}
					select {
					case <-stop:
						return
					default:
					}
				}
			}()
		}
		select {
		case <-enough:
		case <-time.After(time.Minute):
			t.Fatal("the steps made no progress")
		}
		held, err := store.GetCluster(ctx, c.id)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := store.FinishJob(ctx, repository.Finish{JobID: c.op, Status: repository.JobFailed,
			Release: &repository.Transition{ClusterID: c.id, Expect: held.Expect(), Event: lifecycle.CreateFailed}}); err != nil {
			t.Fatal(err)
		}
		lost := machine(t, s, c.worker)
		wg.Wait() // every worker ends on its first refusal
		if now := machine(t, s, c.worker); now != lost {
			t.Errorf("the machine changed after its cluster's job ended: %+v, then %+v", lost, now)
		}
		close(stop)
		close(bad)
		for err := range bad {
			t.Errorf("a step failed other than by fencing: %v", err)
		}
		hist, err := store.ListEvents(ctx, c.id, 0, 100)
		if err != nil {
			t.Fatal(err)
		}
		end := hist[len(hist)-1]
		if end.Name != lifecycle.CreateFailed.String() {
			t.Fatalf("last history entry %s; want the release", end.Name)
		}
		calls, err := sim.Calls(ctx, store, c.id)
		if err != nil {
			t.Fatal(err)
		}
		var ok, refused int
		for _, call := range calls {
			switch {
			case call.Fence.Step != infra.StepPowerOn && call.Fence.Step != infra.StepPowerOff:
			case call.Refused:
				refused++
				if call.LastEventID < end.ID {
					t.Errorf("call %d refused before the job lost the cluster (history at %d, release %d)", call.ID, call.LastEventID, end.ID)
				}
			default:
				ok++
				if call.LastEventID >= end.ID {
					t.Errorf("call %d accepted after the job lost the cluster (history at %d, release %d)", call.ID, call.LastEventID, end.ID)
				}
			}
		}
		if ok < 40 || refused != workers {
			t.Errorf("log: %d accepted, %d refused; want at least 40 accepted and %d refused", ok, refused, workers)
		}
	})
}

// A graceful stop lets held steps go without doing anything, and no step is
// held after it.
func TestStopHoldingEndsHeldStepsAndHoldsNoMore(t *testing.T) {
	forEachBackend(t, sim.Config{}, func(t *testing.T, s *sim.Simulator) {
		ctx := ctxT(t)
		c := newCluster(t, s)
		inject(t, s, sim.Fault{Step: infra.StepPowerOff, Mode: sim.ModeHold})
		done := async(func() error { return s.PowerOff(ctx, c.call(c.worker)) })
		if _, err := s.WaitHeld(ctx, isStep(infra.StepPowerOff)); err != nil {
			t.Fatal(err)
		}
		s.StopHolding()
		if err := <-done; !errors.Is(err, sim.ErrStopping) {
			t.Errorf("held step at StopHolding: err = %v; want ErrStopping", err)
		}
		if m := machine(t, s, c.worker); m.Power != infra.PowerRunning {
			t.Errorf("the held step ran: %+v", m)
		}
		if held := s.ListHeld(); len(held) != 0 {
			t.Errorf("ListHeld after StopHolding = %v; want none", held)
		}
		// The fault is still there but holds nothing: the step runs through.
		if err := s.PowerOff(ctx, c.call(c.control)); err != nil {
			t.Errorf("power_off after StopHolding: %v", err)
		}
		if m := machine(t, s, c.control); m.Power != infra.PowerStopped {
			t.Errorf("power_off after StopHolding did not run: %+v", m)
		}
	})
}

// Adoption: a step held while another server adopts its job (the same job,
// attempt 2) is refused when it goes on, as is every step of attempt 1 from
// then on, changing nothing; the adopter's steps go through.
func TestStepsOfAnAdoptedAttemptAreRefused(t *testing.T) {
	forEachBackend(t, sim.Config{}, func(t *testing.T, s *sim.Simulator) {
		ctx := ctxT(t)
		store := storeOf(s)
		c := newCluster(t, s)
		first := func(m string) infra.Call { call := c.call(m); call.Attempt = 1; return call }
		f := inject(t, s, sim.Fault{Step: infra.StepPowerOff, Mode: sim.ModeHold, ClusterID: c.id})
		done := async(func() error { return s.PowerOff(ctx, first(c.worker)) })
		if _, err := s.WaitHeld(ctx, isStep(infra.StepPowerOff)); err != nil {
			t.Fatal(err)
		}
		job, err := store.GetJob(ctx, c.op)
		if err != nil {
			t.Fatal(err)
		}
		adopter, err := store.RegisterServer(ctx, "s2")
		if err != nil {
			t.Fatal(err)
		}
		// The job's server, s1, has no row: it is dead.
		if _, err := store.AdoptJob(ctx, repository.Adoption{Job: job, Server: adopter, Cutoff: time.Now().Add(-time.Minute)}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.ReleaseHeld(f.ID); err != nil {
			t.Fatal(err)
		}
		if err := <-done; !errors.Is(err, infra.ErrFenced) || !strings.Contains(err.Error(), "adopted") {
			t.Errorf("held power_off of attempt 1 released after the adoption: err = %v; want infra.ErrFenced saying the job was adopted", err)
		}
		s.ClearFaults()
		before := snapshot(t, s, c.id)
		for step, err := range everyStep(ctx, s, c, first) {
			if !errors.Is(err, infra.ErrFenced) {
				t.Errorf("%s of attempt 1 after the adoption: err = %v; want infra.ErrFenced", step, err)
			}
		}
		if after := snapshot(t, s, c.id); !reflect.DeepEqual(after, before) {
			t.Errorf("attempt 1's refused steps changed the world:\n got %+v\nwant %+v", after, before)
		}
		second := c.call(c.worker)
		second.Attempt = 2
		if err := s.PowerOff(ctx, second); err != nil {
			t.Errorf("the adopter's power_off: %v", err)
		}
		if m := machine(t, s, c.worker); m.Power != infra.PowerStopped {
			t.Errorf("the adopter's power_off did not run: %+v", m)
		}
		calls, err := sim.Calls(ctx, store, c.id)
		if err != nil {
			t.Fatal(err)
		}
		last := calls[len(calls)-1]
		if last.Refused || last.Fence.Attempt != 2 || last.Fence.Step != infra.StepPowerOff {
			t.Errorf("last logged call %+v; want attempt 2's power_off, accepted", last)
		}
	})
}
