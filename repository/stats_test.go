package repository_test

import (
	"maps"
	"testing"

	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
)

func TestCountClustersByState(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		got, err := s.CountClusters(ctxT(t))
		if err != nil || len(got) != 0 {
			t.Fatalf("empty database: %v, %v; want no states", got, err)
		}
		create(t, s, "new")
		running(t, s, "web-1")
		running(t, s, "web-2")
		got, err = s.CountClusters(ctxT(t))
		want := map[lifecycle.State]int64{lifecycle.Created: 1, lifecycle.Running: 2}
		if err != nil || !maps.Equal(got, want) {
			t.Errorf("CountClusters = %v, %v; want %v", got, err, want)
		}
		if st := s.PoolStats(); st.OpenConnections < 1 || st.MaxOpenConnections < 1 {
			t.Errorf("PoolStats = %+v; want an open connection and a bound", st)
		}
	})
}
