package repository_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/go-sql-driver/mysql"

	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/repository/repotest"
)

// The guard lets a change through only while its job holds its cluster: the
// cluster names the job, the job is IN_PROGRESS and, when the fence names
// an attempt, at that attempt. Guarded runs fn only then (a refused fn
// writes nothing); CheckHolder answers the same without a change.
func TestGuardHolder(t *testing.T) {
	type setup func(t *testing.T, s *repository.Store) repository.Fence
	held := func(t *testing.T, s *repository.Store) (repository.Cluster, repository.Job) {
		return create(t, s, "g-"+uuid.NewString()[:8])
	}
	cases := []struct {
		name   string
		setup  setup
		reason string // "" when let through
	}{
		{"holder, no attempt", func(t *testing.T, s *repository.Store) repository.Fence {
			c, j := held(t, s)
			return repository.Fence{ClusterID: c.ID, JobID: j.ID}
		}, ""},
		{"holder at its attempt", func(t *testing.T, s *repository.Store) repository.Fence {
			c, j := held(t, s)
			return repository.Fence{ClusterID: c.ID, JobID: j.ID, Attempt: j.Attempt}
		}, ""},
		{"another holder", func(t *testing.T, s *repository.Store) repository.Fence {
			c, j := held(t, s)
			finishRunning(t, s, c, j)
			c, _ = s.GetCluster(ctxT(t), c.ID)
			_, _, err := s.Claim(ctxT(t), repository.Transition{ClusterID: c.ID, Expect: c.Expect(), Event: lifecycle.StopRequested},
				repository.NewJob{Kind: "stop", ServerID: "s1", Deadline: time.Now().Add(time.Hour)})
			if err != nil {
				t.Fatal(err)
			}
			return repository.Fence{ClusterID: c.ID, JobID: j.ID, Attempt: j.Attempt}
		}, "the cluster is held by operation"},
		{"no holder", func(t *testing.T, s *repository.Store) repository.Fence {
			c, j := held(t, s)
			finishRunning(t, s, c, j)
			return repository.Fence{ClusterID: c.ID, JobID: j.ID}
		}, "no operation holds the cluster"},
		{"job not IN_PROGRESS", func(t *testing.T, s *repository.Store) repository.Fence {
			// Ended without releasing: the cluster still names it (an
			// orphan, until recovery takes it over).
			c, j := held(t, s)
			if _, err := s.FinishJob(ctxT(t), repository.Finish{JobID: j.ID, Status: repository.JobFailed, Error: "x"}); err != nil {
				t.Fatal(err)
			}
			return repository.Fence{ClusterID: c.ID, JobID: j.ID, Attempt: j.Attempt}
		}, "the job is FAILED"},
		{"wrong attempt", func(t *testing.T, s *repository.Store) repository.Fence {
			c, j := held(t, s)
			return repository.Fence{ClusterID: c.ID, JobID: j.ID, Attempt: j.Attempt + 1}
		}, "the job was adopted"},
		{"adopted: the old attempt", func(t *testing.T, s *repository.Store) repository.Fence {
			ctx := ctxT(t)
			c, j := held(t, s)
			live, err := s.RegisterServer(ctx, "live")
			if err != nil {
				t.Fatal(err)
			}
			// s1 never registered: it is not alive.
			if _, err := s.AdoptJob(ctx, repository.Adoption{Job: j, Server: live, Cutoff: time.Now().Add(-time.Minute)}); err != nil {
				t.Fatal(err)
			}
			return repository.Fence{ClusterID: c.ID, JobID: j.ID, Attempt: 1}
		}, "attempt 2 runs on server live, not attempt 1"},
		{"no such cluster", func(t *testing.T, s *repository.Store) repository.Fence {
			_, j := held(t, s)
			return repository.Fence{ClusterID: uuid.NewString(), JobID: j.ID}
		}, "the cluster does not exist"},
		{"no such job", func(t *testing.T, s *repository.Store) repository.Fence {
			c, _ := held(t, s)
			return repository.Fence{ClusterID: c.ID, JobID: uuid.NewString()}
		}, "the job does not exist"},
		{"no job named", func(t *testing.T, s *repository.Store) repository.Fence {
			c, _ := held(t, s)
			return repository.Fence{ClusterID: c.ID}
		}, "names no job"},
	}
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				ctx := ctxT(t)
				f := tc.setup(t, s)
				f.Step = "power_on"
				check := func(what string, err error) {
					t.Helper()
					var fenced *repository.FencedError
					switch {
					case tc.reason == "" && err != nil:
						t.Errorf("%s: %v; want it let through", what, err)
					case tc.reason != "" && (!errors.Is(err, repository.ErrFenced) || !errors.As(err, &fenced)):
						t.Errorf("%s: %v; want a *FencedError (ErrFenced)", what, err)
					case tc.reason != "" && !strings.Contains(fenced.Reason, tc.reason):
						t.Errorf("%s: refused for %q; want %q", what, fenced.Reason, tc.reason)
					case tc.reason != "" && fenced.Fence != f:
						t.Errorf("%s: refusal names %+v; want %+v", what, fenced.Fence, f)
					}
				}
				check("CheckHolder", s.CheckHolder(ctx, f))
				machine := uuid.NewString()
				ran := false
				err := s.Guarded(ctx, f, func(tx *repository.Store) error {
					ran = true
					_, err := tx.CreateMachine(ctx, repository.Machine{ID: machine, Role: "WORKER", Power: "RUNNING"})
					return err
				})
				check("Guarded", err)
				_, gerr := s.GetMachine(ctx, machine)
				switch {
				case tc.reason == "" && (!ran || gerr != nil):
					t.Errorf("Guarded let through: fn ran %t, its write read back: %v; want it run and committed", ran, gerr)
				case tc.reason != "" && (ran || !errors.Is(gerr, repository.ErrNotFound)):
					t.Errorf("Guarded refused: fn ran %t, its write read back: %v; want nothing run or written", ran, gerr)
				}
			})
		}
	})
}

