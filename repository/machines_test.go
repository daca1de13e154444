package repository_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
)

func newMachine(t *testing.T, s *repository.Store, clusterID, role string) repository.Machine {
	t.Helper()
	m, err := s.CreateMachine(ctxT(t), repository.Machine{
		ID: uuid.NewString(), ClusterID: clusterID, Role: role, Power: "RUNNING",
		KubernetesVersion: "1.30.2", Offering: "medium",
	})
	if err != nil {
		t.Fatalf("CreateMachine: %v", err)
	}
	return m
}

func TestMachineCreateGetListDelete(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		ctx := ctxT(t)
		a := newMachine(t, s, "cluster-a", "CONTROL")
		b := newMachine(t, s, "cluster-b", "WORKER")
		free := newMachine(t, s, "", "EXTERNAL")

		got, err := s.GetMachine(ctx, a.ID)
		if err != nil || !reflect.DeepEqual(got, a) {
			t.Errorf("GetMachine = %+v, %v; want %+v", got, err, a)
		}
		if a.CreateTime.IsZero() || a.UpdateTime != a.CreateTime {
			t.Errorf("times of a new machine = %v, %v; want both set and equal", a.CreateTime, a.UpdateTime)
		}
		if _, err := s.CreateMachine(ctx, repository.Machine{ID: a.ID, Role: "WORKER", Power: "RUNNING"}); !errors.Is(err, repository.ErrAlreadyExists) {
			t.Errorf("CreateMachine of an existing id: err = %v; want ErrAlreadyExists", err)
		}

		tests := []struct {
			name     string
			clusters []string
			want     []repository.Machine
		}{
			{"all", nil, []repository.Machine{a, b, free}},
			{"one cluster", []string{"cluster-b"}, []repository.Machine{b}},
			{"two clusters", []string{"cluster-a", "cluster-b"}, []repository.Machine{a, b}},
			{"free pool", []string{""}, []repository.Machine{free}},
			{"unknown cluster", []string{"nope"}, []repository.Machine{}},
		}
		for _, tt := range tests {
			got, err := s.ListMachines(ctx, tt.clusters...)
			if err != nil {
				t.Fatalf("ListMachines(%s): %v", tt.name, err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ListMachines(%s) = %+v; want %+v", tt.name, got, tt.want)
			}
		}

		if err := s.DeleteMachine(ctx, b.ID); err != nil {
			t.Fatalf("DeleteMachine: %v", err)
		}
		if _, err := s.GetMachine(ctx, b.ID); !errors.Is(err, repository.ErrNotFound) {
			t.Errorf("GetMachine after delete: err = %v; want ErrNotFound", err)
		}
		if err := s.DeleteMachine(ctx, b.ID); err != nil {
			t.Errorf("DeleteMachine of a missing machine: %v; want success", err)
		}
	})
}

// UpdateMachine and ChangeMachine make the same writes and misses; only
// UpdateMachine returns the machine (for ChangeMachine, update reads it
// after a write that succeeded).
func TestUpdateMachine(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		for _, w := range []struct {
			name   string
			update func(ctx context.Context, id string, cond repository.MachineCondition, ch repository.MachineChanges) (repository.Machine, error)
		}{
			{"UpdateMachine", s.UpdateMachine},
			{"ChangeMachine", func(ctx context.Context, id string, cond repository.MachineCondition, ch repository.MachineChanges) (repository.Machine, error) {
				if err := s.ChangeMachine(ctx, id, cond, ch); err != nil {
					return repository.Machine{}, err
				}
				return s.GetMachine(ctx, id)
			}},
		} {
			t.Run(w.name, func(t *testing.T) { testUpdateMachine(t, s, w.update) })
		}
	})
}

