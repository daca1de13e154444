package server

import (
	"context"
	"errors"

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