// Guarded's fn fails: its writes, through the bound Store and through its
// Conn, are rolled back with the guard's transaction, and its error is
// returned as is.
func TestGuardedRollsBackAFailedChange(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		ctx := ctxT(t)
		c, j := create(t, s, "g")
		machine := uuid.NewString()
		boom := errors.New("boom")
		err := s.Guarded(ctx, repository.Fence{ClusterID: c.ID, JobID: j.ID, Attempt: j.Attempt}, func(tx *repository.Store) error {
			if _, err := tx.CreateMachine(ctx, repository.Machine{ID: machine, Role: "WORKER", Power: "RUNNING"}); err != nil {
				return err
			}
			// A driver's own statement goes to the same transaction.
			if _, err := tx.Conn().ExecContext(ctx, "UPDATE clusters SET description = ? WHERE id = ?", "changed", c.ID); err != nil {
				return err
			}
			return boom
		})
		if !errors.Is(err, boom) || errors.Is(err, repository.ErrFenced) {
			t.Errorf("Guarded = %v; want fn's error", err)
		}
		if _, err := s.GetMachine(ctx, machine); !errors.Is(err, repository.ErrNotFound) {
			t.Errorf("the failed change's write: %v; want it rolled back", err)
		}
		if got, err := s.GetCluster(ctx, c.ID); err != nil || got.Description != c.Description {
			t.Errorf("the failed change's own statement left description %q, %v; want it rolled back to %q", got.Description, err, c.Description)
		}
	})
}

