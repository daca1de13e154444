package service

import (
	"context"
	"errors"
	"fmt"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"github.com/google/uuid"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/runner"
)

// workFunc is an operation's steps. It returns the changes to write with the
// cluster's final transition (new spec, endpoint).
type workFunc func(ctx context.Context, o *op) (repository.Changes, error)

// op is one running operation: the job, the cluster it holds, and the
// helpers its steps share.
type op struct {
	s   *Clusters
	job repository.Job
	p   *runner.Progress
	// cluster is the cluster as this operation last wrote it (its claim, or
	// a move since). While the operation holds the cluster nobody else
	// writes it, so this is the row: the steps read it here, and the end's
	// compare-and-set expects it (and misses if the cluster was taken).
	cluster repository.Cluster
	// endEvent and failEvent are how the operation ends if it succeeds
	// (OPERATION_SUCCEEDED) or fails (OPERATION_FAILED, except a create
	// that fails before its cluster is up: CREATE_FAILED). Recovery ends an
	// orphaned operation with its orphan event either way.
	endEvent, failEvent lifecycle.Event
	// response, when set, is the operation's response instead of the cluster.
	response proto.Message
	// endMessage, when set, is the history message of a successful end.
	endMessage string
	// ending is set while a failed operation repairs on its way out: its
	// steps are no longer recorded (the job may have been cancelled).
	ending bool
	// total is the number of steps the operation expects so far; it grows as
	// each phase learns how much work it has.
	total int32
	// ca is the cluster's CA as its joins hand it to nodes (nodeCredentials),
	// read once.
	ca *infra.NodeCredentials
	// repairKind is the kind of operation whose leftovers a failure repairs
	// (repair): the job's own kind, or, for the recovery of an orphan, the
	// orphan's (repairKind).
	repairKind string
}

// expect adds n steps to what the operation reports it will take.
func (o *op) expect(n int32) {
	o.total += n
	if o.p != nil {
		o.p.SetTotal(o.total)
	}
}

// errNotHeld: the cluster is no longer held by this operation (recovery
// ended it, another operation took the cluster); the work must stop and
// must not move the cluster (SPEC §3.5).
var errNotHeld = errors.New("operation no longer holds the cluster")

// launch hands a claimed job to the runner. If the runner refuses (the
// server is shutting down), the job is handed off for a live server to adopt
// (ClustersConfig.HandOff) or, failing that, ended at once with the cluster
// following the failure transition, so no claim is left without a job
// running it.
func (s *Clusters) launch(ctx context.Context, c repository.Cluster, job repository.Job, work workFunc) (*longrunningpb.Operation, error) {
	o, task := s.task(c, job, work)
	if err := s.runner.Start(task); err != nil {
		if s.handOff {
			if op, herr := s.handOffUnstarted(ctx, job); herr == nil {
				return op, nil
			}
		}
		s.log.Warn("could not start job; failing it", "job", job.ID, "error", err)
		t, _, _ := o.release(ctx, o.failEvent, repository.Changes{}, "server shutting down", false)
		// It started no step, whatever step its claim named.
		if _, ferr := s.store.FinishJob(context.WithoutCancel(ctx), repository.Finish{JobID: job.ID, Status: repository.JobFailed,
			Error: EncodeJobError(runner.ErrShutdown), Release: t, Progress: &repository.Progress{}}); ferr != nil && !errors.Is(ferr, repository.ErrNotHeld) {
			s.log.Error("could not fail a job that did not start", "job", job.ID, "error", ferr)
		}
		return nil, fmt.Errorf("start %s: %w", job.Kind, errShuttingDown)
	}
	return toOperation(job)
}

// errShuttingDown maps to UNAVAILABLE: the client may retry on another server.
var errShuttingDown = errors.New("server shutting down")

