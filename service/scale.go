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

// scalePlan is what a ScaleCluster request asks for, stored as the job's
// parameters.
type scalePlan struct {
	Workers     *int32                  `json:"workers,omitempty"`
	Remove      []string                `json:"remove,omitempty"` // machine ids
	Offering    string                  `json:"offering,omitempty"`
	Autoscaling *repository.Autoscaling `json:"autoscaling,omitempty"`
	// Target is the worker count the plan leads to from the cluster's as
	// claimed (0 when the plan leaves it alone), shown in the operation's
	// metadata.
	Target int32 `json:"target,omitempty"`
}

// withTarget is the plan as stored on the job of a claim of c.
func (p scalePlan) withTarget(c repository.Cluster) any {
	if t := p.target(c.Spec.WorkerNodeCount); t != c.Spec.WorkerNodeCount {
		p.Target = t
	}
	return p
}

// target is the number of workers the plan leads to from current.
func (p scalePlan) target(current int32) int32 {
	switch {
	case p.Workers != nil:
		return *p.Workers
	case len(p.Remove) > 0:
		return current - int32(len(p.Remove))
	}
	return current
}

// hold is what the plan grows a cluster to while it runs: the larger worker
// count and the new offering (nil for a plan that grows nothing).
func (p scalePlan) hold(c repository.Cluster) *repository.Hold {
	current := c.Spec.WorkerNodeCount
	target := p.target(current)
	offering := ""
	if p.Offering != "" && p.Offering != c.Spec.ServiceOffering {
		offering = p.Offering
	}
	if target <= current && offering == "" {
		return nil
	}
	return &repository.Hold{WorkerNodeCount: max(current, target), ServiceOffering: offering}
}

// event is the state machine event of the plan: an autoscaler change, a size
// change up or down, or an offering change (SCALE_UP_REQUESTED, which is what
// lets a stopped cluster go to SCALING_STOPPED_CLUSTER).
func (p scalePlan) event(current int32) lifecycle.Event {
	switch t := p.target(current); {
	case p.Autoscaling != nil:
		return lifecycle.AutoscaleRequested
	case t < current:
		return lifecycle.ScaleDownRequested
	default:
		return lifecycle.ScaleUpRequested
	}
}

// ScaleCluster changes a cluster's size, offering or autoscaler, entering
// SCALING (or SCALING_STOPPED_CLUSTER) once, whatever the number of steps
// (SPEC §3.6).
func (s *Clusters) ScaleCluster(ctx context.Context, req *clv1.ScaleClusterRequest) (*longrunningpb.Operation, error) {
	var v violations
	plan := scalePlan{Workers: req.WorkerNodeCount, Offering: req.GetServiceOffering()}
	if req.WorkerNodeCount == nil && len(req.GetRemoveNodes()) == 0 && req.GetServiceOffering() == "" && req.GetAutoscaling() == nil {
		v.add("worker_node_count", "set at least one of worker_node_count, remove_nodes, service_offering and autoscaling")
	}
	switch n := req.GetWorkerNodeCount(); {
	case req.WorkerNodeCount == nil:
	case n < 1:
		v.add("worker_node_count", "must be at least 1, got %d", n)
	case n > s.catalog.MaxClusterSize:
		v.add("worker_node_count", "must be at most the maximum cluster size %d, got %d", s.catalog.MaxClusterSize, n)
	}
	if checkListSize(&v, "remove_nodes", len(req.GetRemoveNodes()), s.catalog.MaxClusterSize) {
		plan.Remove = machineIDs(&v, "remove_nodes", req.GetRemoveNodes())
	}
	if o := req.GetServiceOffering(); o != "" {
		// Known and big enough for a node of the cluster's version is the
		// cluster's to say (checkScale).
		if _, err := s.store.GetServiceOffering(ctx, o); errors.Is(err, repository.ErrNotFound) {
			v.add("service_offering", "unknown service offering %q (one of %s)", Clip(o), s.offeringNames(ctx, nil))
		} else if err != nil {
			return nil, err
		}
	}
	if a := req.GetAutoscaling(); a != nil {
		if req.WorkerNodeCount != nil || len(req.GetRemoveNodes()) > 0 || req.GetServiceOffering() != "" {
			v.add("autoscaling", "cannot be combined with other changes: the autoscaler owns the size while enabled")
		}
		s.catalog.checkAutoscaling(&v, "autoscaling", a, 0, 0)
		plan.Autoscaling = &repository.Autoscaling{Enabled: a.GetEnabled(), MinSize: a.GetMinSize(), MaxSize: a.GetMaxSize()}
	}
	if err := v.err(); err != nil {
		return nil, err
	}
	return s.run(ctx, request{
		msg: req, name: req.GetName(), requestID: req.GetRequestId(), etag: req.GetEtag(),
		verb: VerbScale, paramsFor: plan.withTarget,
		// A new offering is taken by the claim (refused if DISABLED or
		// gone by then); the offering the cluster has needs nothing.
		usesFor: func(c repository.Cluster) repository.Uses {
			if plan.Offering == "" || plan.Offering == c.Spec.ServiceOffering {
				return repository.Uses{}
			}
			return repository.Uses{Offering: plan.Offering}
		},
		eventFor: func(c repository.Cluster) lifecycle.Event { return plan.event(c.Spec.WorkerNodeCount) },
		check:    func(ctx context.Context, c repository.Cluster) error { return s.checkScale(ctx, c, plan) },
		hold:     plan.hold,
		work:     func(ctx context.Context, o *op) (repository.Changes, error) { return s.scaleWork(ctx, o, plan) },
	})
}

