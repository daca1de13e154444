package server

import (
	"context"
	"errors"
	"time"

	"github.com/clusterd/clusterd/infra/libvirt"
	"github.com/clusterd/clusterd/repository"
)

// libvirtGuard is the libvirt driver's fencing check on the store:
// Store.CheckHolder where the store has it, else an empty fenced
// transaction of the store, which is the same check (the cluster's row
// locked, then the job's; repository.ErrFenced for a job that no longer
// holds the cluster).
func libvirtGuard(s *repository.Store) libvirt.Guard {
	if g, ok := any(s).(libvirt.Guard); ok {
		return g
	}
	if f, ok := any(s).(fencer); ok {
		return fencedGuard{f}
	}
	return noGuard{}
}

type fencer interface {
	Fenced(ctx context.Context, f repository.Fence, fn func(*repository.Store) error) error
}

type fencedGuard struct{ f fencer }

func (g fencedGuard) CheckHolder(ctx context.Context, f repository.Fence) error {
	return g.f.Fenced(ctx, f, func(*repository.Store) error { return nil })
}

// noGuard refuses every change: a store that cannot fence must not let
// the driver change anything.
type noGuard struct{}

func (noGuard) CheckHolder(context.Context, repository.Fence) error {
	return errors.New("the store cannot check the holder of a cluster")
}

// watchDomains feeds the libvirt driver's domain lifecycle events to the
// scanner (Scanner.Observe) until ctx ends, so that a domain stopped or
// started behind clusterd's back moves its cluster to ALERT, or back,
// within a scan pass rather than a reconcile interval. When the
// subscription ends with an error (libvirtd restarted: Watch connects the
// driver again on its next call) it subscribes again after a backoff,
// and asks the scanner for a sweep of every resting cluster, since the
// events of the gap are lost.
func (s *Server) watchDomains(ctx context.Context) {
	failures := 0
	for {
		began := time.Now()
		err := s.libvirt.Watch(ctx, s.scanner.Observe)
		if ctx.Err() != nil {
			return
		}
		if time.Since(began) >= watchBackoffMax {
			failures = 0
		}
		failures++
		wait := watchBackoff(failures)
		s.log.Warn("libvirt domain events lost; subscribing again", "error", err, "in", wait)
		s.scanner.Sweep()
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// watchBackoffMax bounds the wait between two subscriptions to libvirt's
// domain events; a subscription that lasted this long starts the backoff
// over.
const watchBackoffMax = 30 * time.Second

// watchBackoff is the wait before subscribing again after the n-th failure
// in a row (n >= 1): 500ms, doubling, at most watchBackoffMax.
func watchBackoff(n int) time.Duration {
	return min(watchBackoffMax, (500*time.Millisecond)<<min(n-1, 16))
}
