package repository_test

import (
	"errors"
	"testing"

	"github.com/clusterd/clusterd/repository"
)

// A repair entry names the operation that made it, and is written only while
// that operation holds the cluster: the history never shows a job acting
// after it lost the cluster.
func TestRecordEventOnlyByTheHolder(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		ctx := ctxT(t)
		c, j := create(t, s, "web")
		before, _ := s.ListEvents(ctx, c.ID, 0, 100)
		if err := s.RecordEvent(ctx, repository.Event{ClusterID: c.ID, From: c.State, To: c.State, Name: repository.Repair, Operation: j.ID, Message: "fixed"}); err != nil {
			t.Fatalf("repair entry by the holder: %v", err)
		}
		err := s.RecordEvent(ctx, repository.Event{ClusterID: c.ID, From: c.State, To: c.State, Name: repository.Repair, Operation: "someone-else", Message: "late"})
		if !errors.Is(err, repository.ErrNotHeld) {
			t.Errorf("repair entry by a job that does not hold the cluster: %v; want ErrNotHeld", err)
		}
		after, _ := s.ListEvents(ctx, c.ID, 0, 100)
		if len(after) != len(before)+1 || after[len(after)-1].Message != "fixed" {
			t.Errorf("history = %+v; want one entry more, the holder's", after)
		}
	})
}