func testUpdateMachine(t *testing.T, s *repository.Store, update func(ctx context.Context, id string, cond repository.MachineCondition, ch repository.MachineChanges) (repository.Machine, error)) {
	{
		ctx := ctxT(t)
		m := newMachine(t, s, "cluster-a", "WORKER")

		got, err := update(ctx, m.ID, repository.MachineCondition{}, repository.MachineChanges{
			Power: new("STOPPED"), Joined: new(true), AttachedISO: new("k8s.iso"),
		})
		if err != nil {
			t.Fatalf("UpdateMachine: %v", err)
		}
		want := m
		want.Power, want.Joined, want.AttachedISO, want.UpdateTime = "STOPPED", true, "k8s.iso", got.UpdateTime
		if !reflect.DeepEqual(got, want) {
			t.Errorf("UpdateMachine wrote %+v; want only power, joined and ISO changed: %+v", got, want)
		}
		if read, _ := s.GetMachine(ctx, m.ID); !reflect.DeepEqual(read, got) {
			t.Errorf("read back %+v; UpdateMachine returned %+v", read, got)
		}

		// Writing identical values is a hit (clientFoundRows on MySQL).
		if _, err := update(ctx, m.ID, repository.MachineCondition{Power: "STOPPED"}, repository.MachineChanges{Power: new("STOPPED")}); err != nil {
			t.Errorf("identical write: %v", err)
		}

		// Clearing fields: pointers to zero values are written.
		got, err = update(ctx, m.ID, repository.MachineCondition{}, repository.MachineChanges{Joined: new(false), AttachedISO: new("")})
		if err != nil || got.Joined || got.AttachedISO != "" {
			t.Errorf("clearing joined and ISO = %+v, %v", got, err)
		}

		misses := []struct {
			name string
			cond repository.MachineCondition
		}{
			{"other cluster", repository.MachineCondition{ClusterIDs: []string{"cluster-b"}}},
			{"free pool", repository.MachineCondition{ClusterIDs: []string{""}}},
			{"role", repository.MachineCondition{Role: "EXTERNAL"}},
			{"power", repository.MachineCondition{Power: "RUNNING"}},
		}
		for _, tt := range misses {
			before, _ := s.GetMachine(ctx, m.ID)
			_, err := update(ctx, m.ID, tt.cond, repository.MachineChanges{Offering: new("large")})
			if !errors.Is(err, repository.ErrConflict) {
				t.Errorf("%s: err = %v; want ErrConflict", tt.name, err)
			}
			if after, _ := s.GetMachine(ctx, m.ID); !reflect.DeepEqual(after, before) {
				t.Errorf("%s: a missed update wrote %+v (was %+v)", tt.name, after, before)
			}
		}
		if _, err := update(ctx, m.ID, repository.MachineCondition{ClusterIDs: []string{"", "cluster-a"}}, repository.MachineChanges{Offering: new("large")}); err != nil {
			t.Errorf("condition naming the machine's cluster among others: %v", err)
		}
		if _, err := update(ctx, "missing", repository.MachineCondition{}, repository.MachineChanges{Offering: new("large")}); !errors.Is(err, repository.ErrNotFound) {
			t.Errorf("update of a missing machine: err = %v; want ErrNotFound", err)
		}
		if _, err := update(ctx, "missing", repository.MachineCondition{ClusterIDs: []string{""}}, repository.MachineChanges{}); !errors.Is(err, repository.ErrNotFound) {
			t.Errorf("conditional update of a missing machine: err = %v; want ErrNotFound", err)
		}
	}
}

