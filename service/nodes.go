package service

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
)

// nodesPlan is an AddNodes or RemoveNodes job's parameters.
type nodesPlan struct {
	Machines []string `json:"machines"`
	// Target is the worker count an AddNodes job leads to from the
	// cluster's as claimed, shown in the operation's metadata. (A
	// RemoveNodes job leaves it 0: it may remove control nodes too.)
	Target int32 `json:"target,omitempty"`
}

// withAdded is the plan as stored on the job of an AddNodes claim of c.
func (p nodesPlan) withAdded(c repository.Cluster) any {
	p.Target = c.Spec.WorkerNodeCount + int32(len(p.Machines))
	return p
}

// parseNodesPlan reads a non-empty list of machines/{uuid} names, no longer
// than a cluster can be big.
func (s *Clusters) parseNodesPlan(field string, names []string) (nodesPlan, error) {
	var v violations
	if len(names) == 0 {
		v.add(field, "name at least one machines/{uuid}")
	}
	if !checkListSize(&v, field, len(names), s.catalog.MaxClusterSize) {
		return nodesPlan{}, v.err()
	}
	plan := nodesPlan{Machines: machineIDs(&v, field, names)}
	return plan, v.err()
}

// AddNodes adds free external machines to a cluster as workers. It claims
// IMPORTING before anything is attached to a candidate machine (SPEC §3.7),
// so a refused request leaves the machines untouched.
func (s *Clusters) AddNodes(ctx context.Context, req *clv1.AddNodesRequest) (*longrunningpb.Operation, error) {
	plan, err := s.parseNodesPlan("machines", req.GetMachines())
	if err != nil {
		return nil, err
	}
	return s.run(ctx, request{
		msg: req, name: req.GetName(), requestID: req.GetRequestId(),
		verb: VerbAddNodes, event: lifecycle.AddNodeRequested, paramsFor: plan.withAdded,
		check: func(ctx context.Context, c repository.Cluster) error { return s.checkAdd(ctx, c, plan) },
		hold: func(c repository.Cluster) *repository.Hold {
			return &repository.Hold{WorkerNodeCount: c.Spec.WorkerNodeCount + int32(len(plan.Machines))}
		},
		work: func(ctx context.Context, o *op) (repository.Changes, error) { return s.addWork(ctx, o, plan) },
	})
}

// checkAdd reads (never changes) the candidate machines: each must be a
// free, running EXTERNAL machine, and the cluster must stay within its size.
func (s *Clusters) checkAdd(ctx context.Context, c repository.Cluster, p nodesPlan) error {
	var v violations
	for i, id := range p.Machines {
		field := fmt.Sprintf("machines[%d]", i)
		m, err := s.infra.Machine(ctx, id)
		switch {
		case err != nil && !errors.Is(err, infra.ErrNotFound):
			return err
		case err == nil && m.ClusterID == c.ID:
			v.add(field, "%s is already a node of %s", machinePrefix+id, clusterName(c.ID))
		case err != nil || m.ClusterID != "" || m.Role != infra.RoleExternal:
			// One answer for a machine that does not exist and one that
			// another cluster (maybe another account's) has, so nobody
			// learns which machines other accounts use.
			v.add(field, "%s does not exist or is not a free external machine", machinePrefix+id)
		case m.Power != infra.PowerRunning:
			v.add(field, "%s is powered off", machinePrefix+id)
		}
	}
	if total := sum(c.Spec.ControlNodeCount, c.Spec.WorkerNodeCount) + int64(len(p.Machines)); total > int64(s.catalog.MaxClusterSize) {
		v.add("machines", "the cluster would have %d nodes, more than the maximum cluster size %d", total, s.catalog.MaxClusterSize)
	}
	return v.err()
}

