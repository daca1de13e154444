package service

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/clusterd/clusterd/repository"
)

// JobStore is the part of the repository the Operations service needs.
type JobStore interface {
	GetJob(ctx context.Context, id string) (repository.Job, error)
	ListJobs(ctx context.Context, q repository.JobQuery) ([]repository.Job, error)
	RequestCancel(ctx context.Context, jobID string) (repository.Job, error)
}

// Operations implements google.longrunning.Operations over clusterd's jobs,
// so any LRO-aware client (Go, Java, grpcurl, REST) can follow an operation.
type Operations struct {
	longrunningpb.UnimplementedOperationsServer
	store JobStore
	// local cancels the step in flight of a job that runs in this process
	// (nil: none do).
	local JobCanceller
	// poll bounds how stale WaitOperation can be for jobs that end on another
	// server (local jobs wake waiters at once through Notify).
	poll    time.Duration
	maxWait time.Duration

	mu sync.Mutex
	// ends holds, by job id, what wakes the WaitOperation calls on that
	// job when it ends here (Notify): a job's end wakes its own waiters,
	// not every open wait.
	ends map[string]*jobEnd
	// draining is closed by Drain: WaitOperation answers at once.
	draining  chan struct{}
	drainOnce sync.Once
	// waiting counts the WaitOperation calls in progress.
	waiting atomic.Int64
}

// Waiting is how many WaitOperation calls are open now, for tests that must
// know a wait has begun and for metrics.
func (o *Operations) Waiting() int64 { return o.waiting.Load() }

// JobCanceller interrupts a job that runs in this process (runner.Runner).
type JobCanceller interface {
	// Cancel cancels job jobID's context, and reports whether it runs here.
	Cancel(jobID string) bool
}

// NewOperations returns the Operations service over store; local, when not
// nil, runs this server's jobs, so that a cancel of one of them ends its
// step in flight at once (a job of another server is cancelled by its own
// runner, which watches the jobs' rows).
func NewOperations(store JobStore, local JobCanceller) *Operations {
	return &Operations{store: store, local: local, poll: 200 * time.Millisecond, maxWait: 5 * time.Minute,
		ends: map[string]*jobEnd{}, draining: make(chan struct{})}
}

// Drain is part of a graceful stop: every WaitOperation, open or to come,
// answers at once with the operation as it stands, so that open calls do not
// hold the server up; the client waits again (on any server) if it wants.
func (o *Operations) Drain() {
	o.drainOnce.Do(func() { close(o.draining) })
}

// jobEnd is closed when its job ends here; waiters counts the calls that
// wait on it, so that the last to leave removes it.
type jobEnd struct {
	done    chan struct{}
	waiters int
}

// Notify wakes the WaitOperation calls on job j; the job runner calls it
// when a job ends.
func (o *Operations) Notify(j repository.Job) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if e, ok := o.ends[j.ID]; ok {
		close(e.done)
		delete(o.ends, j.ID)
	}
}

// awaitEnd returns what is closed when job id ends here, and the function
// a waiter calls when it stops waiting.
func (o *Operations) awaitEnd(id string) (<-chan struct{}, func()) {
	o.mu.Lock()
	defer o.mu.Unlock()
	e, ok := o.ends[id]
	if !ok {
		e = &jobEnd{done: make(chan struct{})}
		o.ends[id] = e
	}
	e.waiters++
	return e.done, func() {
		o.mu.Lock()
		defer o.mu.Unlock()
		if e.waiters--; e.waiters == 0 && o.ends[id] == e {
			delete(o.ends, id)
		}
	}
}

// GetOperation returns an operation's latest state.
func (o *Operations) GetOperation(ctx context.Context, req *longrunningpb.GetOperationRequest) (*longrunningpb.Operation, error) {
	j, err := o.visibleJob(ctx, req.GetName())
	if err != nil {
		return nil, err
	}
	return toOperation(j)
}

// visibleJob reads the job an operation name names, answering NOT_FOUND for
// an operation of an account the caller may not see.
func (o *Operations) visibleJob(ctx context.Context, name string) (repository.Job, error) {
	who, err := caller(ctx)
	if err != nil {
		return repository.Job{}, err
	}
	id, err := parseName("name", name, operationPrefix)
	if err != nil {
		return repository.Job{}, err
	}
	j, err := o.store.GetJob(ctx, id)
	if err != nil {
		return repository.Job{}, notFound(err, name)
	}
	if err := visible(who, j.Account, name); err != nil {
		return repository.Job{}, err
	}
	return j, nil
}

