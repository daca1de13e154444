package repository_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/repository/repotest"
)

func ptr[T any](v T) *T { return &v }

func TestCatalogEntriesCanBeCreatedReadUpdatedAndDeleted(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		ctx := ctxT(t)
		v, err := s.CreateKubernetesVersion(ctx, repository.KubernetesVersion{Version: "1.32.0", State: repository.CatalogEnabled,
			MinCPUs: 2, MinMemoryMB: 4096, BinariesISO: "k-1.32.0.iso"})
		if err != nil || v.Version != "1.32.0" || v.MinMemoryMB != 4096 || v.CreateTime.IsZero() {
			t.Fatalf("create version = %+v, %v", v, err)
		}
		if _, err := s.CreateKubernetesVersion(ctx, v); !errors.Is(err, repository.ErrAlreadyExists) {
			t.Errorf("create it again: %v; want ErrAlreadyExists", err)
		}
		got, err := s.GetKubernetesVersion(ctx, "1.32.0")
		if err != nil || got != v {
			t.Errorf("get version = %+v, %v; want %+v", got, err, v)
		}
		if _, err := s.GetKubernetesVersion(ctx, "9.9.9"); !errors.Is(err, repository.ErrNotFound) {
			t.Errorf("get a missing version: %v; want ErrNotFound", err)
		}
		up, err := s.UpdateKubernetesVersion(ctx, "1.32.0", repository.KubernetesVersionChanges{State: ptr(repository.CatalogDisabled), MinCPUs: ptr[int32](4)})
		if err != nil || up.State != repository.CatalogDisabled || up.MinCPUs != 4 || up.MinMemoryMB != 4096 || up.BinariesISO != "k-1.32.0.iso" {
			t.Errorf("update version = %+v, %v; want DISABLED, 4 CPUs, the rest kept", up, err)
		}
		if _, err := s.UpdateKubernetesVersion(ctx, "9.9.9", repository.KubernetesVersionChanges{MinCPUs: ptr[int32](1)}); !errors.Is(err, repository.ErrNotFound) {
			t.Errorf("update a missing version: %v; want ErrNotFound", err)
		}
		all, err := s.ListKubernetesVersions(ctx)
		if err != nil || len(all) != len(repotest.Versions)+1 {
			t.Errorf("list versions: %d, %v; want %d", len(all), err, len(repotest.Versions)+1)
		}
		if err := s.DeleteKubernetesVersion(ctx, "1.32.0"); err != nil {
			t.Errorf("delete an unused version: %v", err)
		}
		if err := s.DeleteKubernetesVersion(ctx, "1.32.0"); !errors.Is(err, repository.ErrNotFound) {
			t.Errorf("delete it again: %v; want ErrNotFound", err)
		}

		o, err := s.CreateServiceOffering(ctx, repository.ServiceOffering{Name: "huge", CPUs: 32, MemoryMB: 65536, Description: "big", State: repository.CatalogEnabled})
		if err != nil || o.CPUs != 32 {
			t.Fatalf("create offering = %+v, %v", o, err)
		}
		if _, err := s.CreateServiceOffering(ctx, o); !errors.Is(err, repository.ErrAlreadyExists) {
			t.Errorf("create it again: %v; want ErrAlreadyExists", err)
		}
		uo, err := s.UpdateServiceOffering(ctx, "huge", repository.ServiceOfferingChanges{Description: ptr("bigger"), State: ptr(repository.CatalogDisabled)})
		if err != nil || uo.Description != "bigger" || uo.State != repository.CatalogDisabled || uo.CPUs != 32 || uo.MemoryMB != 65536 {
			t.Errorf("update offering = %+v, %v; want the size kept", uo, err)
		}
		if got, err := s.GetServiceOffering(ctx, "huge"); err != nil || got != uo {
			t.Errorf("get offering = %+v, %v; want %+v", got, err, uo)
		}
		if _, err := s.GetServiceOffering(ctx, "nope"); !errors.Is(err, repository.ErrNotFound) {
			t.Errorf("get a missing offering: %v; want ErrNotFound", err)
		}
		if list, err := s.ListServiceOfferings(ctx); err != nil || len(list) != len(repotest.Offerings)+1 || list[0].Name != "huge" {
			t.Errorf("list offerings = %+v, %v; want %d by name", list, err, len(repotest.Offerings)+1)
		}
		if err := s.DeleteServiceOffering(ctx, "huge"); err != nil {
			t.Errorf("delete an unused offering: %v", err)
		}
	})
}

