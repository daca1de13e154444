package server

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// probeRun runs a healthProbe with ping and lease until the test ends, and
// returns the statuses it sets, in order, as they come.
func probeRun(t *testing.T, interval, timeout time.Duration, ping func(context.Context) error, lease func() error) <-chan healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	set := make(chan healthpb.HealthCheckResponse_ServingStatus, 100)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		healthProbe{interval: interval, timeout: timeout, ping: ping, lease: lease, log: slog.New(slog.DiscardHandler),
			set: func(st healthpb.HealthCheckResponse_ServingStatus) { set <- st }}.run(ctx)
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
	return set
}

// pings counts the probe's pings and lets the test wait for the nth.
type pings struct {
	mu   sync.Mutex
	n    int
	seen chan int
}

func newPings() *pings { return &pings{seen: make(chan int, 1000)} }

func (p *pings) next() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n++
	p.seen <- p.n
	return p.n
}

func (p *pings) waitFor(t *testing.T, n int) {
	t.Helper()
	deadline := time.After(time.Minute)
	for {
		select {
		case got := <-p.seen:
			if got >= n {
				return
			}
		case <-deadline:
			t.Fatalf("ping %d not sent within a minute", n)
		}
	}
}

// A database that answers every ping, but slower than the health interval,
// is up: health stays SERVING. (With the ping bounded by the interval, as it
// once was, every slow ping turned a loaded server NOT_SERVING.)
func TestHealth_SlowPingIsServing(t *testing.T) {
	const interval = time.Millisecond
	p := newPings()
	set := probeRun(t, interval, time.Hour, func(ctx context.Context) error {
		p.next()
		select { // the database takes 50 intervals to answer
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * interval):
			return nil
		}
	}, func() error { return nil })
	p.waitFor(t, 4) // three slow pings answered
	select {
	case st := <-set:
		t.Fatalf("health set to %v while every ping answered", st)
	default:
	}
}

// A ping that fails, one the database does not answer within the timeout, or
// a lost lease, turns health NOT_SERVING at once; it turns SERVING again when
// pings answer and the lease is held.
func TestHealth_NotServingOnFailure(t *testing.T) {
	errDown := errors.New("database down")
	for _, tc := range []struct {
		name  string
		ping  func(context.Context) error
		lease func() error
	}{
		{"ping fails", func(context.Context) error { return errDown }, func() error { return nil }},
		{"ping unanswered", func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }, func() error { return nil }},
		{"lease lost", func(context.Context) error { return nil }, func() error { return errDown }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			failing := true
			healthy := func() bool { mu.Lock(); defer mu.Unlock(); return !failing }
			set := probeRun(t, time.Millisecond, 10*time.Millisecond,
				func(ctx context.Context) error {
					if healthy() {
						return nil
					}
					return tc.ping(ctx)
				},
				func() error {
					if healthy() {
						return nil
					}
					return tc.lease()
				})
			want := func(want healthpb.HealthCheckResponse_ServingStatus) {
				t.Helper()
				select {
				case st := <-set:
					if st != want {
						t.Fatalf("health set to %v; want %v", st, want)
					}
				case <-time.After(time.Minute):
					t.Fatalf("health not set to %v within a minute", want)
				}
			}
			want(healthpb.HealthCheckResponse_NOT_SERVING)
			mu.Lock()
			failing = false
			mu.Unlock()
			want(healthpb.HealthCheckResponse_SERVING)
		})
	}
}