func TestAdoptingAFreeMachineHasOneWinner(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		ctx := ctxT(t)
		free := newMachine(t, s, "", "EXTERNAL")
		const n = 8
		var (
			wg       sync.WaitGroup
			start    = make(chan struct{})
			errs     = make([]error, n)
			adopters = make([]repository.Machine, n)
		)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				adopters[i], errs[i] = s.UpdateMachine(ctx, free.ID,
					repository.MachineCondition{ClusterIDs: []string{""}, Role: "EXTERNAL", Power: "RUNNING"},
					repository.MachineChanges{ClusterID: new(fmt.Sprintf("cluster-%d", i)), Role: new("WORKER")})
			}()
		}
		close(start)
		wg.Wait()
		winner := -1
		for i, err := range errs {
			switch {
			case err == nil && winner >= 0:
				t.Errorf("clusters %d and %d both adopted the machine", winner, i)
			case err == nil:
				winner = i
			case !errors.Is(err, repository.ErrConflict):
				t.Errorf("loser %d: err = %v; want ErrConflict", i, err)
			}
		}
		if winner < 0 {
			t.Fatal("nobody adopted the free machine")
		}
		got, err := s.GetMachine(ctx, free.ID)
		if err != nil || got.ClusterID != fmt.Sprintf("cluster-%d", winner) || got.Role != "WORKER" {
			t.Errorf("machine = %+v, %v; want a WORKER of cluster-%d", got, err, winner)
		}
	})
}

func TestNetworkRulesAreIdempotent(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		ctx := ctxT(t)
		m1 := newMachine(t, s, "cluster-a", "CONTROL")
		m2 := newMachine(t, s, "cluster-a", "WORKER")
		api := repository.NetworkRule{ClusterID: "cluster-a", MachineID: m1.ID, Kind: "api", Port: 6443}
		ssh1 := repository.NetworkRule{ClusterID: "cluster-a", MachineID: m1.ID, Kind: "ssh", Port: 22}
		ssh2 := repository.NetworkRule{ClusterID: "cluster-a", MachineID: m2.ID, Kind: "ssh", Port: 22}
		other := repository.NetworkRule{ClusterID: "cluster-b", MachineID: "m-b", Kind: "ssh", Port: 22}

		list := func(cluster string) []repository.NetworkRule {
			t.Helper()
			got, err := s.ListNetworkRules(ctx, cluster)
			if err != nil {
				t.Fatalf("ListNetworkRules: %v", err)
			}
			return got
		}
		sorted := func(rs ...repository.NetworkRule) []repository.NetworkRule {
			// ListNetworkRules orders by machine, kind, port.
			return slices.SortedFunc(slices.Values(rs), func(a, b repository.NetworkRule) int {
				return cmp.Or(cmp.Compare(a.MachineID, b.MachineID), cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Port, b.Port))
			})
		}

		if err := s.AddNetworkRules(ctx, []repository.NetworkRule{api, ssh1, other}); err != nil {
			t.Fatalf("AddNetworkRules: %v", err)
		}
		// Again, with one new rule among existing ones.
		if err := s.AddNetworkRules(ctx, []repository.NetworkRule{api, ssh1, ssh2}); err != nil {
			t.Fatalf("AddNetworkRules of existing rules: %v", err)
		}
		if got, want := list("cluster-a"), sorted(api, ssh1, ssh2); !reflect.DeepEqual(got, want) {
			t.Errorf("rules = %+v; want %+v", got, want)
		}
		if got := list("cluster-b"); !reflect.DeepEqual(got, []repository.NetworkRule{other}) {
			t.Errorf("other cluster's rules = %+v; want %+v", got, other)
		}

		for range 2 {
			if err := s.DeleteNetworkRules(ctx, []repository.NetworkRule{ssh2, api}); err != nil {
				t.Fatalf("DeleteNetworkRules: %v", err)
			}
		}
		if got := list("cluster-a"); !reflect.DeepEqual(got, []repository.NetworkRule{ssh1}) {
			t.Errorf("rules after delete = %+v; want %+v", got, ssh1)
		}

		if err := s.AddNetworkRules(ctx, []repository.NetworkRule{api, ssh2}); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteMachine(ctx, m1.ID); err != nil {
			t.Fatal(err)
		}
		if got := list("cluster-a"); !reflect.DeepEqual(got, []repository.NetworkRule{ssh2}) {
			t.Errorf("rules after deleting %s = %+v; want only %+v", m1.ID, got, ssh2)
		}
		if err := s.AddNetworkRules(ctx, nil); err != nil {
			t.Errorf("adding no rules: %v", err)
		}
		if err := s.DeleteNetworkRules(ctx, nil); err != nil {
			t.Errorf("deleting no rules: %v", err)
		}
	})
}

