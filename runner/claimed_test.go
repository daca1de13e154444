package runner_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/repository/repotest"
	"github.com/clusterd/clusterd/runner"
)

// recording is the real store, remembering the progress writes the runner
// asked of it.
type recording struct {
	*repository.Store
	mu     sync.Mutex
	writes []repository.Progress
}

func (r *recording) RecordProgress(ctx context.Context, jobID string, p repository.Progress) (repository.Job, error) {
	r.mu.Lock()
	r.writes = append(r.writes, p)
	r.mu.Unlock()
	return r.Store.RecordProgress(ctx, jobID, p)
}

func (r *recording) steps() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, p := range r.writes {
		out = append(out, progressString(p.Step, p.StepsDone, p.StepsTotal))
	}
	return out
}

func progressString(step string, done, total int32) string {
	return fmt.Sprintf("%s %d/%d", step, done, total)
}

// TestAFirstStepTheClaimNamedIsNotWrittenAgain: a claim that names the step
// its job starts with (repository.NewJob.Step) has written that progress
// already, so the job's first Step, if it records just that, reads the job
// instead of writing it, and still stops at a cancellation requested before
// it (even while the job was only reserved, which Runner.Cancel cannot
// reach); any other first step is written as always, and a step the claim
// named that the job never started is taken back with its end.
func TestAFirstStepTheClaimNamedIsNotWrittenAgain(t *testing.T) {
	cases := []struct {
		name string
		// total is what the work sets before its steps; steps are the steps
		// it takes; fail makes it fail after them; cancel requests a
		// cancellation between the claim and Start.
		total  int32
		steps  []string
		fail   bool
		cancel bool
		// written are the progress writes the steps make; firstRow is the
		// row during the first step ("" if none ran); end and status are
		// the row once the job ended.
		written  []string
		firstRow string
		end      string
		status   repository.JobStatus
	}{
		{name: "the step the claim named", total: 2, steps: []string{"provision_machine", "power_on"},
			written: []string{"power_on 1/2"}, firstRow: "provision_machine 0/2", end: "power_on 2/2", status: repository.JobSucceeded},
		{name: "another step", total: 2, steps: []string{"power_on", "provision_machine"},
			written: []string{"power_on 0/2", "provision_machine 1/2"}, firstRow: "power_on 0/2", end: "provision_machine 2/2", status: repository.JobSucceeded},
		{name: "more steps than the claim said", total: 3, steps: []string{"provision_machine"},
			written: []string{"provision_machine 0/3"}, firstRow: "provision_machine 0/3", end: "provision_machine 1/3", status: repository.JobSucceeded},
		{name: "no step at all", total: 0, end: " 0/0", status: repository.JobSucceeded},
		{name: "a failure before any step", total: 2, fail: true, end: " 0/2", status: repository.JobFailed},
		{name: "a failure in the step the claim named", total: 2, steps: []string{"provision_machine"}, fail: true,
			firstRow: "provision_machine 0/2", end: "provision_machine 0/2", status: repository.JobFailed},
		{name: "a cancellation before the step the claim named", total: 2, steps: []string{"provision_machine", "power_on"}, cancel: true,
			end: "provision_machine 0/2", status: repository.JobCancelled},
	}
	for _, b := range repotest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			s := repotest.Open(t, b)
			for i, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					rec := &recording{Store: s}
					e := newEnv(t, s, func(c *runner.Config) { c.Store = rec })
					ctx := ctxT(t)
					c, job, err := s.CreateCluster(ctx, repository.NewCluster{Account: "acme", DisplayName: fmt.Sprintf("claimed-%d", i), Spec: spec},
						repository.NewJob{Kind: "create", ServerID: "s1", Deadline: inAnHour(), Step: "provision_machine", StepsTotal: 2})
					if err != nil {
						t.Fatal(err)
					}
					if got := progressString(job.Step, job.StepsDone, job.StepsTotal); got != "provision_machine 0/2" {
						t.Fatalf("the claim's job says %q; want provision_machine 0/2", got)
					}
					held, err := s.Transition(ctx, repository.Transition{ClusterID: c.ID, Expect: c.Expect(), Event: lifecycle.StartRequested, Operation: job.ID})
					if err != nil {
						t.Fatal(err)
					}
					if tc.cancel {
						release, err := e.r.Reserve(job.ID)
						if err != nil {
							t.Fatal(err)
						}
						defer release()
						if _, err := s.RequestCancel(ctx, job.ID); err != nil {
							t.Fatal(err)
						}
						if e.r.Cancel(job.ID) {
							t.Fatal("Cancel found a context for a job only reserved")
						}
					}
					firstRow := make(chan string, 1)
					err = e.r.Start(runner.Task{
						Job: job,
						Run: func(ctx context.Context, p *runner.Progress) (runner.Outcome, error) {
							p.SetTotal(tc.total)
							for i, step := range tc.steps {
								if err := p.Step(ctx, step); err != nil {
									return runner.Outcome{}, err
								}
								if i == 0 {
									j, err := s.GetJob(ctx, job.ID)
									if err != nil {
										return runner.Outcome{}, err
									}
									firstRow <- progressString(j.Step, j.StepsDone, j.StepsTotal)
								}
							}
							if tc.fail {
								return runner.Outcome{}, errors.New("the work failed")
							}
							return runner.Outcome{Release: succeed(held)}, nil
						},
						Release: func(context.Context, error) (*repository.Transition, error) {
							return &repository.Transition{ClusterID: held.ID, Expect: held.Expect(), Event: lifecycle.OperationFailed}, nil
						},
					})
					if err != nil {
						t.Fatalf("Start: %v", err)
					}
					if tc.firstRow != "" {
						if got := recv(t, firstRow, "the first step"); got != tc.firstRow {
							t.Errorf("during the first step the row says %q; want %q", got, tc.firstRow)
						}
					}
					got := ended(t, e, job.ID)
					if end := progressString(got.Step, got.StepsDone, got.StepsTotal); end != tc.end || got.Status != tc.status {
						t.Errorf("the ended job says %s %q; want %s %q", got.Status, end, tc.status, tc.end)
					}
					if tc.firstRow == "" && len(firstRow) > 0 {
						t.Errorf("the first step ran (the row said %q during it); want it stopped before", <-firstRow)
					}
					if w := rec.steps(); !slices.Equal(w, tc.written) {
						t.Errorf("progress written %q; want %q", w, tc.written)
					}
				})
			}
		})
	}
}
