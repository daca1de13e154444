package service

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/clusterd/clusterd/auth"
	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/infra/sim"
	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/repository/repotest"
)

// hubOn is a hub over a real store whose statements are counted, set up as
// Run sets it up (its head read), without Run's goroutine: the test polls.
func hubOn(t *testing.T, b repotest.Backend, buffer int) (*Hub, *repository.Store, *atomic.Int64) {
	t.Helper()
	var statements atomic.Int64
	s := repotest.Open(t, b, repository.WithCommandHook(func(_ context.Context, c repository.Command) {
		if c.IsStatement() {
			statements.Add(1)
		}
	}))
	h := NewHub(HubConfig{Store: s, Infra: sim.New(s, sim.Config{}), Buffer: buffer})
	head, err := s.ChangeHead(context.Background(), h.cfg.Settle)
	if err != nil {
		t.Fatal(err)
	}
	h.pos, h.base = watchToken{Floor: head.Floor}, head.Floor
	close(h.ready)
	return h, s, &statements
}

// createWeb creates a cluster "web" of acme, and its create job.
func createWeb(ctx context.Context, t *testing.T, s *repository.Store) (repository.Cluster, repository.Job) {
	t.Helper()
	c, j, err := s.CreateCluster(ctx, repository.NewCluster{Account: "acme", DisplayName: "web",
		Spec: repository.Spec{KubernetesVersion: "1.30.2", ControlNodeCount: 1, WorkerNodeCount: 1, ServiceOffering: "medium"}},
		repository.NewJob{Kind: "create", ServerID: "s1", Deadline: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	return c, j
}

func hubCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// The hub reads the feed once a poll whoever watches: one statement when
// nothing changed, and when something did, the feed, its clusters, its
// jobs and their machines, one statement each, for any number of
// watchers, every one of which gets the change.
func TestHubReadsOncePerPoll(t *testing.T) {
	for _, b := range repotest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := hubCtx(t)
			h, s, statements := hubOn(t, b, 0)
			var watchers []*watcher
			for range 5 {
				w, _, err := h.attach(ctx, "acme", watchToken{Floor: h.pos.Floor}, func(it watchItem, tok watchToken) (watchToken, error) {
					return tok, nil
				})
				if err != nil {
					t.Fatal(err)
				}
				watchers = append(watchers, w)
			}
			statements.Store(0)
			if err := h.poll(ctx); err != nil {
				t.Fatal(err)
			}
			if n := statements.Load(); n != 1 {
				t.Errorf("an idle poll with 5 watchers: %d statements; want 1", n)
			}
			c, _ := createWeb(ctx, t, s)
			statements.Store(0)
			if err := h.poll(ctx); err != nil {
				t.Fatal(err)
			}
			if n := statements.Load(); n != 4 {
				t.Errorf("a poll that found a change, 5 watchers: %d statements; want 4", n)
			}
			for i, w := range watchers {
				var changes []watchItem
				for len(w.items) > 0 {
					if it := <-w.items; it.change != nil { // markers aside
						changes = append(changes, it)
					}
				}
				if len(changes) != 1 || changes[0].change.ClusterID != c.ID || changes[0].cluster == nil || changes[0].view == nil {
					t.Errorf("watcher %d got %+v; want the create of %s with its cluster", i, changes, c.ID)
				}
			}
		})
	}
}

// feedSpy is a hub's store with its reads of the feed counted (rows read
// whole, rows read briefly), which can leave a row out of what it returns,
// as a row that commits after rows with larger ids.
type feedSpy struct {
	*repository.Store
	mu           sync.Mutex
	held         int64
	whole, brief int
}

func (f *feedSpy) ReadChanges(ctx context.Context, q repository.ChangeQuery) ([]repository.Change, error) {
	return f.seen(f.Store.ReadChanges(ctx, q))
}

