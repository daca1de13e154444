package infratest

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/repository"
)

// RepositoryHolder makes jobs hold clusters through clusterd's repository,
// exactly as the service and the scanner do (a create claim, a recovery's
// claim, an adoption, a job's end), so a driver that fences its calls on
// the repository is tested against real holders, not a mock. It is the
// only part of the suite that knows the repository; a driver whose harness
// keeps its machines elsewhere (libvirt) still uses it for fencing.
type RepositoryHolder struct {
	store *repository.Store
}

var _ Holder = (*RepositoryHolder)(nil)

// NewHolder returns a Holder writing clusters and jobs to store, the store
// the driver under test checks its fencing against.
func NewHolder(store *repository.Store) *RepositoryHolder {
	return &RepositoryHolder{store: store}
}

// deadline is far enough that no job of a test runs out of time.
const deadline = 24 * time.Hour

// Hold creates cluster clusterID held by a new create job or, when the
// cluster exists, claims it for a new job in place (as recovery takes an
// orphan over: the state stays, any previous holder loses it).
func (h *RepositoryHolder) Hold(ctx context.Context, clusterID string) (infra.Call, error) {
	nj := repository.NewJob{Kind: "infratest", ServerID: "infratest-" + uuid.NewString(), Deadline: time.Now().Add(deadline)}
	c, err := h.store.GetCluster(ctx, clusterID)
	var j repository.Job
	switch {
	case err == nil:
		_, j, err = h.store.Claim(ctx, repository.Transition{ClusterID: c.ID, Expect: c.Expect(), History: repository.RecoveryStarted}, nj)
	default:
		_, j, err = h.store.CreateCluster(ctx, repository.NewCluster{
			ID: clusterID, Account: "infratest", DisplayName: "infratest-" + clusterID,
			Spec: repository.Spec{KubernetesVersion: "1.30.2", ControlNodeCount: 1, WorkerNodeCount: 1, ServiceOffering: "small"},
		}, nj)
	}
	if err != nil {
		return infra.Call{}, fmt.Errorf("hold cluster %s: %w", clusterID, err)
	}
	return infra.Call{ClusterID: clusterID, Operation: j.ID, Attempt: j.Attempt}, nil
}

// Adopt moves call's job to a new server, as a peer adopting it from a dead
// server does: the job keeps its id and holds the cluster on, at the next
// attempt, which it returns in the call.
func (h *RepositoryHolder) Adopt(ctx context.Context, call infra.Call) (infra.Call, error) {
	j, err := h.store.GetJob(ctx, call.Operation)
	if err != nil {
		return infra.Call{}, fmt.Errorf("adopt job %s: %w", call.Operation, err)
	}
	srv, err := h.store.RegisterServer(ctx, "infratest-"+uuid.NewString())
	if err != nil {
		return infra.Call{}, fmt.Errorf("adopt job %s: %w", call.Operation, err)
	}
	// A cutoff in the future makes every owner dead, the previous adopter
	// included.
	j, err = h.store.AdoptJob(ctx, repository.Adoption{Job: j, Server: srv, Cutoff: time.Now().Add(deadline), Message: "infratest"})
	if err != nil {
		return infra.Call{}, fmt.Errorf("adopt job %s: %w", call.Operation, err)
	}
	call.Attempt = j.Attempt
	return call, nil
}

// Release ends call's job successfully and lets its cluster go: no job
// holds the cluster afterwards.
func (h *RepositoryHolder) Release(ctx context.Context, call infra.Call) error {
	c, err := h.store.GetCluster(ctx, call.ClusterID)
	if err != nil {
		return fmt.Errorf("release cluster %s: %w", call.ClusterID, err)
	}
	_, err = h.store.FinishJob(ctx, repository.Finish{JobID: call.Operation, Status: repository.JobSucceeded,
		Release: &repository.Transition{ClusterID: c.ID, Expect: c.Expect()}})
	if err != nil {
		return fmt.Errorf("release cluster %s: %w", call.ClusterID, err)
	}
	return nil
}

// Fail marks call's job FAILED without letting its cluster go, as recovery
// does first when it finds the job's server dead.
func (h *RepositoryHolder) Fail(ctx context.Context, call infra.Call) error {
	if _, err := h.store.FinishJob(ctx, repository.Finish{JobID: call.Operation, Status: repository.JobFailed, Error: "infratest: the job's server died"}); err != nil {
		return fmt.Errorf("fail job %s: %w", call.Operation, err)
	}
	return nil
}
