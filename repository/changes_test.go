package repository_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
)

// feedLine is a change as the tests compare it.
func feedLine(c repository.Change) string {
	s := c.Kind
	switch c.Kind {
	case repository.ChangeHistory:
		s += fmt.Sprintf(" %s v%d", c.State, c.Version)
		if c.Event != nil {
			s += " " + c.Event.Name
		}
	default:
		s += fmt.Sprintf(" %s %s %d/%d", c.Status, c.Step, c.StepsDone, c.StepsTotal)
	}
	return s
}

func readAll(t *testing.T, s *repository.Store, q repository.ChangeQuery) []repository.Change {
	t.Helper()
	if q.Limit == 0 {
		q.Limit = 100
	}
	cs, err := s.ReadChanges(ctxT(t), q)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// Every change a watcher must see writes its row of the feed, in its own
// transaction, in the order the changes were made, with the cluster's
// state as the change left it and the history entry it wrote.
func TestChangeFeedRecordsEveryChange(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		ctx := ctxT(t)
		c, j := create(t, s, "web")
		other, _ := create(t, s, "other")
		if _, err := s.RecordProgress(ctx, j.ID, repository.Progress{Step: "power_on", StepsDone: 1, StepsTotal: 3}); err != nil {
			t.Fatal(err)
		}
		finishRunning(t, s, c, j)
		if err := s.RecordEvent(ctx, repository.Event{ClusterID: c.ID, Name: repository.Repair, From: lifecycle.Running,
			To: lifecycle.Running, Message: "converged"}); err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, ch := range readAll(t, s, repository.ChangeQuery{ClusterID: c.ID}) {
			if ch.ClusterID != c.ID || ch.Account != "acme" {
				t.Errorf("change %d: cluster %s account %s; want %s acme", ch.ID, ch.ClusterID, ch.Account, c.ID)
			}
			got = append(got, feedLine(ch))
		}
		want := []string{
			"HISTORY CREATED v1 CLUSTER_CREATED",
			"PROGRESS IN_PROGRESS power_on 1/3",
			"HISTORY STARTING v2 START_REQUESTED",
			"HISTORY RUNNING v3 OPERATION_SUCCEEDED",
			"JOB_ENDED SUCCEEDED power_on 1/3",
			"HISTORY RUNNING v3 REPAIR",
		}
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("feed of %s:\n  %s\nwant\n  %s", c.ID, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
		}
		all := readAll(t, s, repository.ChangeQuery{})
		if len(all) != len(want)+1 {
			t.Errorf("whole feed: %d rows; want %d (the other cluster's create too)", len(all), len(want)+1)
		}
		for i := 1; i < len(all); i++ {
			if all[i].ID <= all[i-1].ID {
				t.Errorf("feed not in id order: %d after %d", all[i].ID, all[i-1].ID)
			}
		}
		if n := len(readAll(t, s, repository.ChangeQuery{After: all[1].ID})); n != len(all)-2 {
			t.Errorf("after the second row: %d rows; want %d", n, len(all)-2)
		}
		if n := len(readAll(t, s, repository.ChangeQuery{Account: "nobody"})); n != 0 {
			t.Errorf("another account's feed: %d rows; want none", n)
		}
		if cs := readAll(t, s, repository.ChangeQuery{ClusterID: other.ID}); len(cs) != 1 || cs[0].Event == nil || cs[0].Event.Name != repository.ClusterCreated {
			t.Errorf("feed of the other cluster: %+v; want its creation", cs)
		}
	})
}

// A job that recovery fails writes its end to the feed too.
func TestChangeFeedRecordsRecoveryEnds(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		ctx := ctxT(t)
		_, j := create(t, s, "web")
		if err := s.FailJobUnchanged(ctx, j.ID, j.UpdateTime, `{"code":14}`); err != nil {
			t.Fatal(err)
		}
		cs := readAll(t, s, repository.ChangeQuery{})
		last := cs[len(cs)-1]
		if last.Kind != repository.ChangeJobEnded || last.Operation != j.ID || last.Status != repository.JobFailed {
			t.Errorf("last change = %+v; want the job's end", last)
		}
	})
}

// A cancellation request writes a progress row (once), so that watchers
// learn of it before the job's next step; one for a finished job writes
// none.
func TestChangeFeedRecordsCancelRequests(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		ctx := ctxT(t)
		c, j := create(t, s, "web")
		before := len(readAll(t, s, repository.ChangeQuery{ClusterID: c.ID}))
		for range 2 {
			got, err := s.RequestCancel(ctx, j.ID)
			if err != nil || !got.CancelRequested {
				t.Fatalf("RequestCancel: %+v, %v; want the job with its cancellation requested", got, err)
			}
			j = got
		}
		cs := readAll(t, s, repository.ChangeQuery{ClusterID: c.ID})
		if len(cs) != before+1 {
			t.Fatalf("after two cancellation requests the feed has %d more rows; want 1", len(cs)-before)
		}
		if last := cs[len(cs)-1]; last.Kind != repository.ChangeProgress || last.Operation != j.ID || last.Status != repository.JobInProgress {
			t.Errorf("the request's row = %+v; want a progress row of the running job", last)
		}
		if err := s.FailJobUnchanged(ctx, j.ID, j.UpdateTime, `{"code":1}`); err != nil {
			t.Fatal(err)
		}
		ended := len(readAll(t, s, repository.ChangeQuery{ClusterID: c.ID}))
		if _, err := s.RequestCancel(ctx, j.ID); err != nil {
			t.Fatal(err)
		}
		if n := len(readAll(t, s, repository.ChangeQuery{ClusterID: c.ID})); n != ended {
			t.Errorf("a cancellation request for an ended job wrote %d rows; want none", n-ended)
		}
	})
}

