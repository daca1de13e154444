package repository_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/repository/repotest"
)

// TestClaimRaceAcrossNodes races claims of one cluster through every node of
// a Galera cluster at once (multi-primary: each writer's transaction
// commits locally and loses at certification, as a 1213 at COMMIT). Every
// round must have exactly one winner; every loser must see a lost race
// (ErrConflict), never another error. CLUSTERD_GALERA_RACE_ROUNDS sets the
// rounds (make test runs 300, make chaos-galera 1000).
func TestClaimRaceAcrossNodes(t *testing.T) {
	b, ok := repotest.Galera(t)
	if !ok {
		return
	}
	rounds := repotest.GaleraRounds(t, 300)
	ctx := ctxT(t)
	var stores []*repository.Store
	for i, dsn := range b.NodeDSNs(t) {
		s, err := repository.Open(ctx, dsn, repository.WithServerID(fmt.Sprintf("node%d", i+1)))
		if err != nil {
			t.Fatal(err)
		}
		repotest.SeedCatalog(t, s)
		t.Cleanup(func() { _ = s.Close() })
		stores = append(stores, s)
	}
	lost := 0
	for round := range rounds {
		c := running(t, stores[0], fmt.Sprintf("race-%d", round))
		// Every node has the cluster as written before the race starts, so
		// each racer's compare-and-set meets the same row.
		for _, s := range stores[1:] {
			deadline := time.Now().Add(30 * time.Second)
			for {
				got, err := s.GetCluster(ctx, c.ID)
				if err == nil && got.Expect() == c.Expect() {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("round %d: cluster %s not replicated within 30s: %v, %v", round, c.ID, got.Expect(), err)
				}
				time.Sleep(2 * time.Millisecond)
			}
		}
		var wg sync.WaitGroup
		start := make(chan struct{})
		errs := make([]error, len(stores))
		for i, s := range stores {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				ev := []lifecycle.Event{lifecycle.StopRequested, lifecycle.ScaleUpRequested, lifecycle.UpgradeRequested}[i%3]
				_, _, errs[i] = s.Claim(context.Background(), repository.Transition{ClusterID: c.ID, Expect: c.Expect(), Event: ev},
					repository.NewJob{Kind: ev.String(), ServerID: fmt.Sprintf("node%d", i+1), Deadline: time.Now().Add(time.Hour)})
			}()
		}
		close(start)
		wg.Wait()
		wins := 0
		for i, err := range errs {
			switch {
			case err == nil:
				wins++
			case errors.Is(err, repository.ErrConflict):
				lost++
			default:
				t.Errorf("round %d: the claim through node %d failed with something other than a lost race: %v", round, i+1, err)
			}
		}
		if wins != 1 {
			for i, s := range stores {
				got, err := s.GetCluster(ctx, c.ID)
				evs, _ := s.ListEvents(ctx, c.ID, 0, 100)
				jobs, _ := s.ListJobs(ctx, repository.JobQuery{Where: repository.Compare(repository.JobCluster, repository.Eq, c.ID), Limit: 100})
				t.Logf("node %d: err %v; cluster %v, %v; %d jobs; events:", i+1, errs[i], got.Expect(), err, len(jobs))
				for _, j := range jobs {
					t.Logf("   job %s %s %s", j.ID, j.Kind, j.Status)
				}
				for _, e := range evs {
					t.Logf("   %d %s %s->%s op %s server %s", e.ID, e.Name, e.From, e.To, e.Operation, e.Server)
				}
			}
			t.Fatalf("round %d: %d winners across %d primaries; want exactly 1", round, wins, len(stores))
		}
	}
	t.Logf("%d rounds x %d primaries: exactly one winner each round, %d lost races, 0 other errors", rounds, len(stores), lost)
}