func TestClaimsTakeOnlyEnabledCatalogEntries(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		ctx := ctxT(t)
		if _, err := s.UpdateKubernetesVersion(ctx, "1.29.4", repository.KubernetesVersionChanges{State: ptr(repository.CatalogDisabled)}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.UpdateServiceOffering(ctx, "large", repository.ServiceOfferingChanges{State: ptr(repository.CatalogDisabled)}); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name    string
			spec    func(*repository.Spec)
			kind    string
			entry   string
			missing bool
		}{
			{"missing version", func(sp *repository.Spec) { sp.KubernetesVersion = "9.9.9" }, "kubernetes version", "9.9.9", true},
			{"disabled version", func(sp *repository.Spec) { sp.KubernetesVersion = "1.29.4" }, "kubernetes version", "1.29.4", false},
			{"missing offering", func(sp *repository.Spec) { sp.ServiceOffering = "nope" }, "service offering", "nope", true},
			{"disabled control offering", func(sp *repository.Spec) { sp.ControlOffering = "large" }, "service offering", "large", false},
		} {
			sp := spec
			tc.spec(&sp)
			_, _, err := s.CreateCluster(ctx, repository.NewCluster{Account: "acme", DisplayName: "web", Spec: sp},
				repository.NewJob{Kind: "create", ServerID: "s1", Deadline: time.Now().Add(time.Hour)})
			var un *repository.UnusableError
			if !errors.As(err, &un) || !errors.Is(err, repository.ErrUnusable) || un.Kind != tc.kind || un.Name != tc.entry || un.Missing != tc.missing {
				t.Errorf("%s: create = %v (%+v); want an *UnusableError for %s %s, missing %v", tc.name, err, un, tc.kind, tc.entry, tc.missing)
			}
		}
		if cs, _ := s.ListClusters(ctx, repository.ClusterQuery{Limit: 10}); len(cs) != 0 {
			t.Errorf("refused creates wrote %d clusters", len(cs))
		}
		// A claim's Uses: an upgrade to a disabled version is refused and
		// changes nothing; to an enabled one it records the target.
		c := running(t, s, "web")
		_, _, err := s.Claim(ctx, repository.Transition{ClusterID: c.ID, Expect: c.Expect(), Event: lifecycle.UpgradeRequested,
			Uses: repository.Uses{Version: "1.29.4"}}, repository.NewJob{Kind: "upgrade", ServerID: "s1", Deadline: time.Now().Add(time.Hour)})
		if !errors.Is(err, repository.ErrUnusable) {
			t.Errorf("claim onto a disabled version: %v; want ErrUnusable", err)
		}
		if got, _ := s.GetCluster(ctx, c.ID); got.Expect() != c.Expect() {
			t.Errorf("a refused claim wrote: %v, was %v", got.Expect(), c.Expect())
		}
	})
}