// task is the runner's task of a job that holds cluster c (as its claim or
// its adoption wrote it): its work, then the success release; or, on
// failure, the repair of what it left and the failure release.
func (s *Clusters) task(c repository.Cluster, job repository.Job, work workFunc) (*op, runner.Task) {
	o := &op{s: s, job: job, cluster: c, endEvent: lifecycle.OperationSucceeded, failEvent: lifecycle.OperationFailed, repairKind: job.Kind}
	return o, runner.Task{
		Job: job,
		Run: func(ctx context.Context, p *runner.Progress) (runner.Outcome, error) {
			o.p = p
			changes, err := work(ctx, o)
			if err != nil {
				return runner.Outcome{}, err
			}
			return o.succeed(ctx, changes)
		},
		Release: func(ctx context.Context, cause error) (*repository.Transition, error) {
			changes, err := o.repairAfterFailure(ctx)
			if err != nil {
				return nil, err
			}
			t, _, err := o.release(ctx, o.failEvent, changes, "operation failed: "+boundCause(cause.Error()), false)
			return t, err
		},
	}
}

// resumed reports whether this attempt runs a job another attempt began (an
// adopted job, SPEC §5 step 4): its work then skips the steps whose effect
// the infrastructure already shows, and runs the interrupted one again.
func (o *op) resumed() bool { return o.job.Attempt > 1 }

// step records that the operation starts step name (progress, and the
// runner's cancellation, recovery and lease checks). A failed operation
// repairing on its way out records nothing (it may have been cancelled), but
// still stops without the lease: its peers may be recovering the cluster.
func (o *op) step(ctx context.Context, name string) error {
	if o.ending {
		if err := ctx.Err(); err != nil {
			return err
		}
		if o.s.lease != nil {
			if err := o.s.lease.Check(); err != nil {
				return fmt.Errorf("before repair step %s: %w: %w", name, runner.ErrLeaseLost, err)
			}
		}
		return nil
	}
	return o.p.Step(ctx, name)
}

// do runs one infrastructure step: it records the step (progress, and the
// runner's cancellation and recovery checks), then calls it. A call the
// infrastructure refuses because this job no longer holds the cluster
// (infra.ErrFenced) stops the operation; nothing was changed. Every
// infrastructure change an operation makes goes through do, so that its
// failure is a *StepError (STEP_FAILED naming the step), never a bare error
// that Status can only call internal (TestEveryInfrastructureChangeIsAStep).
func (o *op) do(ctx context.Context, name string, call func() error) error {
	if err := o.step(ctx, name); err != nil {
		return err
	}
	err := call()
	if err == nil {
		return nil
	}
	if errors.Is(err, infra.ErrFenced) {
		o.s.log.Warn("infrastructure refused a step: this operation no longer holds its cluster", "job", o.job.ID,
			"cluster", o.job.ResourceID, "step", name, "error", err)
	}
	return &StepError{Step: name, Err: err}
}

// call identifies the operation to the infrastructure: the job and its
// attempt are the fencing token (infra.Call.Operation, infra.Call.Attempt)
// that the infrastructure checks against the cluster's current operation
// and the job's attempt before changing anything.
func (o *op) call(machineID string) infra.Call {
	return infra.Call{ClusterID: o.job.ResourceID, Operation: o.job.ID, Attempt: o.job.Attempt, MachineID: machineID}
}

// held reads the cluster and checks this operation still holds it: the
// failure paths' question, since a failure may be the loss of the cluster.
func (o *op) held(ctx context.Context) (repository.Cluster, error) {
	c, err := o.s.store.GetCluster(ctx, o.job.ResourceID)
	if err != nil {
		return c, err
	}
	if c.CurrentOperation != o.job.ID {
		return c, fmt.Errorf("cluster %s is held by %q: %w", c.ID, c.CurrentOperation, errNotHeld)
	}
	o.cluster = c
	return c, nil
}

// move makes a transition while keeping the cluster held (e.g. the create
// job's CREATED -> STARTING), only while this operation, at this attempt,
// holds it: the compare-and-set expects the cluster as this operation last
// wrote it, and an adoption writes the cluster (its history entry bumps the
// version), so an earlier attempt's move misses from that instant.
func (o *op) move(ctx context.Context, ev lifecycle.Event, msg string) (repository.Cluster, error) {
	d, err := lifecycle.Decide(o.cluster.State, ev)
	if err != nil {
		return o.cluster, err
	}
	t := repository.Move(o.cluster, d)
	t.Operation, t.Message = o.job.ID, msg
	c, err := o.s.store.Transition(ctx, t)
	if err != nil {
		return o.cluster, err
	}
	o.cluster = c
	return c, nil
}

