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

// sizes are the offerings of the quota tests.
var sizes = map[string]repository.Size{"medium": {CPUs: 2, MemoryMB: 2048}, "large": {CPUs: 4, MemoryMB: 8192}}

func sizeOf(_ context.Context, o string) (repository.Size, error) {
	sz, ok := sizes[o]
	if !ok {
		return repository.Size{}, fmt.Errorf("no offering %q", o)
	}
	return sz, nil
}

func limit(n int64) *int64 { return &n }

// quotaOf is a check with default limits l.
func quotaOf(l repository.Limits) *repository.QuotaCheck {
	return &repository.QuotaCheck{Default: l, Size: sizeOf}
}

func createQuota(ctx context.Context, s *repository.Store, name string, q *repository.QuotaCheck) (repository.Cluster, repository.Job, error) {
	return s.CreateCluster(ctx, repository.NewCluster{Account: "acme", DisplayName: name, Spec: spec, Quota: q},
		repository.NewJob{Kind: "create", ServerID: "s1", Deadline: time.Now().Add(time.Hour)})
}

// createResending is racer i's create, with a request id, resent through
// the next store while the database answers unavailable (a Galera node
// stalled on a loaded machine: lock wait timeouts, a lost connection), as
// a client resends with its request id, for up to 2 minutes. A create whose
// answer was lost may have been written: the request id finds it.
func createResending(ctx context.Context, stores []*repository.Store, i int, q *repository.QuotaCheck) error {
	id := fmt.Sprintf("race-%d", i)
	deadline := time.Now().Add(2 * time.Minute)
	for attempt := 0; ; attempt++ {
		s := stores[(i+attempt)%len(stores)]
		_, _, err := s.CreateCluster(ctx, repository.NewCluster{Account: "acme", DisplayName: fmt.Sprintf("c%d", i), Spec: spec, Quota: q},
			repository.NewJob{Kind: "create", ServerID: "s1", RequestID: id, Deadline: time.Now().Add(time.Hour)})
		if err != nil && attempt > 0 {
			// An earlier attempt may have been written (its answer lost):
			// then this one is refused for the request id taken.
			if _, gerr := s.GetJobByRequestID(ctx, "acme", id); gerr == nil {
				return nil
			}
		}
		if !errors.Is(err, repository.ErrUnavailable) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// raceCreates runs 32 creates of one account at once, spread over stores,
// against a limit of 5 clusters: exactly 5 must be accepted and every other
// refused with a QuotaExceededError naming the clusters limit. The stores
// share one database (or Galera cluster), whose catalog it seeds and waits
// to see through every store.
func raceCreates(t *testing.T, stores []*repository.Store) {
	t.Helper()
	ctx := ctxT(t)
	repotest.SeedCatalog(t, stores[0])
	// Every store (a Galera node) has the catalog before the race starts.
	for i, s := range stores[1:] {
		deadline := time.Now().Add(30 * time.Second)
		for {
			_, verr := s.GetKubernetesVersion(ctx, spec.KubernetesVersion)
			_, oerr := s.GetServiceOffering(ctx, spec.ServiceOffering)
			if verr == nil && oerr == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("store %d: the catalog not replicated within 30s: %v, %v", i+1, verr, oerr)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	const racers, max = 32, 5
	q := quotaOf(repository.Limits{Clusters: limit(max)})
	errs := make([]error, racers)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs[i] = createResending(ctx, stores, i, q)
		}()
	}
	close(start)
	wg.Wait()
	accepted := 0
	for i, err := range errs {
		var qe *repository.QuotaExceededError
		switch {
		case err == nil:
			accepted++
		case errors.As(err, &qe):
			v := qe.Violations
			if qe.Account != "acme" || len(v) != 1 || v[0].Limit != repository.LimitClusters || v[0].Max != max || v[0].Usage != max || v[0].Request != 1 {
				t.Errorf("racer %d refused with %+v; want clusters limit 5, usage 5, request 1", i, qe)
			}
		default:
			t.Errorf("racer %d: %v; want accepted or quota exceeded", i, err)
		}
	}
	if accepted != max {
		t.Errorf("%d creates accepted against a limit of %d", accepted, max)
	}
	got, err := stores[0].GetQuota(ctx, "acme", *q)
	if err != nil || got.Usage.Clusters != max || got.Usage.Nodes != 3*max {
		t.Errorf("GetQuota = %+v, %v; want %d clusters, %d nodes", got, err, max, 3*max)
	}
}

// TestQuotaRaceOfCreates: 32 creates of one account race on two Stores
// (two servers) on one database against a limit of 5.
func TestQuotaRaceOfCreates(t *testing.T) {
	for _, b := range repotest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			dsn := b.NewDSN(t)
			var stores []*repository.Store
			for i := range 2 {
				s, err := repository.Open(ctxT(t), dsn, repository.WithServerID(fmt.Sprintf("s%d", i+1)))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = s.Close() })
				stores = append(stores, s)
			}
			raceCreates(t, stores)
		})
	}
}