func (f *feedSpy) ReadChangeMarks(ctx context.Context, q repository.ChangeQuery) ([]repository.Change, error) {
	return f.seen(f.Store.ReadChangeMarks(ctx, q))
}

// seen counts rows and leaves out the held one.
func (f *feedSpy) seen(rows []repository.Change, err error) ([]repository.Change, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := rows[:0]
	for _, c := range rows {
		if c.ID == f.held {
			continue
		}
		if c.Brief {
			f.brief++
		} else {
			f.whole++
		}
		out = append(out, c)
	}
	return out, err
}

// reads returns the rows read whole and briefly since it was last called.
func (f *feedSpy) reads() (whole, brief int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	whole, brief, f.whole, f.brief = f.whole, f.brief, 0, 0
	return whole, brief
}

// The hub reads a row of the feed whole once: at later polls, the rows it
// has read and that have not settled are read briefly, their marks only. A
// row that commits after rows with larger ids were read is found among
// them, read whole and handed out once; nothing is handed out twice.
func TestHubReadsEachRowWholeOnce(t *testing.T) {
	for _, b := range repotest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := hubCtx(t)
			h, s, _ := hubOn(t, b, 0)
			spy := &feedSpy{Store: s}
			// Nothing settles during the test, however slow the machine.
			h.cfg.Store, h.cfg.Settle = spy, time.Hour
			w, _, err := h.attach(ctx, "acme", watchToken{Floor: h.pos.Floor}, func(it watchItem, tok watchToken) (watchToken, error) {
				return tok, nil
			})
			if err != nil {
				t.Fatal(err)
			}
			_, j := createWeb(ctx, t, s)
			progress := func(done int32) {
				t.Helper()
				if _, err := s.RecordProgress(ctx, j.ID, repository.Progress{Step: "s", StepsDone: done, StepsTotal: 9}); err != nil {
					t.Fatal(err)
				}
			}
			progress(1)
			progress(2)
			rows, err := s.ReadChanges(ctx, repository.ChangeQuery{Limit: 10})
			if err != nil || len(rows) != 3 {
				t.Fatalf("feed: %+v, %v; want 3 rows", rows, err)
			}
			ids := func(rs ...repository.Change) []int64 {
				var out []int64
				for _, r := range rs {
					out = append(out, r.ID)
				}
				return out
			}
			poll := func(what string, wantWhole, wantBrief int, want []int64) {
				t.Helper()
				if err := h.poll(ctx); err != nil {
					t.Fatal(err)
				}
				if whole, brief := spy.reads(); whole != wantWhole || brief != wantBrief {
					t.Errorf("%s: %d rows read whole, %d briefly; want %d, %d", what, whole, brief, wantWhole, wantBrief)
				}
				var got []int64
				for len(w.items) > 0 {
					if it := <-w.items; it.change != nil {
						got = append(got, it.change.ID)
					}
				}
				if !slices.Equal(got, want) {
					t.Errorf("%s: handed out %v; want %v", what, got, want)
				}
			}
			spy.mu.Lock()
			spy.held = rows[1].ID
			spy.mu.Unlock()
			poll("first poll, the middle row not committed", 2, 0, ids(rows[0], rows[2]))
			poll("nothing new", 0, 2, nil)
			spy.mu.Lock()
			spy.held = 0
			spy.mu.Unlock()
			poll("the middle row committed", 2, 3, ids(rows[1]))
			poll("nothing new again", 0, 3, nil)
			progress(3)
			last, err := s.ReadChanges(ctx, repository.ChangeQuery{After: rows[2].ID, Limit: 10})
			if err != nil || len(last) != 1 {
				t.Fatalf("feed after %d: %+v, %v; want 1 row", rows[2].ID, last, err)
			}
			poll("a new row", 1, 4, ids(last...))
		})
	}
}

