package server

import (
	"context"

	"github.com/clusterd/clusterd/repository"
)

// holderGuard is the libvirt driver's fencing check: an empty fenced
// transaction of the store, which locks the cluster's row, then the job's,
// and refuses (repository.ErrFenced) a job that no longer holds the cluster.
type holderGuard struct{ store *repository.Store }

// CheckHolder says whether f's job, at its attempt, holds f's cluster.
func (g holderGuard) CheckHolder(ctx context.Context, f repository.Fence) error {
	return g.store.Fenced(ctx, f, func(*repository.Store) error { return nil })
}