// TestQuotaRaceAcrossGaleraNodes: the same race through every node of a
// Galera cluster, where a locking read locks nothing on the other nodes:
// only the write to the account's quota row makes the creates conflict.
func TestQuotaRaceAcrossGaleraNodes(t *testing.T) {
	b, ok := repotest.Galera(t)
	if !ok {
		return
	}
	var stores []*repository.Store
	for i, dsn := range b.NodeDSNs(t) {
		s, err := repository.Open(ctxT(t), dsn, repository.WithServerID(fmt.Sprintf("node%d", i+1)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		stores = append(stores, s)
	}
	raceCreates(t, stores)
}

// TestQuotaScaleUpHoldsTheLargerUntilReleased: a scale up's claim holds its
// target (workers and offering) while it runs; a refused one writes
// nothing; the end returns the account to what the cluster has.
func TestQuotaScaleUpHoldsTheLargerUntilReleased(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		ctx := ctxT(t)
		q := quotaOf(repository.Limits{Nodes: limit(6), CPUs: limit(20)})
		c, j, err := createQuota(ctx, s, "web", q)
		if err != nil {
			t.Fatal(err)
		}
		finishRunning(t, s, c, j)
		c, _ = s.GetCluster(ctx, c.ID)
		usage := func() repository.Usage {
			t.Helper()
			got, err := s.GetQuota(ctx, "acme", *q)
			if err != nil {
				t.Fatal(err)
			}
			return got.Usage
		}
		if u := usage(); u != (repository.Usage{Clusters: 1, Nodes: 3, CPUs: 6, MemoryMB: 6144}) {
			t.Fatalf("usage of a 1+2 medium cluster = %+v", u)
		}
		claim := func(h repository.Hold) (repository.Cluster, repository.Job, error) {
			t := repository.Transition{ClusterID: c.ID, Expect: c.Expect(), Event: lifecycle.ScaleUpRequested,
				Changes: repository.Changes{Hold: &h}, Quota: q}
			return s.Claim(ctx, t, repository.NewJob{Kind: "scale", ServerID: "s1", Deadline: time.Now().Add(time.Hour)})
		}
		// 1 control + 6 workers = 7 nodes > 6.
		_, _, err = claim(repository.Hold{WorkerNodeCount: 6, ServiceOffering: "medium"})
		var qe *repository.QuotaExceededError
		if !errors.As(err, &qe) || len(qe.Violations) != 1 || qe.Violations[0] != (repository.QuotaViolation{Limit: "nodes", Max: 6, Usage: 3, Request: 4}) {
			t.Fatalf("scale to 6 workers: %v; want the nodes limit (6) exceeded by 3 + 4", err)
		}
		if got, _ := s.GetCluster(ctx, c.ID); got.Expect() != c.Expect() {
			t.Fatalf("a refused claim wrote: %v, was %v", got.Expect(), c.Expect())
		}
		// 4 workers, all nodes large (an offering change resizes the
		// control node too): 5*4 = 20 CPUs, within 20, and 5 nodes.
		held, j, err := claim(repository.Hold{WorkerNodeCount: 4, ServiceOffering: "large"})
		if err != nil {
			t.Fatal(err)
		}
		if u := usage(); u != (repository.Usage{Clusters: 1, Nodes: 5, CPUs: 20, MemoryMB: 5 * 8192}) {
			t.Fatalf("usage while scaling to 4 large workers = %+v", u)
		}
		// Another cluster cannot take what the scale holds: 3 more nodes.
		if _, _, err := createQuota(ctx, s, "other", q); !errors.Is(err, repository.ErrQuotaExceeded) {
			t.Fatalf("create beside the scale: %v; want quota exceeded", err)
		}
		// The scale fails: the cluster keeps its spec and the hold is gone.
		if _, err := s.FinishJob(ctx, repository.Finish{JobID: j.ID, Status: repository.JobFailed,
			Release: &repository.Transition{ClusterID: c.ID, Expect: held.Expect(), Event: lifecycle.OperationFailed}}); err != nil {
			t.Fatal(err)
		}
		if u := usage(); u != (repository.Usage{Clusters: 1, Nodes: 3, CPUs: 6, MemoryMB: 6144}) {
			t.Fatalf("usage after the failed scale = %+v; want what the cluster has", u)
		}
	})
}

