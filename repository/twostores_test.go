package repository_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/repository/repotest"
)

// Two servers share one database (SPEC §5): on SQLite that is two Stores,
// each with its own writer connection, on one file. A transaction that
// reads and then writes (every fenced infrastructure call does) must wait
// for the other Store's transaction, never fail because the other Store
// committed between its read and its write (SQLITE_BUSY_SNAPSHOT, "database
// is locked (517)", which no busy timeout waits out), and must not lose
// the other's write either: a compare-and-set inside it still sees the row
// as the last committed transaction left it.
func TestReadThenWriteTransactionsOfTwoStoresOnOneDatabase(t *testing.T) {
	const perStore, calls = 8, 25
	for _, b := range repotest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := ctxT(t)
			dsn := b.NewDSN(t)
			stores := make([]*repository.Store, 2)
			for i := range stores {
				s, err := repository.Open(ctx, dsn, repository.WithServerID(fmt.Sprintf("s%d", i+1)))
				if err != nil {
					t.Fatalf("open store %d: %v", i+1, err)
				}
				repotest.SeedCatalog(t, s)
				t.Cleanup(func() { _ = s.Close() })
				stores[i] = s
			}
			c, j := create(t, stores[0], "shared")
			const machineID = "3f0c1f4e-6a55-4b8e-9a43-2f6f1d1c0a01"
			if _, err := stores[0].CreateMachine(ctx, repository.Machine{ID: machineID, ClusterID: c.ID, Role: "WORKER", Power: "RUNNING"}); err != nil {
				t.Fatal(err)
			}
			fence := repository.Fence{ClusterID: c.ID, JobID: j.ID, Attempt: j.Attempt, Step: "flip_power", MachineID: machineID}

			// Each call reads the machine and flips its power on the
			// condition that it still has the power it read: a call that
			// wrote over another's flip, or ran beside it, would miss.
			flip := func(ctx context.Context, tx *repository.Store) error {
				m, err := tx.GetMachine(ctx, machineID)
				if err != nil {
					return err
				}
				next := map[string]string{"RUNNING": "STOPPED", "STOPPED": "RUNNING"}[m.Power]
				_, err = tx.UpdateMachine(ctx, machineID, repository.MachineCondition{Power: m.Power}, repository.MachineChanges{Power: &next})
				return err
			}
			var wg sync.WaitGroup
			errs := make(chan error, len(stores)*perStore*calls)
			start := make(chan struct{})
			for _, s := range stores {
				for range perStore {
					wg.Add(1)
					go func() {
						defer wg.Done()
						<-start
						for range calls {
							if err := s.Guarded(ctx, fence, func(tx *repository.Store) error { return flip(ctx, tx) }); err != nil {
								errs <- err
							}
						}
					}()
				}
			}
			close(start)
			wg.Wait()
			close(errs)
			failed := 0
			for err := range errs {
				if failed++; failed <= 5 {
					t.Errorf("a fenced call failed: %v", err)
				}
			}
			if failed > 0 {
				t.Fatalf("%d of %d fenced calls failed; want none", failed, len(stores)*perStore*calls)
			}

			total := len(stores) * perStore * calls
			m, err := stores[1].GetMachine(ctx, machineID)
			want := "RUNNING" // an even number of flips
			if total%2 == 1 {
				want = "STOPPED"
			}
			if err != nil || m.Power != want {
				t.Fatalf("after %d flips the machine is %q, %v; want %s", total, m.Power, err, want)
			}
		})
	}
}

// On SQLite, a write that waited out the busy timeout (SQLITE_BUSY: another
// Store on the file held the write lock all along) lost no compare-and-set:
// like MySQL's lock wait timeout, it is run again, and succeeds once the
// lock is free.
func TestSQLiteBusyIsRetriedNotAConflict(t *testing.T) {
	for _, b := range repotest.Backends(t) {
		if b.Name != "sqlite" {
			continue
		}
		ctx := ctxT(t)
		dsn := b.NewDSN(t)
		r := newRetries()
		s, err := repository.Open(ctx, dsn, repository.WithRetryHook(r.hook))
		if err != nil {
			t.Fatal(err)
		}
		repotest.SeedCatalog(t, s)
		t.Cleanup(func() { _ = s.Close() })
		c := running(t, s, "web")

		// Another writer on the file holds its write lock.
		raw, err := sql.Open("sqlite", strings.TrimPrefix(dsn, "sqlite:"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = raw.Close() })
		other, err := raw.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close()
		if _, err := other.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
			t.Fatal(err)
		}

		done := make(chan error, 1)
		go func() {
			_, err := s.Transition(ctx, repository.Transition{ClusterID: c.ID, Expect: c.Expect(), Event: lifecycle.StopRequested, Operation: "stop"})
			done <- err
		}()
		select {
		case <-r.first: // the first attempt waited out the busy timeout
		case err := <-done:
			t.Fatalf("the write did not wait for the lock: %v", err)
		case <-time.After(2 * time.Minute):
			t.Fatal("the write never gave up waiting for the lock")
		}
		if _, err := other.ExecContext(ctx, "ROLLBACK"); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("write after SQLITE_BUSY: %v; want it retried and written", err)
		}
		got, _ := s.GetCluster(ctx, c.ID)
		if got.State != lifecycle.Stopping || got.Version != c.Version+1 {
			t.Errorf("cluster after the retried write: %v; want STOPPING at v%d", got.Expect(), c.Version+1)
		}
		if errs := r.seen(); len(errs) == 0 || !strings.Contains(errs[0].Error(), "SQLITE_BUSY") {
			t.Errorf("retries seen: %v; want SQLITE_BUSY first", errs)
		}
	}
}