// destroy runs a released cluster through a delete to DESTROYED.
func destroy(t *testing.T, s *repository.Store, c repository.Cluster) {
	t.Helper()
	ctx := ctxT(t)
	held, j, err := s.Claim(ctx, repository.Transition{ClusterID: c.ID, Expect: c.Expect(), Event: lifecycle.DestroyRequested},
		repository.NewJob{Kind: "delete", ServerID: "s1", Deadline: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.FinishJob(ctx, repository.Finish{JobID: j.ID, Status: repository.JobSucceeded,
		Release: &repository.Transition{ClusterID: c.ID, Expect: held.Expect(), Event: lifecycle.OperationSucceeded}}); err != nil {
		t.Fatal(err)
	}
}

func TestCatalogDeleteIsRefusedWhileInUse(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		ctx := ctxT(t)
		sp := spec
		sp.ControlOffering = "large"
		c, j, err := s.CreateCluster(ctx, repository.NewCluster{Account: "acme", DisplayName: "web", Spec: sp},
			repository.NewJob{Kind: "create", ServerID: "s1", Deadline: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			kind, name string
			del        func() error
		}{
			{"kubernetes version", "1.30.2", func() error { return s.DeleteKubernetesVersion(ctx, "1.30.2") }},
			{"service offering", "medium", func() error { return s.DeleteServiceOffering(ctx, "medium") }},
			{"service offering", "large", func() error { return s.DeleteServiceOffering(ctx, "large") }},
		} {
			err := tc.del()
			var inUse *repository.InUseError
			if !errors.As(err, &inUse) || !errors.Is(err, repository.ErrInUse) || inUse.ClusterName != "web" || inUse.ClusterID != c.ID || inUse.Kind != tc.kind {
				t.Errorf("delete %s %s used by web: %v; want an *InUseError naming web", tc.kind, tc.name, err)
			}
		}
		finishRunning(t, s, c, j)
		c, _ = s.GetCluster(ctx, c.ID)
		// A running upgrade uses its target before the cluster names it,
		// and a running scale its new offering.
		up, uj, err := s.Claim(ctx, repository.Transition{ClusterID: c.ID, Expect: c.Expect(), Event: lifecycle.UpgradeRequested,
			Uses: repository.Uses{Version: "1.30.5", Offering: "xlarge"}}, repository.NewJob{Kind: "upgrade", ServerID: "s1", Deadline: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		var inUse *repository.InUseError
		if err := s.DeleteKubernetesVersion(ctx, "1.30.5"); !errors.As(err, &inUse) || inUse.Job != uj.ID || inUse.ClusterName != "web" {
			t.Errorf("delete the target of a running upgrade: %v; want an *InUseError naming its job", err)
		}
		if err := s.DeleteServiceOffering(ctx, "xlarge"); !errors.Is(err, repository.ErrInUse) {
			t.Errorf("delete the target offering of a running job: %v; want ErrInUse", err)
		}
		if _, err := s.FinishJob(ctx, repository.Finish{JobID: uj.ID, Status: repository.JobFailed,
			Release: &repository.Transition{ClusterID: c.ID, Expect: up.Expect(), Event: lifecycle.OperationFailed}}); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteKubernetesVersion(ctx, "1.30.5"); err != nil {
			t.Errorf("delete the target of an ended upgrade: %v", err)
		}
		// A destroyed cluster uses nothing.
		c, _ = s.GetCluster(ctx, c.ID)
		if c.CurrentOperation != "" {
			t.Fatalf("cluster still held: %+v", c)
		}
		if c.State != lifecycle.Running {
			// OperationFailed from UPGRADING: the cluster may rest elsewhere.
			t.Logf("after the failed upgrade: %s", c.State)
		}
		destroy(t, s, c)
		if err := s.DeleteKubernetesVersion(ctx, "1.30.2"); err != nil {
			t.Errorf("delete the version of a destroyed cluster: %v", err)
		}
		if err := s.DeleteServiceOffering(ctx, "large"); err != nil {
			t.Errorf("delete the control offering of a destroyed cluster: %v", err)
		}
	})
}

func TestSeedCatalogFillsOnlyAnEmptyCatalog(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := ctxT(t)
			var stores []*repository.Store
			dsns := []string{b.NewDSN(t)}
			if b.NodeDSNs != nil {
				dsns = b.NodeDSNs(t)
			}
			for i := range 2 {
				s, err := repository.Open(ctx, dsns[i%len(dsns)])
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = s.Close() })
				stores = append(stores, s)
			}
			vs := []repository.KubernetesVersion{{Version: "1.30.2"}, {Version: "1.31.1"}}
			os := []repository.ServiceOffering{{Name: "medium", CPUs: 2, MemoryMB: 2048}}
			// Servers starting together seed at once: every one succeeds.
			var wg sync.WaitGroup
			errs := make([]error, 8)
			for i := range errs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs[i] = stores[i%2].SeedCatalog(context.Background(), vs, os)
				}()
			}
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Errorf("seed %d: %v", i, err)
				}
			}
			got, err := stores[0].ListKubernetesVersions(ctx)
			if err != nil || len(got) != 2 || got[0].State != repository.CatalogEnabled {
				t.Errorf("versions after seeding = %+v, %v; want 2 ENABLED", got, err)
			}
			// Once the catalog holds entries, seeding changes nothing.
			if err := stores[0].SeedCatalog(ctx, []repository.KubernetesVersion{{Version: "2.0.0"}}, []repository.ServiceOffering{{Name: "tiny", CPUs: 1, MemoryMB: 1}}); err != nil {
				t.Fatal(err)
			}
			if got, _ := stores[0].ListKubernetesVersions(ctx); len(got) != 2 {
				t.Errorf("seeding a filled catalog added versions: %+v", got)
			}
			if got, _ := stores[0].ListServiceOfferings(ctx); len(got) != 1 {
				t.Errorf("seeding a filled catalog added offerings: %+v", got)
			}
		})
	}
}

// racers is how many creates race one delete of the catalog entry they use.
const racers = 32

// TestCatalogDeleteRacesCreates races 32 creates on a catalog entry against
// one delete of it, through two stores (on Galera, two nodes): exactly one
// side wins (the delete, and no create; or creates, and the delete is
// refused as in use), and no live cluster names a deleted entry.
func TestCatalogDeleteRacesCreates(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := ctxT(t)
			dsns := []string{b.NewDSN(t)}
			if b.NodeDSNs != nil {
				dsns = b.NodeDSNs(t)
			}
			var stores []*repository.Store
			for i := range 2 {
				s, err := repository.Open(ctx, dsns[i%len(dsns)], repository.WithServerID(fmt.Sprintf("s%d", i+1)))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = s.Close() })
				repotest.SeedCatalog(t, s)
				stores = append(stores, s)
			}
			rounds := 4
			if b.Name == "galera" {
				rounds = repotest.GaleraRounds(t, 4)
			}
			for _, kind := range []string{"version", "offering"} {
				outcomes := map[string]int{}
				for round := range rounds {
					outcomes[raceDelete(t, stores, kind, round)]++
				}
				t.Logf("%s: %d rounds of %d creates vs one delete: %v", kind, rounds, racers, outcomes)
			}
		})
	}
}