// checkScale validates a scale against the cluster as read.
func (s *Clusters) checkScale(ctx context.Context, c repository.Cluster, p scalePlan) error {
	var v violations
	current, target := c.Spec.WorkerNodeCount, p.target(c.Spec.WorkerNodeCount)
	if target != current && !lifecycle.IsLive(c.State) {
		return &InvalidTransitionError{Cluster: clusterName(c.ID), State: c.State, Event: p.event(current),
			Detail: "a stopped cluster cannot change size; start it first, or change only its service offering"}
	}
	if (p.Offering == "" || p.Offering == c.Spec.ServiceOffering) && target == current && p.Autoscaling == nil && len(p.Remove) == 0 {
		field := "service_offering"
		if p.Offering == "" {
			field = "worker_node_count"
		}
		v.add(field, "the cluster already has %d workers of offering %q: nothing to change", current, c.Spec.ServiceOffering)
	}
	if a := p.Autoscaling; a != nil && a.Enabled && sum(c.Spec.ControlNodeCount, a.MaxSize) > int64(s.catalog.MaxClusterSize) {
		v.add("autoscaling.max_size", "%d control + %d workers exceeds the maximum cluster size %d", c.Spec.ControlNodeCount, a.MaxSize, s.catalog.MaxClusterSize)
	}
	if target < 1 {
		v.add("worker_node_count", "a cluster keeps at least 1 worker; %d would remain", target)
	}
	if sum(c.Spec.ControlNodeCount, target) > int64(s.catalog.MaxClusterSize) {
		v.add("worker_node_count", "%d control + %d workers exceeds the maximum cluster size %d", c.Spec.ControlNodeCount, target, s.catalog.MaxClusterSize)
	}
	if len(p.Remove) > 0 {
		if target >= current {
			v.add("remove_nodes", "naming nodes to remove needs a smaller worker_node_count (now %d, asked %d)", current, target)
		} else if int(current-target) != len(p.Remove) {
			v.add("remove_nodes", "names %d nodes but scaling from %d to %d removes %d", len(p.Remove), current, target, current-target)
		}
		if err := s.checkNodesOf(ctx, &v, "remove_nodes", c.ID, p.Remove, infra.RoleWorker); err != nil {
			return err
		}
	}
	if p.Offering != "" && p.Offering != c.Spec.ServiceOffering {
		ver, err := s.store.GetKubernetesVersion(ctx, c.Spec.KubernetesVersion)
		var vp *repository.KubernetesVersion
		switch {
		case err == nil:
			vp = &ver
		case !errors.Is(err, repository.ErrNotFound):
			return err
		}
		before := len(v)
		next, err := s.checkOffering(ctx, &v, "service_offering", p.Offering, vp)
		if err != nil {
			return err
		}
		cur, err := s.offeringSize(ctx, c.Spec.ServiceOffering)
		if err != nil && !errors.Is(err, repository.ErrNotFound) {
			return err
		}
		// One violation per field: an offering too small for a node is not
		// also reported as smaller than the current one.
		if len(v) == before && lifecycle.IsLive(c.State) && next.Name != "" && (next.CPUs < cur.CPUs || next.MemoryMB < cur.MemoryMB) {
			v.add("service_offering", "a running cluster cannot move to a smaller offering (%q is smaller than %q); stop it first", Clip(p.Offering), c.Spec.ServiceOffering)
		}
	}
	return v.err()
}

