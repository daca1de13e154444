package sim_test

import (
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/infra/sim"
)

// The simulator's fencing log, its own table, is purged past the retention
// period, oldest first, a page at a time; recent entries stay.
func TestPurgeCallLogKeepsRecent(t *testing.T) {
	var now atomic.Pointer[time.Time]
	noon := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	now.Store(&noon)
	clock := func() time.Time { return *now.Load() }
	forEachBackend(t, sim.Config{Clock: clock}, func(t *testing.T, s *sim.Simulator) {
		ctx := ctxT(t)
		now.Store(&noon)
		c := newCluster(t, s) // its provisioning calls are the old ones
		old, err := sim.Calls(ctx, storeOf(s), c.id)
		if err != nil || len(old) < 2 {
			t.Fatalf("calls of a new cluster: %d, %v; want at least 2", len(old), err)
		}
		later := noon.Add(8 * 24 * time.Hour)
		now.Store(&later)
		if err := s.FetchKubeconfig(ctx, c.call("")); err != nil {
			t.Fatal(err)
		}
		cutoff := later.Add(-7 * 24 * time.Hour)
		steps := func() []string {
			t.Helper()
			calls, err := sim.Calls(ctx, storeOf(s), c.id)
			if err != nil {
				t.Fatal(err)
			}
			var out []string
			for _, c := range calls {
				out = append(out, c.Fence.Step)
			}
			return out
		}
		if n, err := s.PurgeCallLog(ctx, cutoff, 1); err != nil || n != 1 {
			t.Fatalf("first page: purged %d, %v; want 1", n, err)
		}
		if got := steps(); len(got) != len(old) || got[len(got)-1] != infra.StepFetchKubeconfig {
			t.Errorf("after one page of 1: %v; want the oldest of %d gone, the recent call kept", got, len(old))
		}
		purged := int64(1)
		for range len(old) {
			n, err := s.PurgeCallLog(ctx, cutoff, 2)
			if err != nil {
				t.Fatal(err)
			}
			if purged += n; n == 0 {
				break
			}
		}
		if purged != int64(len(old)) {
			t.Errorf("purged %d calls in all; want the %d old ones", purged, len(old))
		}
		if got := steps(); !slices.Equal(got, []string{infra.StepFetchKubeconfig}) {
			t.Errorf("left %v; want only the recent call", got)
		}
	})
}