// A watcher that does not take what it is handed is ended once its buffer
// is full (WATCH_TOO_SLOW), never buffered without end; the others go on.
func TestHubEndsAWatcherBehindItsBuffer(t *testing.T) {
	for _, b := range repotest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := hubCtx(t)
			h, s, _ := hubOn(t, b, 2)
			none := func(it watchItem, tok watchToken) (watchToken, error) { return tok, nil }
			slow, _, err := h.attach(ctx, "acme", watchToken{Floor: h.pos.Floor}, none)
			if err != nil {
				t.Fatal(err)
			}
			_, j := createWeb(ctx, t, s)
			for i := int32(1); i <= 3; i++ {
				if _, err := s.RecordProgress(ctx, j.ID, repository.Progress{Step: "s", StepsDone: i, StepsTotal: 3}); err != nil {
					t.Fatal(err)
				}
			}
			if err := h.poll(ctx); err != nil {
				t.Fatal(err)
			}
			select {
			case <-slow.done:
				var tooSlow *WatchTooSlowError
				if !errors.As(slow.err, &tooSlow) {
					t.Errorf("ended with %v; want WatchTooSlowError", slow.err)
				}
			default:
				t.Fatalf("a watcher 4 changes behind with a buffer of 2 is still open")
			}
			// A watch that starts now replays what the hub kept, outside
			// its buffer, and stays open.
			var got int
			fresh, _, err := h.attach(ctx, "acme", watchToken{}, func(it watchItem, tok watchToken) (watchToken, error) {
				if it.change != nil && tok.fresh(it.change.ID) {
					got++
				}
				return tok.pass(derefChange(it), it.change != nil), nil
			})
			if err != nil || got != 4 {
				t.Errorf("a new watch replayed %d changes, %v; want 4", got, err)
			}
			select {
			case <-fresh.done:
				t.Errorf("the new watch was ended: %v", fresh.err)
			default:
			}
		})
	}
}

func derefChange(it watchItem) repository.Change {
	if it.change == nil {
		return repository.Change{}
	}
	return *it.change
}

// recordStream is the server side of a WatchClusters stream that records
// what is sent.
type recordStream struct {
	grpc.ServerStream
	ctx  context.Context
	sent chan *clv1.WatchClustersResponse
}

func (r *recordStream) Context() context.Context { return r.ctx }

func (r *recordStream) Send(m *clv1.WatchClustersResponse) error {
	select {
	case r.sent <- m:
		return nil
	case <-r.ctx.Done():
		return r.ctx.Err()
	}
}

// While only changes a watch does not keep go by, it is sent BOOKMARKs:
// its token moves on past them, so an idle watch's token does not outlive
// the feed's retention; and it sees nothing of those changes.
func TestWatchBookmarksPastChangesItDoesNotKeep(t *testing.T) {
	for _, b := range repotest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(hubCtx(t))
			s := repotest.Open(t, b)
			infra := sim.New(s, sim.Config{})
			h := NewHub(HubConfig{Store: s, Infra: infra, Poll: 10 * time.Millisecond, Settle: time.Millisecond, Bookmark: time.Nanosecond})
			ran := make(chan struct{})
			go func() { defer close(ran); h.Run(ctx) }()
			t.Cleanup(func() { cancel(); <-ran })
			clusters := NewClusters(ClustersConfig{Store: s, Infra: infra, Hub: h})
			stream := &recordStream{ctx: auth.NewContext(ctx, auth.Identity{Account: "acme", Role: auth.RoleUser, Subject: "test"}),
				sent: make(chan *clv1.WatchClustersResponse, 16)}
			done := make(chan error, 1)
			go func() { done <- clusters.WatchClusters(&clv1.WatchClustersRequest{}, stream) }()
			if m := <-stream.sent; m.GetKind() != clv1.WatchClustersResponse_SYNCED {
				t.Fatalf("first message %v; want SYNCED", m)
			}
			c, _, err := s.CreateCluster(ctx, repository.NewCluster{Account: "other", DisplayName: "web",
				Spec: repository.Spec{KubernetesVersion: "1.30.2", ControlNodeCount: 1, WorkerNodeCount: 1, ServiceOffering: "medium"}},
				repository.NewJob{Kind: "create", ServerID: "s1", Deadline: time.Now().Add(time.Hour)})
			if err != nil {
				t.Fatal(err)
			}
			rows, err := s.ReadChanges(ctx, repository.ChangeQuery{ClusterID: c.ID, Limit: 10})
			if err != nil || len(rows) != 1 {
				t.Fatalf("feed of the other account's cluster: %v, %v", rows, err)
			}
			for {
				select {
				case m := <-stream.sent:
					if m.GetKind() != clv1.WatchClustersResponse_BOOKMARK || m.GetCluster() != nil {
						t.Fatalf("acme's watch was sent %v; want only bookmarks", m)
					}
					tok, err := decodeWatchToken(m.GetResumeToken())
					if err != nil {
						t.Fatal(err)
					}
					if tok.Floor >= rows[0].ID {
						cancel()
						if err := <-done; !errors.Is(err, context.Canceled) {
							t.Errorf("watch ended %v; want its context's end", err)
						}
						return
					}
				case err := <-done:
					t.Fatalf("watch ended: %v", err)
				case <-ctx.Done():
					t.Fatal("no bookmark past the other account's change")
				}
			}
		})
	}
}