// ListOperations lists operations in creation order, filtered per AIP-160
// on cluster (`cluster = "clusters/{uuid}"`), done, verb, create_time and
// update_time.
func (o *Operations) ListOperations(ctx context.Context, req *longrunningpb.ListOperationsRequest) (*longrunningpb.ListOperationsResponse, error) {
	who, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	if n := req.GetName(); n != "" && n != "operations" {
		return nil, invalid("name", "must be empty or \"operations\", got %q", Clip(n))
	}
	size, err := pageSize("page_size", req.GetPageSize())
	if err != nil {
		return nil, err
	}
	filter, err := parseFilter("filter", req.GetFilter(), operationFilter)
	if err != nil {
		return nil, err
	}
	q := repository.JobQuery{Where: filter.Where, Account: who.Scope(), Limit: size + 1}
	query := "operations?" + req.GetFilter()
	if q.After, err = decodePageToken("page_token", req.GetPageToken(), query); err != nil {
		return nil, err
	}
	jobs, err := o.store.ListJobs(ctx, q)
	if err != nil {
		return nil, err
	}
	more := len(jobs) > size
	if more {
		jobs = jobs[:size]
	}
	resp := &longrunningpb.ListOperationsResponse{Operations: make([]*longrunningpb.Operation, len(jobs))}
	for i, j := range jobs {
		if resp.Operations[i], err = toOperation(j); err != nil {
			return nil, err
		}
	}
	if more {
		resp.NextPageToken = encodePageToken(jobs[len(jobs)-1].ID, query, true)
	}
	return resp, nil
}

// WaitOperation returns once the operation is done or the timeout (default
// and maximum 5 minutes, and never past the RPC's deadline) has passed,
// with the operation's latest state either way; and at once when the server
// is stopping (Drain).
func (o *Operations) WaitOperation(ctx context.Context, req *longrunningpb.WaitOperationRequest) (*longrunningpb.Operation, error) {
	// The wait on the job's end begins before the job is read, so that one
	// read serves both visibility and state: an end between that read and
	// the wait still wakes it.
	var ended <-chan struct{}
	if id, err := parseName("name", req.GetName(), operationPrefix); err == nil {
		var leave func()
		ended, leave = o.awaitEnd(id)
		defer leave()
	}
	j, err := o.visibleJob(ctx, req.GetName())
	if err != nil {
		return nil, err
	}
	wait := o.maxWait
	if d := req.GetTimeout(); d != nil {
		if err := d.CheckValid(); err != nil || d.AsDuration() < 0 {
			return nil, invalid("timeout", "must be a non-negative duration")
		}
		wait = min(d.AsDuration(), o.maxWait)
	}
	o.waiting.Add(1)
	defer o.waiting.Add(-1)
	timer := time.NewTimer(wait)
	defer timer.Stop()
	tick := time.NewTicker(o.poll)
	defer tick.Stop()
	for {
		if j.Status.Done() {
			return toOperation(j)
		}
		select {
		case <-ended:
			ended = nil // read once more; polls from then on
		case <-tick.C:
		case <-o.draining:
			return toOperation(j)
		case <-timer.C:
			return toOperation(j)
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				// The caller's deadline is the longest it wants to wait:
				// answer with the latest state rather than an error.
				return toOperation(j)
			}
			return nil, ctx.Err()
		}
		if j, err = o.store.GetJob(ctx, j.ID); err != nil {
			return nil, notFound(err, req.GetName())
		}
	}
}

// CancelOperation stops a running operation (SPEC §4): its step in flight,
// held or slow, ends at once, and the operation ends CANCELLED with the
// cluster following the failure transition. The job may run on another
// server, so the request is first a flag on the job's row, which every
// server agrees on: its runner reads it at every step and watches it between
// steps (runner.Config.WatchCancels). A job of this server is then
// interrupted directly. Cancelling an operation that is already done changes
// nothing.
func (o *Operations) CancelOperation(ctx context.Context, req *longrunningpb.CancelOperationRequest) (*emptypb.Empty, error) {
	j, err := o.visibleJob(ctx, req.GetName())
	if err != nil {
		return nil, err
	}
	if j, err = o.store.RequestCancel(ctx, j.ID); err != nil {
		return nil, notFound(err, req.GetName())
	}
	if o.local != nil && !j.Status.Done() {
		o.local.Cancel(j.ID)
	}
	return &emptypb.Empty{}, nil
}

// DeleteOperation is refused: operations are history, kept for the job
// retention period and then purged by the scanner. An operation the caller
// cannot see is NOT_FOUND, as everywhere.
func (o *Operations) DeleteOperation(ctx context.Context, req *longrunningpb.DeleteOperationRequest) (*emptypb.Empty, error) {
	if _, err := o.visibleJob(ctx, req.GetName()); err != nil {
		return nil, err
	}
	return nil, &NotImplementedError{Method: "DeleteOperation", Detail: "operations are kept as history and purged after the job retention period"}
}
