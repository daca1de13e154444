package runner_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/runner"
)

// newHandOffEnv is newEnv with Config.HandOff.
func newHandOffEnv(t *testing.T, s *repository.Store) *env {
	e := &env{s: s, done: make(chan repository.Job, 64)}
	e.r = runner.New(runner.Config{
		Store:   s,
		Logger:  slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})),
		OnDone:  func(j repository.Job) { e.dones.Add(1); e.done <- j },
		HandOff: true,
	})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		_ = e.r.Shutdown(ctx)
	})
	return e
}

// With HandOff, a job that Shutdown interrupts is not failed: it stays
// IN_PROGRESS, holding its cluster in its operation state, marked handed
// off at the step it was at, with a history entry saying so; it is not
// released, not repaired, and not reported as ended.
func TestShutdownHandsJobsOff(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		e = newHandOffEnv(t, e.s)
		held, job := starting(t, e, "web", inAnHour())
		inStep := make(chan struct{})
		var releases atomic.Int64
		err := e.r.Start(runner.Task{
			Job: job,
			Run: func(ctx context.Context, p *runner.Progress) (runner.Outcome, error) {
				p.SetTotal(5)
				for _, step := range []string{"provision_machine", "join_node"} {
					if err := p.Step(ctx, step); err != nil {
						return runner.Outcome{}, err
					}
				}
				close(inStep)
				<-ctx.Done()
				return runner.Outcome{}, fmt.Errorf("join node: %w", ctx.Err())
			},
			Release: func(ctx context.Context, cause error) (*repository.Transition, error) {
				releases.Add(1)
				return failRelease(held, make(chan error, 1))(ctx, cause)
			},
		})
		if err != nil {
			t.Fatalf("Start: %v", err)
		}
		recv(t, inStep, "the second step")
		stop(t, e)

		ctx := ctxT(t)
		got, err := e.s.GetJob(ctx, job.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.Status != repository.JobInProgress || !got.HandedOff || got.Attempt != 1 || got.Step != "join_node" || got.StepsDone != 1 || got.Error != "" {
			t.Errorf("job after a hand-off = %s handed off %t attempt %d at %s (%d done) error %q; want IN_PROGRESS, handed off, attempt 1, at join_node with 1 step done, no error",
				got.Status, got.HandedOff, got.Attempt, got.Step, got.StepsDone, got.Error)
		}
		c := wantCluster(t, e, held.ID, lifecycle.Starting, job.ID)
		evs, err := e.s.ListEvents(ctx, c.ID, 0, 100)
		if err != nil {
			t.Fatal(err)
		}
		if last := evs[len(evs)-1]; last.Name != repository.OperationHandedOff || last.Operation != job.ID || !strings.Contains(last.Message, "join_node") {
			t.Errorf("last history entry = %+v; want OPERATION_HANDED_OFF of %s naming join_node", last, job.ID)
		}
		if n := releases.Load(); n != 0 {
			t.Errorf("Release called %d times for a handed-off job; want 0 (its adopter goes on from where it stopped)", n)
		}
		if n := e.dones.Load(); n != 0 {
			t.Errorf("OnDone called %d times for a handed-off job; want 0 (it has not ended)", n)
		}
	})
}

// A job adopted by another server while its first runner is between steps
// stops at its next step, and that runner writes nothing more (not the job,
// not the cluster). The adopter's runner goes on from the steps already
// done and ends the job.
func TestAdoptedJobStopsAndRunsOnElsewhere(t *testing.T) {
	forEachBackend(t, func(t *testing.T, first *env) {
		ctx := ctxT(t)
		held, job := starting(t, first, "web", inAnHour())
		inStep, proceed := make(chan struct{}), make(chan struct{})
		runErr := make(chan error, 1)
		var releases atomic.Int64
		err := first.r.Start(runner.Task{
			Job: job,
			Run: func(ctx context.Context, p *runner.Progress) (runner.Outcome, error) {
				p.SetTotal(4)
				for _, step := range []string{"provision_machine", "power_on"} {
					if err := p.Step(ctx, step); err != nil {
						return runner.Outcome{}, err
					}
				}
				close(inStep)
				hold(ctx, proceed)
				err := p.Step(ctx, "join_node")
				runErr <- err
				return runner.Outcome{}, err
			},
			Release: func(context.Context, error) (*repository.Transition, error) {
				releases.Add(1)
				return nil, errors.New("an adopted job's old runner must not release")
			},
		})
		if err != nil {
			t.Fatalf("Start: %v", err)
		}
		recv(t, inStep, "the second step")
		// Server s1 (no row: dead) loses the job to s2.
		adopter, err := first.s.RegisterServer(ctx, "s2")
		if err != nil {
			t.Fatal(err)
		}
		seen, err := first.s.GetJob(ctx, job.ID)
		if err != nil {
			t.Fatal(err)
		}
		adopted, err := first.s.AdoptJob(ctx, repository.Adoption{Job: seen, Server: adopter, Cutoff: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		close(proceed)
		if err := recv(t, runErr, "the step after the adoption"); !errors.Is(err, runner.ErrJobEnded) || !strings.Contains(err.Error(), "adopted") {
			t.Errorf("Step after the adoption = %v; want ErrJobEnded saying the job was adopted", err)
		}
		stop(t, first)
		got, err := first.s.GetJob(ctx, job.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.Status != repository.JobInProgress || got.Attempt != 2 || !got.UpdateTime.Equal(adopted.UpdateTime) || got.Step != "power_on" {
			t.Errorf("job after the old runner stopped = %s attempt %d at %s (updated %v); want the adoption's row untouched (attempt 2 at power_on, %v)",
				got.Status, got.Attempt, got.Step, got.UpdateTime, adopted.UpdateTime)
		}
		if releases.Load() != 0 || first.dones.Load() != 0 {
			t.Errorf("the old runner released %d times and reported %d ends; want none", releases.Load(), first.dones.Load())
		}
		c := wantCluster(t, first, held.ID, lifecycle.Starting, job.ID)

		// The adopter runs the job on: its steps count from the one done.
		second := newEnv(t, first.s)
		var steps []int32
		err = second.r.Start(runner.Task{
			Job: adopted,
			Run: func(ctx context.Context, p *runner.Progress) (runner.Outcome, error) {
				p.SetTotal(3) // power_on again (it was interrupted), join, detach
				for _, step := range []string{"power_on", "join_node", "detach_iso"} {
					if err := p.Step(ctx, step); err != nil {
						return runner.Outcome{}, err
					}
					j, _ := second.s.GetJob(ctx, job.ID)
					steps = append(steps, j.StepsDone)
					if j.StepsTotal != 4 {
						t.Errorf("steps total at %s = %d; want 4 (1 done before + 3)", step, j.StepsTotal)
					}
				}
				return runner.Outcome{Result: `{}`, Release: succeed(c)}, nil
			},
		})
		if err != nil {
			t.Fatalf("Start of the adopted job: %v", err)
		}
		done := ended(t, second, job.ID)
		if done.Status != repository.JobSucceeded || done.StepsDone != 4 || fmt.Sprint(steps) != "[1 2 3]" {
			t.Errorf("adopted job ended %s with %d steps done, steps done along the way %v; want SUCCEEDED, 4, [1 2 3]", done.Status, done.StepsDone, steps)
		}
		wantCluster(t, second, held.ID, lifecycle.Running, "")
	})
}
