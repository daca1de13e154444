package service

import (
	"context"
	"slices"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
)

// StartCluster starts a STOPPED or ALERT cluster (STARTING until RUNNING, so
// nothing can take it partway, SPEC §3.8), or retries an ERROR cluster's
// start without changing its state (SPEC §3.4).
func (s *Clusters) StartCluster(ctx context.Context, req *clv1.StartClusterRequest) (*longrunningpb.Operation, error) {
	return s.run(ctx, request{
		msg: req, name: req.GetName(), requestID: req.GetRequestId(), etag: req.GetEtag(),
		verb: VerbStart, event: lifecycle.StartRequested, params: struct{}{},
		work: s.startWork,
	})
}

// startWork converges the cluster to running: it provisions what is missing
// (an ERROR cluster's interrupted create), powers on, rejoins, and finishes
// the cluster if it never was.
func (s *Clusters) startWork(ctx context.Context, o *op) (repository.Changes, error) {
	c := o.cluster
	endpoint, err := o.bringUp(ctx, c)
	if err != nil {
		return repository.Changes{}, err
	}
	if c.Endpoint == "" {
		if err := o.finishUp(ctx, c); err != nil {
			return repository.Changes{}, err
		}
	}
	return repository.Changes{Endpoint: &endpoint}, nil
}

// StopCluster powers a cluster's machines off, keeping its resources.
func (s *Clusters) StopCluster(ctx context.Context, req *clv1.StopClusterRequest) (*longrunningpb.Operation, error) {
	return s.run(ctx, request{
		msg: req, name: req.GetName(), requestID: req.GetRequestId(), etag: req.GetEtag(),
		verb: VerbStop, event: lifecycle.StopRequested, params: struct{}{},
		work: s.stopWork, first: stopFirst,
	})
}

// stopFirst is a stop's first step: it powers off each machine.
var stopFirst = onEachMachine(infra.StepPowerOff, 0)

func (s *Clusters) stopWork(ctx context.Context, o *op) (repository.Changes, error) {
	machines, err := s.infra.Machines(ctx, o.job.ResourceID)
	if err != nil {
		return repository.Changes{}, err
	}
	// Every machine, even one already off (the step is idempotent): what a
	// stop does is then the same whatever the machines' state, and a test
	// can hold the scanner's stop of an ALERT cluster like any other. An
	// adopted stop goes on from the first machine still running.
	if o.resumed() {
		machines = slices.DeleteFunc(machines, func(m infra.Machine) bool { return m.Power == infra.PowerStopped })
	}
	o.expect(int32(len(machines)))
	for _, m := range machines {
		if err := o.do(ctx, infra.StepPowerOff, func() error { return s.infra.PowerOff(ctx, o.call(m.ID)) }); err != nil {
			return repository.Changes{}, err
		}
	}
	return repository.Changes{}, nil
}

// DeleteCluster destroys a cluster's machines and rules. A failed destroy
// leaves the cluster DESTROYING (released), where another DeleteCluster,
// or the scanner, retries it in place (SPEC §3.4).
func (s *Clusters) DeleteCluster(ctx context.Context, req *clv1.DeleteClusterRequest) (*longrunningpb.Operation, error) {
	return s.run(ctx, request{
		msg: req, name: req.GetName(), requestID: req.GetRequestId(), etag: req.GetEtag(),
		verb: VerbDelete, event: lifecycle.DestroyRequested, params: struct{}{},
		work: s.deleteWork, first: deleteFirst,
	})
}

// deleteFirst is a delete's first step: it destroys each machine, then
// removes the network rules left.
var deleteFirst = onEachMachine(infra.StepDestroyMachine, 1)

func (s *Clusters) deleteWork(ctx context.Context, o *op) (repository.Changes, error) {
	o.response = empty
	machines, err := s.infra.Machines(ctx, o.job.ResourceID)
	if err != nil {
		return repository.Changes{}, err
	}
	o.expect(int32(len(machines)) + 1)
	for _, m := range machines {
		if err := o.do(ctx, infra.StepDestroyMachine, func() error { return s.infra.DestroyMachine(ctx, o.call(m.ID)) }); err != nil {
			return repository.Changes{}, err
		}
	}
	// Rules of destroyed machines go with them; this removes any stragglers
	// (an adopted delete whose rules are all gone skips it).
	if err := o.configureNetwork(ctx, nil); err != nil {
		return repository.Changes{}, err
	}
	return repository.Changes{}, nil
}