// addWork adopts each machine (validate_node), converges the network rules,
// installs the cluster's Kubernetes on the new nodes (its version's ISO
// attached, as a scale's new workers get it) and joins them, then detaches
// the ISOs.
func (s *Clusters) addWork(ctx context.Context, o *op, p nodesPlan) (repository.Changes, error) {
	// validate, network, attach, join, detach
	o.expect(int32(4*len(p.Machines)) + 1)
	// An adopted add skips the machines an earlier attempt adopted
	// (validate_node), gave the ISO or joined already.
	mine := map[string]infra.Machine{}
	if o.resumed() {
		ms, err := s.infra.Machines(ctx, o.job.ResourceID)
		if err != nil {
			return repository.Changes{}, err
		}
		for _, m := range ms {
			mine[m.ID] = m
		}
	}
	c := o.cluster
	iso := s.isoOf(ctx, c.Spec.KubernetesVersion)
	for _, id := range p.Machines {
		if _, ok := mine[id]; ok {
			o.expect(-1)
			continue
		}
		if err := o.do(ctx, infra.StepValidateNode, func() error { return s.infra.ValidateNode(ctx, o.call(id)) }); err != nil {
			return repository.Changes{}, err
		}
	}
	machines, err := s.infra.Machines(ctx, c.ID)
	if err != nil {
		return repository.Changes{}, err
	}
	if err := o.configureNetwork(ctx, machines); err != nil {
		return repository.Changes{}, err
	}
	for _, id := range p.Machines {
		if m, ok := mine[id]; ok && (m.Joined || m.AttachedISO == iso) {
			o.expect(-1)
			continue
		}
		if err := o.do(ctx, infra.StepAttachISO, func() error { return s.infra.AttachISO(ctx, o.call(id), iso) }); err != nil {
			return repository.Changes{}, err
		}
	}
	for _, id := range p.Machines {
		if m, ok := mine[id]; ok && m.Joined {
			o.expect(-1)
			continue
		}
		if err := o.joinNode(ctx, id, infra.RoleWorker, c.Spec.KubernetesVersion); err != nil {
			return repository.Changes{}, err
		}
	}
	if err := o.detachISOs(ctx, c.ID); err != nil {
		return repository.Changes{}, err
	}
	spec := c.Spec
	spec.WorkerNodeCount += int32(len(p.Machines))
	return repository.Changes{Spec: &spec}, nil
}

// RemoveNodes drains and removes named nodes (which become free external
// machines) and revokes their network rules.
func (s *Clusters) RemoveNodes(ctx context.Context, req *clv1.RemoveNodesRequest) (*longrunningpb.Operation, error) {
	plan, err := s.parseNodesPlan("nodes", req.GetNodes())
	if err != nil {
		return nil, err
	}
	return s.run(ctx, request{
		msg: req, name: req.GetName(), requestID: req.GetRequestId(),
		verb: VerbRemoveNodes, event: lifecycle.RemoveNodeRequested, params: plan,
		check: func(ctx context.Context, c repository.Cluster) error { return s.checkRemove(ctx, c, plan) },
		work:  func(ctx context.Context, o *op) (repository.Changes, error) { return s.removeWork(ctx, o, plan) },
	})
}

// checkRemove: every node belongs to the cluster, and at least one control
// node and one worker remain.
func (s *Clusters) checkRemove(ctx context.Context, c repository.Cluster, p nodesPlan) error {
	var v violations
	if err := s.checkNodesOf(ctx, &v, "nodes", c.ID, p.Machines, ""); err != nil {
		return err
	}
	if err := v.err(); err != nil {
		return err
	}
	machines, err := s.infra.Machines(ctx, c.ID)
	if err != nil {
		return err
	}
	left := map[infra.Role]int{}
	for _, m := range machines {
		if !slices.Contains(p.Machines, m.ID) {
			left[m.Role]++
		}
	}
	if left[infra.RoleControl] == 0 {
		v.add("nodes", "would remove every control node; a cluster keeps at least one")
	}
	if left[infra.RoleWorker] == 0 {
		v.add("nodes", "would remove every worker; a cluster keeps at least one")
	}
	return v.err()
}

func (s *Clusters) removeWork(ctx context.Context, o *op, p nodesPlan) (repository.Changes, error) {
	c := o.cluster
	machines, err := s.infra.Machines(ctx, c.ID)
	if err != nil {
		return repository.Changes{}, err
	}
	// drain and delete per node still in the cluster (an adopted remove
	// finds those an earlier attempt removed gone), and the network.
	present := 0
	for _, m := range machines {
		if slices.Contains(p.Machines, m.ID) {
			present++
		}
	}
	o.expect(int32(2*present) + 1)
	spec := c.Spec
	var keep []infra.Machine
	for _, m := range machines {
		if !slices.Contains(p.Machines, m.ID) {
			keep = append(keep, m)
			continue
		}
		if err := o.drain(ctx, m); err != nil {
			return repository.Changes{}, err
		}
		if err := o.do(ctx, infra.StepDeleteNode, func() error { return s.infra.DeleteNode(ctx, o.call(m.ID)) }); err != nil {
			return repository.Changes{}, err
		}
		if m.Role == infra.RoleControl {
			spec.ControlNodeCount--
		} else {
			spec.WorkerNodeCount--
		}
	}
	if err := o.configureNetwork(ctx, keep); err != nil {
		return repository.Changes{}, err
	}
	if o.resumed() {
		// The nodes an earlier attempt removed are no longer the cluster's
		// (and their role is gone with them): count what is kept.
		spec.ControlNodeCount = int32(countRole(keep, infra.RoleControl))
		spec.WorkerNodeCount = int32(countRole(keep, infra.RoleWorker))
	}
	return repository.Changes{Spec: &spec}, nil
}