// While no watcher is attached, a poll reads only the feed: what a change
// shows (its cluster, nodes and job) is read when a watch attaches and
// replays it, with the cluster's state as that change left it, and once
// for every watch that attaches after.
func TestHubPresentsChangesOnlyToWatchers(t *testing.T) {
	for _, b := range repotest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := hubCtx(t)
			h, s, statements := hubOn(t, b, 0)
			from := h.pos
			c, j := createWeb(ctx, t, s)
			if _, err := s.Transition(ctx, repository.Transition{ClusterID: c.ID, Expect: c.Expect(), Event: lifecycle.StartRequested, Operation: j.ID}); err != nil {
				t.Fatal(err)
			}
			statements.Store(0)
			if err := h.poll(ctx); err != nil {
				t.Fatal(err)
			}
			if n := statements.Load(); n != 1 {
				t.Errorf("a poll that found changes, no watcher: %d statements; want 1 (the feed)", n)
			}
			replay := func() []watchItem {
				var got []watchItem
				w, _, err := h.attach(ctx, "acme", from, func(it watchItem, tok watchToken) (watchToken, error) {
					if it.change != nil {
						got = append(got, it)
					}
					return tok, nil
				})
				if err != nil {
					t.Fatal(err)
				}
				h.detach(w)
				return got
			}
			statements.Store(0)
			got := replay()
			if n := statements.Load(); n != 3 {
				t.Errorf("the first watch to attach: %d statements; want 3 (clusters, jobs, machines)", n)
			}
			want := []lifecycle.State{lifecycle.Created, lifecycle.Starting}
			if len(got) != len(want) {
				t.Fatalf("the watch replayed %d changes; want %d", len(got), len(want))
			}
			for i, it := range got {
				if it.staged || it.cluster == nil || it.view == nil || it.job == nil || it.job.ID != j.ID {
					t.Fatalf("change %d replayed as %+v; want it presented with its cluster, view and job %s", i, it, j.ID)
				}
				if it.cluster.State != want[i] {
					t.Errorf("change %d shows the cluster %s; want %s, as that change left it", i, it.cluster.State, want[i])
				}
			}
			statements.Store(0)
			if again := replay(); len(again) != len(want) {
				t.Errorf("the second watch replayed %d changes; want %d", len(again), len(want))
			}
			if n := statements.Load(); n != 0 {
				t.Errorf("the second watch to attach: %d statements; want 0 (the first presented the kept changes)", n)
			}
		})
	}
}