// TestQuotaLimitsAdminAndDefault: an admin's limits replace the default for
// that account alone, and a claim that grows nothing passes even above a
// lowered limit.
func TestQuotaLimitsAdminAndDefault(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		ctx := ctxT(t)
		q := quotaOf(repository.Limits{Clusters: limit(1)})
		if _, _, err := createQuota(ctx, s, "a", q); err != nil {
			t.Fatal(err)
		}
		if _, _, err := createQuota(ctx, s, "b", q); !errors.Is(err, repository.ErrQuotaExceeded) {
			t.Fatalf("second create under the default of 1: %v", err)
		}
		if err := s.SetQuota(ctx, "acme", repository.Limits{Clusters: limit(2), Nodes: limit(6)}); err != nil {
			t.Fatal(err)
		}
		c, j, err := createQuota(ctx, s, "b", q)
		if err != nil {
			t.Fatalf("second create under the admin's 2: %v", err)
		}
		got, err := s.GetQuota(ctx, "acme", *q)
		if err != nil || !got.Explicit || *got.Limits.Clusters != 2 || *got.Limits.Nodes != 6 || got.Limits.CPUs != nil || got.Usage.Clusters != 2 {
			t.Fatalf("GetQuota = %+v, %v", got, err)
		}
		other, err := s.GetQuota(ctx, "globex", *q)
		if err != nil || other.Explicit || *other.Limits.Clusters != 1 || other.Usage != (repository.Usage{}) {
			t.Fatalf("GetQuota of an account without clusters = %+v, %v", other, err)
		}
		if err := s.SetQuota(ctx, "acme", repository.Limits{Clusters: limit(0)}); err != nil {
			t.Fatal(err)
		}
		finishRunning(t, s, c, j)
		c, _ = s.GetCluster(ctx, c.ID)
		if _, _, err := s.Claim(ctx, repository.Transition{ClusterID: c.ID, Expect: c.Expect(), Event: lifecycle.StopRequested, Quota: q},
			repository.NewJob{Kind: "stop", ServerID: "s1", Deadline: time.Now().Add(time.Hour)}); err != nil {
			t.Fatalf("a stop above a lowered limit: %v; want it to pass", err)
		}
		all, err := s.ListQuotas(ctx, *q)
		if err != nil || len(all) != 1 || all[0].Account != "acme" || all[0].Usage.Clusters != 2 {
			t.Fatalf("ListQuotas = %+v, %v", all, err)
		}
	})
}

// TestQuotaCountsControlNodesByTheirOwnOffering: control nodes with an
// offering of their own count at its size, and a workers' offering change
// leaves them at it; with no Size of its own a check reads the sizes from
// the catalog's offerings.
func TestQuotaCountsControlNodesByTheirOwnOffering(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		ctx := ctxT(t)
		q := &repository.QuotaCheck{Default: repository.Limits{CPUs: limit(11)}}
		sp := spec
		sp.ControlOffering = "large"
		c, j, err := s.CreateCluster(ctx, repository.NewCluster{Account: "acme", DisplayName: "web", Spec: sp, Quota: q},
			repository.NewJob{Kind: "create", ServerID: "s1", Deadline: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		finishRunning(t, s, c, j)
		c, _ = s.GetCluster(ctx, c.ID)
		got, err := s.GetQuota(ctx, "acme", *q)
		if err != nil || got.Usage != (repository.Usage{Clusters: 1, Nodes: 3, CPUs: 4 + 2*2, MemoryMB: 8192 + 2*2048}) {
			t.Fatalf("usage of 1 large control + 2 medium workers = %+v, %v", got.Usage, err)
		}
		// Workers to large: the control node stays large, 4 + 2*4 = 12 > 11.
		_, _, err = s.Claim(ctx, repository.Transition{ClusterID: c.ID, Expect: c.Expect(), Read: &c, Event: lifecycle.ScaleUpRequested,
			Changes: repository.Changes{Hold: &repository.Hold{WorkerNodeCount: 2, ServiceOffering: "large"}}, Quota: q},
			repository.NewJob{Kind: "scale", ServerID: "s1", Deadline: time.Now().Add(time.Hour)})
		var qe *repository.QuotaExceededError
		if !errors.As(err, &qe) || len(qe.Violations) != 1 || qe.Violations[0] != (repository.QuotaViolation{Limit: repository.LimitCPUs, Max: 11, Usage: 8, Request: 4}) {
			t.Fatalf("workers to large: %v; want the cpus limit (11) exceeded by 8 + 4", err)
		}
	})
}
