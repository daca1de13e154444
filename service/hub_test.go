package service

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/clusterd/clusterd/auth"
	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/infra/sim"
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
			c, _, err := s.CreateCluster(ctx, repository.NewCluster{Account: "acme", DisplayName: "web",
				Spec: repository.Spec{KubernetesVersion: "1.30.2", ControlNodeCount: 1, WorkerNodeCount: 1, ServiceOffering: "medium"}},
				repository.NewJob{Kind: "create", ServerID: "s1", Deadline: time.Now().Add(time.Hour)})
			if err != nil {
				t.Fatal(err)
			}
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
			_, j, err := s.CreateCluster(ctx, repository.NewCluster{Account: "acme", DisplayName: "web",
				Spec: repository.Spec{KubernetesVersion: "1.30.2", ControlNodeCount: 1, WorkerNodeCount: 1, ServiceOffering: "medium"}},
				repository.NewJob{Kind: "create", ServerID: "s1", Deadline: time.Now().Add(time.Hour)})
			if err != nil {
				t.Fatal(err)
			}
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