// TestGetClusterWithMachines holds the one-statement read to what GetCluster
// and ListMachines read in two: a cluster without machines, with one, with
// several (oldest first, free machines and other clusters' left out), a
// missing one, and the same inside a transaction.
func TestGetClusterWithMachines(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		ctx := ctxT(t)
		bare, _ := create(t, s, "bare")
		one := running(t, s, "one")
		many := running(t, s, "many")
		newMachine(t, s, one.ID, "CONTROL")
		for _, role := range []string{"CONTROL", "WORKER", "WORKER", "WORKER"} {
			newMachine(t, s, many.ID, role)
			newMachine(t, s, "", "EXTERNAL")
		}
		m := newMachine(t, s, many.ID, "WORKER")
		if _, err := s.UpdateMachine(ctx, m.ID, repository.MachineCondition{}, repository.MachineChanges{Cordoned: ptr(true), Joined: ptr(true)}); err != nil {
			t.Fatal(err)
		}

		check := func(t *testing.T, s *repository.Store, id string) {
			t.Helper()
			wantC, err := s.GetCluster(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			wantM, err := s.ListMachines(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			c, ms, err := s.GetClusterWithMachines(ctx, id)
			if err != nil {
				t.Fatalf("GetClusterWithMachines(%s): %v", wantC.DisplayName, err)
			}
			if !reflect.DeepEqual(c, wantC) {
				t.Errorf("GetClusterWithMachines(%s): cluster %+v; want %+v", wantC.DisplayName, c, wantC)
			}
			if len(ms) != len(wantM) || (len(ms) > 0 && !reflect.DeepEqual(ms, wantM)) {
				t.Errorf("GetClusterWithMachines(%s): machines %+v; want %+v", wantC.DisplayName, ms, wantM)
			}
		}
		for _, id := range []string{bare.ID, one.ID, many.ID} {
			check(t, s, id)
		}
		if _, _, err := s.GetClusterWithMachines(ctx, "nope"); !errors.Is(err, repository.ErrNotFound) {
			t.Errorf("GetClusterWithMachines of a missing cluster: %v; want ErrNotFound", err)
		}
		// Inside a transaction (a driver's guarded change) it reads what the
		// transaction wrote.
		before, err := s.ListMachines(ctx, many.ID)
		if err != nil {
			t.Fatal(err)
		}
		c, j, err := s.Claim(ctx, repository.Transition{ClusterID: many.ID, Expect: many.Expect(),
			Event: lifecycle.StopRequested}, repository.NewJob{Kind: "stop", ServerID: "s1", Deadline: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		err = s.Guarded(ctx, repository.Fence{ClusterID: c.ID, JobID: j.ID, Attempt: j.Attempt}, func(tx *repository.Store) error {
			if _, err := tx.UpdateMachine(ctx, before[0].ID, repository.MachineCondition{}, repository.MachineChanges{Cordoned: ptr(true)}); err != nil {
				return err
			}
			added, err := tx.CreateMachine(ctx, repository.Machine{ID: uuid.NewString(), ClusterID: many.ID, Role: "WORKER", Power: "RUNNING"})
			if err != nil {
				return err
			}
			_, ms, err := tx.GetClusterWithMachines(ctx, many.ID)
			if err != nil {
				return err
			}
			if len(ms) != len(before)+1 || !ms[0].Cordoned || !slices.ContainsFunc(ms, func(m repository.Machine) bool { return m.ID == added.ID }) {
				t.Errorf("GetClusterWithMachines in the transaction that cordoned %s and added %s: %+v", before[0].ID, added.ID, ms)
			}
			check(t, tx, many.ID)
			if _, _, err := tx.GetClusterWithMachines(ctx, "nope"); !errors.Is(err, repository.ErrNotFound) {
				t.Errorf("GetClusterWithMachines of a missing cluster in a transaction: %v; want ErrNotFound", err)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
}