// checkNodesOf checks that every id is a machine of the cluster with the
// given role (any role when role is empty).
func (s *Clusters) checkNodesOf(ctx context.Context, v *violations, field, clusterID string, ids []string, role infra.Role) error {
	for i, id := range ids {
		m, err := s.infra.Machine(ctx, id)
		if errors.Is(err, infra.ErrNotFound) || (err == nil && m.ClusterID != clusterID) {
			v.add(fmt.Sprintf("%s[%d]", field, i), "%s is not a node of %s", machinePrefix+id, clusterName(clusterID))
			continue
		}
		if err != nil {
			return err
		}
		if role != "" && m.Role != role {
			v.add(fmt.Sprintf("%s[%d]", field, i), "%s is a %s node; only %s nodes can be removed here", machinePrefix+id, m.Role, role)
		}
	}
	return nil
}

// machineIDs parses machines/{uuid} names, refusing duplicates.
func machineIDs(v *violations, field string, names []string) []string {
	var ids []string
	for i, n := range names {
		id, err := parseName(field, n, machinePrefix)
		if err != nil {
			v.add(fmt.Sprintf("%s[%d]", field, i), "%q is not a machines/{uuid} name", Clip(n))
			continue
		}
		if slices.Contains(ids, id) {
			v.add(fmt.Sprintf("%s[%d]", field, i), "%s is named twice", n)
			continue
		}
		ids = append(ids, id)
	}
	return ids
}

// scaleWork resizes machines for an offering change, adds or removes
// workers, and deploys or removes the autoscaler. The new spec is written
// with the final transition, so an interrupted scale leaves the old spec for
// recovery to converge to.
func (s *Clusters) scaleWork(ctx context.Context, o *op, p scalePlan) (repository.Changes, error) {
	c := o.cluster
	spec := c.Spec
	machines, err := s.infra.Machines(ctx, c.ID)
	if err != nil {
		return repository.Changes{}, err
	}
	if p.Offering != "" && p.Offering != spec.ServiceOffering {
		resize := machines
		if spec.ControlOffering != "" {
			// The control nodes have an offering of their own.
			resize = slices.DeleteFunc(slices.Clone(machines), func(m infra.Machine) bool { return m.Role == infra.RoleControl })
		}
		if o.resumed() {
			// An earlier attempt resized some already.
			resize = slices.DeleteFunc(slices.Clone(resize), func(m infra.Machine) bool { return m.Offering == p.Offering })
		}
		o.expect(int32(len(resize)))
		for _, m := range resize {
			if err := o.do(ctx, infra.StepResizeMachine, func() error { return s.infra.ResizeMachine(ctx, o.call(m.ID), p.Offering) }); err != nil {
				return repository.Changes{}, err
			}
		}
		spec.ServiceOffering = p.Offering
	}
	current, target := spec.WorkerNodeCount, p.target(spec.WorkerNodeCount)
	switch {
	case target > current:
		// The spec is written at the end, so an adopted scale adds the same
		// slots again: those an earlier attempt provisioned are found.
		if err := o.addWorkers(ctx, c, spec, machines, target-current); err != nil {
			return repository.Changes{}, err
		}
	case target < current:
		n := current - target
		if o.resumed() && len(p.Remove) == 0 {
			// An earlier attempt may have destroyed some workers already:
			// remove only what is still beyond the target.
			n = max(0, int32(countRole(machines, infra.RoleWorker))-target)
		}
		if err := o.removeWorkers(ctx, machines, p.Remove, n); err != nil {
			return repository.Changes{}, err
		}
	}
	spec.WorkerNodeCount = target
	if a := p.Autoscaling; a != nil {
		o.expect(1)
		if err := o.do(ctx, infra.StepDeployAutoscaler, func() error { return s.infra.DeployAutoscaler(ctx, o.call(""), a.Enabled, a.MinSize, a.MaxSize) }); err != nil {
			return repository.Changes{}, err
		}
		spec.Autoscaling = *a
	}
	return repository.Changes{Spec: &spec}, nil
}