// The guard locks the cluster's row, then the job's: the order every writer
// that takes a cluster from a job keeps, so none of them waits for the
// other's second lock. Held on MariaDB's row locks (SQLite's writer holds
// the whole database): with the job's row locked by another connection,
// each call that passes the guard waits for it while holding the
// cluster's row (a third connection cannot lock it, NOWAIT), and goes on
// once the job's row is free.
func TestGuardLocksClusterThenJob(t *testing.T) {
	mysqlOnly(t, func(t *testing.T, dsn string) {
		ctx := ctxT(t)
		s, err := repository.Open(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		repotest.SeedCatalog(t, s)
		t.Cleanup(func() { _ = s.Close() })
		raw := rawSQL(t, dsn)
		calls := []struct {
			name string
			call func(c repository.Cluster, j repository.Job) error
		}{
			{"CheckHolder", func(c repository.Cluster, j repository.Job) error {
				return s.CheckHolder(ctx, repository.Fence{ClusterID: c.ID, JobID: j.ID, Attempt: j.Attempt})
			}},
			{"Guarded", func(c repository.Cluster, j repository.Job) error {
				return s.Guarded(ctx, repository.Fence{ClusterID: c.ID, JobID: j.ID, Attempt: j.Attempt}, func(*repository.Store) error { return nil })
			}},
			{"FinishJob", func(c repository.Cluster, j repository.Job) error {
				_, err := s.FinishJob(ctx, repository.Finish{JobID: j.ID, Status: repository.JobFailed, Attempt: j.Attempt,
					Release: &repository.Transition{ClusterID: c.ID, Expect: c.Expect(), Event: lifecycle.CreateFailed}})
				return err
			}},
		}
		for _, tc := range calls {
			c, j := create(t, s, "order-"+tc.name)
			holder, err := raw.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := holder.ExecContext(ctx, "SELECT id FROM jobs WHERE id = ? FOR UPDATE", j.ID); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- tc.call(c, j) }()
			held := false
			for deadline := time.Now().Add(30 * time.Second); !held && time.Now().Before(deadline); {
				select {
				case err := <-done:
					// It gave up waiting (the Store's lock wait and its
					// retries) without ever holding the cluster's row.
					_ = holder.Rollback()
					t.Fatalf("%s ended (%v) while another connection held the job's row, and never held the cluster's meanwhile; want the cluster's row locked first", tc.name, err)
				default:
				}
				probe, err := raw.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				_, err = probe.ExecContext(ctx, "SELECT id FROM clusters WHERE id = ? FOR UPDATE NOWAIT", c.ID)
				_ = probe.Rollback()
				var lockErr *mysql.MySQLError
				switch {
				case err == nil:
				case errors.As(err, &lockErr) && (lockErr.Number == 1205 || lockErr.Number == 3572): // NOWAIT refused: MariaDB, MySQL
					held = true
				default:
					t.Fatalf("probe the cluster's row: %v", err)
				}
				if !held {
					time.Sleep(10 * time.Millisecond)
				}
			}
			if err := holder.Rollback(); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatalf("%s, once the job's row was free: %v", tc.name, err)
			}
			if !held {
				t.Errorf("%s never held the cluster's row while it waited for the job's; want the cluster's row locked first", tc.name)
			}
		}
	})
}

// A job's end and a fenced change of the same job race, round after round,
// on MariaDB's row locks: both lock the cluster's row and then the job's, so
// neither ever waits for a lock the other holds while holding one it
// wants. No deadlock is reported (the Store would retry one and hide it:
// the retry hook sees every one), and each round ends one of the two ways
// the locks allow: the change went through before the end, or was refused
// after it.
func TestGuardFinishAndFenceDoNotDeadlock(t *testing.T) {
	mysqlOnly(t, func(t *testing.T, dsn string) {
		const rounds = 200
		ctx := ctxT(t)
		r := newRetries()
		s, err := repository.Open(ctx, dsn, repository.WithRetryHook(r.hook))
		if err != nil {
			t.Fatal(err)
		}
		repotest.SeedCatalog(t, s)
		t.Cleanup(func() { _ = s.Close() })
		through, refused := 0, 0
		for i := range rounds {
			c, j := create(t, s, fmt.Sprintf("race-%d", i))
			machine := uuid.NewString()
			f := repository.Fence{ClusterID: c.ID, JobID: j.ID, Attempt: j.Attempt, Step: "provision_machine"}
			var wg sync.WaitGroup
			var finishErr, fenceErr error
			start := make(chan struct{})
			wg.Add(2)
			go func() {
				defer wg.Done()
				<-start
				_, finishErr = s.FinishJob(ctx, repository.Finish{JobID: j.ID, Status: repository.JobFailed, Attempt: j.Attempt, Error: "x",
					Release: &repository.Transition{ClusterID: c.ID, Expect: c.Expect(), Event: lifecycle.CreateFailed}})
			}()
			go func() {
				defer wg.Done()
				<-start
				fenceErr = s.Guarded(ctx, f, func(tx *repository.Store) error {
					_, err := tx.CreateMachine(ctx, repository.Machine{ID: machine, ClusterID: c.ID, Role: "WORKER", Power: "RUNNING"})
					return err
				})
			}()
			close(start)
			wg.Wait()
			if finishErr != nil {
				t.Fatalf("round %d: the job's end: %v", i, finishErr)
			}
			_, gerr := s.GetMachine(ctx, machine)
			switch {
			case fenceErr == nil && gerr == nil:
				through++
			case errors.Is(fenceErr, repository.ErrFenced) && errors.Is(gerr, repository.ErrNotFound):
				refused++
			default:
				t.Fatalf("round %d: the fenced change: %v, its machine: %v; want it through and written, or refused and not", i, fenceErr, gerr)
			}
		}
		if errs := r.seen(); len(errs) != 0 {
			t.Errorf("%d lock conflicts in %d rounds; want none. First: %v", len(errs), rounds, errs[0])
		}
		t.Logf("%d rounds: the change went through first %d times, was refused after the end %d times", rounds, through, refused)
	})
}