// A watcher that attaches while a poll holds staged items gets them
// presented: the publish of staged items is refused, changes nothing, and
// the poll presents them.
func TestHubPublishesStagedItemsOnlyWithoutWatchers(t *testing.T) {
	b := repotest.Backends(t)[0]
	ctx := hubCtx(t)
	h, s, _ := hubOn(t, b, 0)
	c, _ := createWeb(ctx, t, s)
	rows, err := s.ReadChanges(ctx, repository.ChangeQuery{After: h.pos.Floor, Settle: h.cfg.Settle, Limit: 10})
	if err != nil || len(rows) == 0 {
		t.Fatalf("read the feed: %d rows, %v", len(rows), err)
	}
	pos := h.pos
	for _, r := range rows {
		pos = pos.pass(r, true)
	}
	items, _ := stage(rows, nil)
	w, _, err := h.attach(ctx, "acme", h.pos, func(it watchItem, tok watchToken) (watchToken, error) { return tok, nil })
	if err != nil {
		t.Fatal(err)
	}
	before := h.pos
	if h.publish(items, pos, false) {
		t.Fatal("staged items published to an attached watcher")
	}
	if len(w.items) != 0 || len(h.window) != 0 || !slices.Equal(h.pos.Seen, before.Seen) || h.pos.Floor != before.Floor {
		t.Fatalf("a refused publish changed the hub: %d queued, %d kept, position %+v (was %+v)", len(w.items), len(h.window), h.pos, before)
	}
	if err := h.present(ctx, items); err != nil {
		t.Fatal(err)
	}
	if !h.publish(items, pos, true) {
		t.Fatal("presented items refused")
	}
	it := <-w.items
	if it.change == nil || it.change.ClusterID != c.ID || it.cluster == nil || it.view == nil || it.staged {
		t.Errorf("the watcher got %+v; want the create of %s presented", it, c.ID)
	}
}

// failingClusters is a hub's store whose next read of clusters fails.
type failingClusters struct {
	*repository.Store
	fail atomic.Bool
}

func (f *failingClusters) ClustersByID(ctx context.Context, ids []string) (map[string]repository.Cluster, error) {
	if f.fail.CompareAndSwap(true, false) {
		return nil, errors.New("the database went away")
	}
	return f.Store.ClustersByID(ctx, ids)
}

// A poll whose read of what its changes show fails reads the page again at
// the next poll and shows each change with the state it left the cluster
// in, as if the first attempt had not been made.
func TestHubPollThatFailsToPresentLeavesNoTrace(t *testing.T) {
	for _, b := range repotest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := hubCtx(t)
			h, s, _ := hubOn(t, b, 0)
			store := &failingClusters{Store: s}
			h.cfg.Store = store
			c, j := createWeb(ctx, t, s)
			if err := h.poll(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := s.RecordProgress(ctx, j.ID, repository.Progress{Step: "provision", StepsTotal: 3}); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Transition(ctx, repository.Transition{ClusterID: c.ID, Expect: c.Expect(), Event: lifecycle.StartRequested, Operation: j.ID}); err != nil {
				t.Fatal(err)
			}
			w, _, err := h.attach(ctx, "acme", h.pos, func(it watchItem, tok watchToken) (watchToken, error) { return tok, nil })
			if err != nil {
				t.Fatal(err)
			}
			store.fail.Store(true)
			if err := h.poll(ctx); err == nil {
				t.Fatal("a poll whose read of clusters failed returned no error")
			}
			if err := h.poll(ctx); err != nil {
				t.Fatal(err)
			}
			var got []lifecycle.State
			for len(w.items) > 0 {
				if it := <-w.items; it.change != nil {
					if it.cluster == nil {
						t.Fatalf("change %d (%s) came without its cluster", it.change.ID, it.change.Kind)
					}
					got = append(got, it.cluster.State)
				}
			}
			if want := []lifecycle.State{lifecycle.Created, lifecycle.Starting}; !slices.Equal(got, want) {
				t.Errorf("the progress and the start showed the cluster %v; want %v", got, want)
			}
		})
	}
}