// raceDelete runs one round and returns which side won.
func raceDelete(t *testing.T, stores []*repository.Store, kind string, round int) string {
	t.Helper()
	ctx := ctxT(t)
	name := fmt.Sprintf("9.%d.0", round)
	sp := spec
	del := func(s *repository.Store) error { return s.DeleteKubernetesVersion(context.Background(), name) }
	if kind == "version" {
		if _, err := stores[0].CreateKubernetesVersion(ctx, repository.KubernetesVersion{Version: name, State: repository.CatalogEnabled}); err != nil {
			t.Fatal(err)
		}
		sp.KubernetesVersion = name
	} else {
		name = fmt.Sprintf("race-%d", round)
		if _, err := stores[0].CreateServiceOffering(ctx, repository.ServiceOffering{Name: name, CPUs: 2, MemoryMB: 2048, State: repository.CatalogEnabled}); err != nil {
			t.Fatal(err)
		}
		// Half the racers use it for their control nodes only.
		del = func(s *repository.Store) error { return s.DeleteServiceOffering(context.Background(), name) }
	}
	// Every store sees the entry before the race starts (Galera applies
	// another node's write-set asynchronously).
	for _, s := range stores[1:] {
		deadline := time.Now().Add(30 * time.Second)
		for {
			var err error
			if kind == "version" {
				_, err = s.GetKubernetesVersion(ctx, name)
			} else {
				_, err = s.GetServiceOffering(ctx, name)
			}
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s %s not replicated within 30s: %v", kind, name, err)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	createErrs := make([]error, racers)
	ids := make([]string, racers)
	var delErr error
	for i := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			csp := sp
			if kind == "offering" {
				if i%2 == 0 {
					csp.ServiceOffering = name
				} else {
					csp.ControlOffering = name
				}
			}
			<-start
			if i%4 == round%4 {
				// Some creates come a moment late, so that some rounds
				// the delete commits first.
				time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
			}
			c, _, err := stores[i%len(stores)].CreateCluster(context.Background(),
				repository.NewCluster{Account: "acme", DisplayName: fmt.Sprintf("r%d-%s-%d", round, kind, i), Spec: csp},
				repository.NewJob{Kind: "create", ServerID: "s1", Deadline: time.Now().Add(time.Hour)})
			createErrs[i], ids[i] = err, c.ID
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		<-start
		delErr = del(stores[1])
	}()
	close(start)
	wg.Wait()
	created, unavailable := 0, 0
	for i, err := range createErrs {
		var un *repository.UnusableError
		switch {
		case err == nil:
			created++
		case errors.As(err, &un) && un.Missing && un.Name == name:
		case errors.Is(err, repository.ErrUnavailable):
			// A create that lost its lock conflicts more times than it may
			// retry wrote nothing; it is neither side's win.
			unavailable++
		default:
			t.Errorf("round %d: create %d: %v; want success or the %s missing", round, i, err, kind)
		}
	}
	live := 0
	for _, s := range stores {
		// Read through every store (node), each once it has caught up.
		cs, err := s.ListClusters(ctx, repository.ClusterQuery{Limit: 10000})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, c := range cs {
			if c.State != lifecycle.Destroyed && (c.Spec.KubernetesVersion == name || c.Spec.ServiceOffering == name || c.Spec.ControlOffering == name) {
				n++
			}
		}
		live = max(live, n)
	}
	if unavailable > 0 {
		t.Logf("round %d: %d creates gave up after their lock-conflict retries", round, unavailable)
	}
	switch {
	case delErr == nil:
		if created != 0 || live != 0 {
			t.Errorf("round %d: the delete of %s %s won and %d creates succeeded, %d live clusters name it", round, kind, name, created, live)
		}
		return "delete"
	case errors.Is(delErr, repository.ErrInUse):
		if created == 0 {
			t.Errorf("round %d: the delete was refused as in use (%v) but no create succeeded", round, delErr)
		}
		return "creates"
	case errors.Is(delErr, repository.ErrUnavailable) && created > 0:
		return "creates (delete unavailable)"
	default:
		t.Errorf("round %d: delete: %v (%d created, %d unavailable)", round, delErr, created, unavailable)
		return "error"
	}
}