// release builds the transition that ends the operation: ev if the state
// machine has it from the state the cluster is in, otherwise none (the
// operations of SPEC §3.4 end without a state change). It returns nil when
// the operation no longer holds the cluster, which is then left alone.
// predicted is the cluster as the transition will write it. On success the
// cluster is the one this operation wrote last, unread; a failure reads it,
// since the failure may be that the cluster was taken.
//
// An end that would leave the cluster RUNNING first compares its machines
// with the record as the end writes it (SPEC §5.2), and one that would
// leave it STOPPED compares the nodes' versions: if they do not match,
// the state machine's Settle ends it ALERT instead, and the history entry
// says what does not match. This is the one check of every operation's end,
// whatever it started from (an operation from ALERT must not end RUNNING on
// the machine it left off), and whether it succeeded or failed (IMPORTING
// and REMOVING_NODES end RUNNING either way). Any other end that is not a
// success names the nodes' versions when they differ from the record (an
// upgrade that failed or was cancelled), so the ALERT it ends in says why.
func (o *op) release(ctx context.Context, ev lifecycle.Event, ch repository.Changes, msg string, success bool) (*repository.Transition, repository.Cluster, error) {
	c := o.cluster
	if !success {
		var err error
		c, err = o.held(ctx)
		if errors.Is(err, errNotHeld) {
			o.s.log.Info("operation ends without moving the cluster: no longer held", "job", o.job.ID, "cluster", c.ID, "holder", c.CurrentOperation)
			return nil, c, nil
		}
		if err != nil {
			return nil, c, err
		}
	}
	d := lifecycle.End(c.State, ev)
	if lifecycle.Versioned(d.To) || ev != lifecycle.OperationSucceeded {
		machines, err := o.s.infra.Machines(ctx, c.ID)
		if err != nil {
			return nil, c, fmt.Errorf("read the machines for the end of %s: %w", o.job.ID, err)
		}
		recorded := c.Spec.KubernetesVersion
		if ch.Spec != nil {
			recorded = ch.Spec.KubernetesVersion
		}
		if lifecycle.Versioned(d.To) {
			mismatch := infra.VersionsOff(machines, recorded)
			if lifecycle.Healthy(d.To) {
				mismatch = infra.Mismatch(machines, recorded)
			}
			d = lifecycle.Settle(d, mismatch == "")
			if mismatch != "" {
				msg += "; the machines do not match the record: " + mismatch
				o.s.log.Warn("operation ends ALERT: the machines do not match the record", "job", o.job.ID, "cluster", c.ID, "mismatch", mismatch)
			}
		} else if v := infra.VersionsOff(machines, recorded); v != "" {
			msg += "; " + v + ": run the upgrade again"
		}
	}
	t := repository.Move(c, d)
	t.Changes, t.Message = ch, msg
	return &t, t.Apply(c, o.s.now().UTC()), nil
}

// succeed ends a successful operation: the release transition and the
// operation's response (the cluster as it will be, or Empty for a delete).
func (o *op) succeed(ctx context.Context, ch repository.Changes) (runner.Outcome, error) {
	msg := o.endMessage
	if msg == "" {
		msg = o.job.Kind + " succeeded"
	}
	t, predicted, err := o.release(ctx, o.endEvent, ch, msg, true)
	if err != nil {
		return runner.Outcome{}, err
	}
	resp := o.response
	if resp == nil {
		resp = toCluster(predicted)
	}
	anyResp, err := anypb.New(resp)
	if err != nil {
		return runner.Outcome{}, fmt.Errorf("encode response: %w", err)
	}
	result, err := protojson.Marshal(anyResp)
	if err != nil {
		return runner.Outcome{}, fmt.Errorf("encode response: %w", err)
	}
	return runner.Outcome{Result: string(result), Release: t}, nil
}

// empty is the response of operations that return nothing (delete).
var empty = &emptypb.Empty{}

// machineID is the id of the machine an operation provisions for a slot:
// stable for the job and slot, so a rerun finds the machine it already made
// instead of making another (SPEC §6: every step is idempotent).
func machineID(jobID string, slot string) string {
	return uuid.NewSHA1(uuid.NameSpaceOID, []byte(jobID+"/"+slot)).String()
}