// Rows are settled once they are older than the settle window by the
// database's clock; a purge deletes the rows older than the retention and
// records the highest id it deleted; a watch starting on an empty feed
// starts there.
func TestChangeFeedSettlesAndPurges(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		ctx := ctxT(t)
		create(t, s, "a")
		create(t, s, "b")
		if cs := readAll(t, s, repository.ChangeQuery{Settle: time.Hour}); len(cs) != 2 || cs[0].Settled || cs[1].Settled {
			t.Fatalf("with an hour's settle window: %+v; want 2 unsettled rows", cs)
		}
		head, err := s.ChangeHead(ctx, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		all := readAll(t, s, repository.ChangeQuery{})
		if head.Floor != all[0].ID-1 || len(head.Above) != 2 || head.Above[0] != all[0].ID || head.Above[1] != all[1].ID {
			t.Errorf("head with nothing settled = %+v; want the floor below %d and both ids above it", head, all[0].ID)
		}
		waitSettled(ctx, t, s, 2*time.Millisecond)
		head, err = s.ChangeHead(ctx, 2*time.Millisecond)
		if err != nil || head.Floor != all[1].ID || len(head.Above) != 0 {
			t.Errorf("head with everything settled = %+v, %v; want floor %d", head, err, all[1].ID)
		}
		if n, err := s.PurgeChanges(ctx, time.Hour, 100); err != nil || n != 0 {
			t.Errorf("purge within the retention: %d, %v; want nothing", n, err)
		}
		n, err := s.PurgeChanges(ctx, 2*time.Millisecond, 100)
		if err != nil || n != 2 {
			t.Fatalf("purge past the retention: %d, %v; want 2", n, err)
		}
		if through, err := s.ChangesPurgedThrough(ctx); err != nil || through != all[1].ID {
			t.Errorf("purged through %d, %v; want %d", through, err, all[1].ID)
		}
		if head, err = s.ChangeHead(ctx, time.Hour); err != nil || head.Floor != all[1].ID {
			t.Errorf("head of the emptied feed = %+v, %v; want floor %d", head, err, all[1].ID)
		}
	})
}

// waitSettled polls until every row is older than settle by the database's
// clock (SQLite's keeps milliseconds).
func waitSettled(ctx context.Context, t *testing.T, s *repository.Store, settle time.Duration) {
	t.Helper()
	for {
		cs := readAll(t, s, repository.ChangeQuery{Settle: settle})
		done := true
		for _, c := range cs {
			done = done && c.Settled
		}
		if done {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("rows never settled: %+v", cs)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// The feed's marks are its rows briefly: their ids and whether they
// settled, in id order, under the same filters and limit as the rows.
func TestChangeFeedReadsMarks(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		ctx := ctxT(t)
		c, j := create(t, s, "web")
		create(t, s, "other")
		if _, err := s.RecordProgress(ctx, j.ID, repository.Progress{Step: "power_on", StepsDone: 1, StepsTotal: 3}); err != nil {
			t.Fatal(err)
		}
		all := readAll(t, s, repository.ChangeQuery{})
		if len(all) != 3 {
			t.Fatalf("feed: %d rows; want 3", len(all))
		}
		marks := func(q repository.ChangeQuery) []repository.Change {
			t.Helper()
			if q.Limit == 0 {
				q.Limit = 100
			}
			cs, err := s.ReadChangeMarks(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			for i, ch := range cs {
				if !ch.Brief || ch.ClusterID != "" || ch.Kind != "" || ch.Event != nil || !ch.Time.IsZero() {
					t.Errorf("mark %d carries more than its id: %+v", i, ch)
				}
			}
			return cs
		}
		ids := func(cs []repository.Change) (out []int64) {
			for _, ch := range cs {
				out = append(out, ch.ID)
			}
			return out
		}
		got := marks(repository.ChangeQuery{Settle: time.Hour})
		if !slices.Equal(ids(got), ids(all)) {
			t.Errorf("marks %v; want %v", ids(got), ids(all))
		}
		for i, ch := range got {
			if ch.Settled {
				t.Errorf("mark %d settled within an hour's window", i)
			}
		}
		if got := marks(repository.ChangeQuery{ClusterID: c.ID}); !slices.Equal(ids(got), []int64{all[0].ID, all[2].ID}) {
			t.Errorf("one cluster's marks %v; want %d, %d", ids(got), all[0].ID, all[2].ID)
		}
		if got := marks(repository.ChangeQuery{Account: "nobody"}); len(got) != 0 {
			t.Errorf("another account's marks: %v; want none", ids(got))
		}
		if got := marks(repository.ChangeQuery{After: all[0].ID, Limit: 1}); !slices.Equal(ids(got), []int64{all[1].ID}) {
			t.Errorf("one mark after the first row: %v; want %d", ids(got), all[1].ID)
		}
		waitSettled(ctx, t, s, 2*time.Millisecond)
		for i, ch := range marks(repository.ChangeQuery{Settle: 2 * time.Millisecond}) {
			if !ch.Settled {
				t.Errorf("mark %d not settled past the window", i)
			}
		}
	})
}
