package client

import (
	"context"
	"fmt"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
)

// ProgressFunc receives an operation's metadata: once when Wait starts, then
// each time its step or its progress changes, and once done.
type ProgressFunc func(md *clv1.OperationMetadata)

// WaitOption changes how Wait follows an operation.
type WaitOption func(*waitOptions)

type waitOptions struct{ every time.Duration }

// PollEvery sets how long one WaitOperation call may wait before Wait
// reports progress again (default 500ms). A done operation returns at once
// whatever it is; shorter only means finer progress.
func PollEvery(d time.Duration) WaitOption {
	return func(o *waitOptions) {
		if d > 0 {
			o.every = d
		}
	}
}

// Wait follows op (as returned by a mutation, or just its name in op.Name)
// until it is done, calling progress (which may be nil) as it moves, and
// returns the done operation. An operation that failed or was cancelled
// returns the operation and an *OperationError, whose status carries the
// operation's ErrorInfo (see Reason). ctx bounds the whole wait.
func (c *Client) Wait(ctx context.Context, op *longrunningpb.Operation, progress ProgressFunc, opts ...WaitOption) (*longrunningpb.Operation, error) {
	o := waitOptions{every: 500 * time.Millisecond}
	for _, opt := range opts {
		opt(&o)
	}
	var last *clv1.OperationMetadata
	report := func(op *longrunningpb.Operation) {
		md, err := MetadataOf(op)
		if err != nil || progress == nil || (last != nil && sameProgress(last, md) && !op.GetDone()) {
			return
		}
		last = md
		progress(md)
	}
	report(op)
	for !op.GetDone() {
		next, err := c.Operations.WaitOperation(ctx, &longrunningpb.WaitOperationRequest{Name: op.GetName(), Timeout: durationpb.New(o.every)})
		if err != nil {
			return op, fmt.Errorf("wait for %s: %w", op.GetName(), err)
		}
		op = next
		report(op)
	}
	if st := op.GetError(); st != nil {
		return op, &OperationError{Name: op.GetName(), Status: status.FromProto(st)}
	}
	return op, nil
}

// sameProgress reports whether two metadata show the same step and progress.
func sameProgress(a, b *clv1.OperationMetadata) bool {
	return a.GetStep() == b.GetStep() && a.GetStepsDone() == b.GetStepsDone() &&
		a.GetStepsTotal() == b.GetStepsTotal() && a.GetRequestedCancellation() == b.GetRequestedCancellation()
}

// OperationError is how an operation ended when it did not succeed: its
// google.rpc.Status. It satisfies status.FromError, so Reason, ErrorInfo and
// Code read it like an RPC error.
type OperationError struct {
	// Name is the operation, operations/{id}.
	Name   string
	Status *status.Status
}

// Error names the operation, its code and message.
func (e *OperationError) Error() string {
	return fmt.Sprintf("operation %s ended with %s: %s", e.Name, e.Status.Code(), e.Status.Message())
}

// GRPCStatus lets status.FromError (and this package's helpers) see the
// operation's status.
func (e *OperationError) GRPCStatus() *status.Status { return e.Status }

// MetadataOf unpacks an operation's OperationMetadata.
func MetadataOf(op *longrunningpb.Operation) (*clv1.OperationMetadata, error) {
	md := &clv1.OperationMetadata{}
	if err := unpack(op, op.GetMetadata(), md); err != nil {
		return nil, fmt.Errorf("metadata: %w", err)
	}
	return md, nil
}

// ClusterOf unpacks the Cluster a successful operation returned (every
// mutation but DeleteCluster, whose response is empty).
func ClusterOf(op *longrunningpb.Operation) (*clv1.Cluster, error) {
	if !op.GetDone() {
		return nil, fmt.Errorf("operation %s is not done", op.GetName())
	}
	if st := op.GetError(); st != nil {
		return nil, &OperationError{Name: op.GetName(), Status: status.FromProto(st)}
	}
	c := &clv1.Cluster{}
	if err := unpack(op, op.GetResponse(), c); err != nil {
		return nil, fmt.Errorf("response: %w", err)
	}
	return c, nil
}

func unpack(op *longrunningpb.Operation, a interface {
	UnmarshalTo(proto.Message) error
	GetTypeUrl() string
}, into proto.Message) error {
	if a.GetTypeUrl() == "" {
		return fmt.Errorf("operation %s carries none", op.GetName())
	}
	if err := a.UnmarshalTo(into); err != nil {
		return fmt.Errorf("operation %s: %w", op.GetName(), err)
	}
	return nil
}
