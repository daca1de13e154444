package repository_test

import (
	"errors"
	"testing"
	"time"

	"github.com/clusterd/clusterd/repository"
)

// A process takes a server id over only from the row it saw: of two that
// start together one wins, and a predecessor that heartbeat in between
// keeps its id. A graceful stop marks the row so a successor need not wait.
func TestTakeOverServer(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		ctx := ctxT(t)
		first, err := s.TakeOverServer(ctx, "srv", nil, repository.Registrant{Incarnation: repository.NewIncarnation(), Host: "host-a", PID: 100})
		if err != nil {
			t.Fatalf("first registration: %v", err)
		}
		if got, _ := s.GetServer(ctx, "srv"); got.Host != "host-a" || got.PID != 100 || got.Incarnation != first.Incarnation {
			t.Errorf("row = %+v; want host-a, pid 100, %s", got, first.Incarnation)
		}
		if _, err := s.TakeOverServer(ctx, "srv", nil, repository.Registrant{Incarnation: repository.NewIncarnation(), Host: "host-b", PID: 200}); !errors.Is(err, repository.ErrConflict) {
			t.Errorf("second registration of a new id: %v; want ErrConflict", err)
		}
		seen, _ := s.GetServer(ctx, "srv")
		time.Sleep(2 * time.Millisecond) // the heartbeat must write a later time than seen
		if _, err := s.Heartbeat(ctx, first); err != nil {
			t.Fatal(err)
		}
		if _, err := s.TakeOverServer(ctx, "srv", &seen, repository.Registrant{Incarnation: repository.NewIncarnation(), Host: "host-b", PID: 200}); !errors.Is(err, repository.ErrConflict) {
			t.Errorf("take over from a row that heartbeat since: %v; want ErrConflict", err)
		}
		now, _ := s.GetServer(ctx, "srv")
		second, err := s.TakeOverServer(ctx, "srv", &now, repository.Registrant{Incarnation: repository.NewIncarnation(), Host: "host-b", PID: 200})
		if err != nil {
			t.Fatalf("take over from the row as seen: %v", err)
		}
		if _, err := s.Heartbeat(ctx, first); !errors.Is(err, repository.ErrConflict) {
			t.Errorf("heartbeat of the superseded incarnation: %v; want ErrConflict", err)
		}
		if err := s.ReleaseServer(ctx, first); err != nil {
			t.Fatal(err)
		}
		if got, _ := s.GetServer(ctx, "srv"); got.Incarnation != second.Incarnation || got.HeartbeatTime.Equal(repository.Stopped) {
			t.Errorf("a superseded incarnation's release touched the row: %+v", got)
		}
		if err := s.ReleaseServer(ctx, second); err != nil {
			t.Fatal(err)
		}
		if got, _ := s.GetServer(ctx, "srv"); !got.HeartbeatTime.Equal(repository.Stopped) {
			t.Errorf("released row heartbeat = %v; want %v", got.HeartbeatTime, repository.Stopped)
		}
		// Its peers count it dead at once.
		_, j := claimOn(t, s, "left", second)
		if _, stopped, err := s.FailJobsOfDeadServers(ctx, repository.Server{ID: "peer", Incarnation: "p"}, time.Now().Add(-time.Hour), nil, errJSON("server restarted"), errJSON("owner server stopped")); err != nil || stopped != 1 {
			t.Errorf("jobs of a stopped server failed: %d, %v; want 1", stopped, err)
		}
		if got, _ := s.GetJob(ctx, j.ID); got.Status != repository.JobFailed {
			t.Errorf("job of the stopped server = %s; want FAILED", got.Status)
		}
	})
}