// addWorkers provisions n workers and joins them. The workers' ids are
// stable per job and slot, so an adopted scale finds the ones an earlier
// attempt provisioned, and skips what they have done (provisioned, ISO
// attached, joined).
func (o *op) addWorkers(ctx context.Context, c repository.Cluster, spec repository.Spec, machines []infra.Machine, n int32) error {
	s := o.s
	// provision, network, attach, join, detach
	o.expect(4*n + 1)
	existing := map[string]infra.Machine{}
	for _, m := range machines {
		existing[m.ID] = m
	}
	iso := s.isoOf(ctx, spec.KubernetesVersion)
	var added []infra.Machine
	for i := range n {
		id := machineID(o.job.ID, fmt.Sprintf("worker-%d", i))
		if m, ok := existing[id]; ok && o.resumed() {
			o.expect(-1 - int32(boolInt(m.Joined || m.AttachedISO == iso)) - int32(boolInt(m.Joined)))
			added = append(added, m)
			continue
		}
		m, err := o.provision(ctx, id, infra.RoleWorker, spec)
		if err != nil {
			return err
		}
		added = append(added, m)
	}
	if err := o.configureNetwork(ctx, append(slices.Clone(machines), added...)); err != nil {
		return err
	}
	for _, m := range added {
		if o.resumed() && (m.Joined || m.AttachedISO == iso) {
			continue
		}
		if err := o.do(ctx, infra.StepAttachISO, func() error { return s.infra.AttachISO(ctx, o.call(m.ID), iso) }); err != nil {
			return err
		}
	}
	for _, m := range added {
		if o.resumed() && m.Joined {
			continue
		}
		if err := o.joinNode(ctx, m.ID, m.Role, spec.KubernetesVersion); err != nil {
			return err
		}
	}
	return o.detachISOs(ctx, c.ID)
}

// countRole counts the machines of a role.
func countRole(machines []infra.Machine, role infra.Role) int {
	n := 0
	for _, m := range machines {
		if m.Role == role {
			n++
		}
	}
	return n
}

// drain runs drain_node on m, unless this is an adopted operation and an
// earlier attempt drained it already (it is cordoned).
func (o *op) drain(ctx context.Context, m infra.Machine) error {
	if o.resumed() && m.Cordoned {
		o.expect(-1)
		return nil
	}
	return o.do(ctx, infra.StepDrainNode, func() error { return o.s.infra.DrainNode(ctx, o.call(m.ID)) })
}

// removeWorkers drains and destroys the named workers, or the n
// newest ones when none are named.
func (o *op) removeWorkers(ctx context.Context, machines []infra.Machine, named []string, n int32) error {
	s := o.s
	var victims, keep []infra.Machine
	if len(named) > 0 {
		for _, m := range machines {
			if slices.Contains(named, m.ID) {
				victims = append(victims, m)
			} else {
				keep = append(keep, m)
			}
		}
	} else {
		for i := len(machines) - 1; i >= 0; i-- {
			if m := machines[i]; m.Role == infra.RoleWorker && int32(len(victims)) < n {
				victims = append(victims, m)
			} else {
				keep = append(keep, m)
			}
		}
	}
	o.expect(int32(2*len(victims)) + 1)
	for _, m := range victims {
		// No delete_node: it would hand the machine back to the free pool,
		// where another cluster's AddNodes could take it before it is
		// destroyed. An adopted scale does not drain again a node an
		// earlier attempt drained.
		if err := o.drain(ctx, m); err != nil {
			return err
		}
		if err := o.do(ctx, infra.StepDestroyMachine, func() error { return s.infra.DestroyMachine(ctx, o.call(m.ID)) }); err != nil {
			return err
		}
	}
	return o.configureNetwork(ctx, keep)
}
