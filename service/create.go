package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
)

// CreateCluster inserts the CREATED cluster, its create job and the job as
// its holder in one transaction (SPEC §3.6), so a scale or stop of a cluster
// still being created is refused with OPERATION_IN_PROGRESS; the job's first
// step claims STARTING.
func (s *Clusters) CreateCluster(ctx context.Context, req *clv1.CreateClusterRequest) (*longrunningpb.Operation, error) {
	who, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	nc, requestID, err := s.validateCreate(ctx, req, who.Account)
	if err != nil {
		return nil, err
	}
	key := idempotency{account: nc.Account, requestID: requestID, hash: requestHash(req)}
	op, err := s.create(ctx, nc, key)
	if err != nil && key.requestID != "" {
		// A retry (same request_id) finds its first copy's cluster name or
		// request id taken (or this server draining): answer with the first
		// copy's operation (AIP-155). A first request costs no lookup.
		if op, found, rerr := s.replay(ctx, key, VerbCreate, ""); found || rerr != nil {
			return op, rerr
		}
	}
	if errors.Is(err, repository.ErrAlreadyExists) {
		return nil, &AlreadyExistsError{What: fmt.Sprintf("a cluster named %q in account %q", nc.DisplayName, nc.Account)}
	}
	return op, err
}

// create inserts the cluster held by its create job and starts the job.
func (s *Clusters) create(ctx context.Context, nc repository.NewCluster, key idempotency) (*longrunningpb.Operation, error) {
	if err := s.mayClaim(); err != nil {
		return nil, err
	}
	// The cluster's CA and admin certificate are made, and sealed for its
	// id, before the transaction that inserts it with them.
	if nc.ID == "" {
		nc.ID = repository.NewClusterID()
	}
	var err error
	if nc.Secrets, err = s.sealCredentials(nc.ID); err != nil {
		return nil, err
	}
	nc.Quota = s.quotaCheck()
	params, _ := json.Marshal(nc.Spec)
	nj := s.newJob(VerbCreate, key, string(params))
	release, err := s.runner.Reserve(nj.ID)
	if err != nil {
		return nil, fmt.Errorf("create: %w", err)
	}
	defer release()
	c, job, err := s.store.CreateCluster(ctx, nc, nj)
	if err != nil {
		return nil, err
	}
	s.log.InfoContext(ctx, "cluster created", "cluster", c.ID, "name", c.DisplayName, "job", job.ID)
	return s.launch(ctx, c, job, s.createWork)
}

// AlreadyExistsError refuses a create whose unique name is taken.
type AlreadyExistsError struct{ What string }

// Error names what exists.
func (e *AlreadyExistsError) Error() string { return e.What + " already exists" }

// createWork provisions a new cluster: claim STARTING, provision the
// machines, configure the network, attach the version's ISO, wait for the
// API and for every node to join, detach the ISO, fetch the kubeconfig and
// deploy the provider (and the autoscaler). A failure before the cluster is
// up ends in ERROR (CREATE_FAILED); after it, in ALERT.
func (s *Clusters) createWork(ctx context.Context, o *op) (repository.Changes, error) {
	o.failEvent = lifecycle.CreateFailed
	c, err := o.claimStarting(ctx)
	if err != nil {
		return repository.Changes{}, err
	}
	endpoint, err := o.bringUp(ctx, c)
	if err != nil {
		return repository.Changes{}, err
	}
	o.failEvent = lifecycle.OperationFailed
	if err := o.finishUp(ctx, c); err != nil {
		return repository.Changes{}, err
	}
	return repository.Changes{Endpoint: &endpoint}, nil
}

// claimStarting is a create's first step: CREATED -> STARTING, the cluster
// still held by the create. An adopted create whose earlier attempt made
// that move already (the state machine has no START_REQUESTED from the
// state the cluster is in now) goes on from the cluster as it is.
func (o *op) claimStarting(ctx context.Context) (repository.Cluster, error) {
	if o.resumed() {
		c, err := o.held(ctx)
		if err != nil {
			return c, err
		}
		if _, err := lifecycle.Next(c.State, lifecycle.StartRequested); err != nil {
			return c, nil
		}
	}
	o.expect(1)
	if err := o.step(ctx, "claim_starting"); err != nil {
		return repository.Cluster{}, err
	}
	return o.move(ctx, lifecycle.StartRequested, "create: provisioning")
}

// bringUp converges a cluster's machines to its spec and gets Kubernetes up
// on them: provision what is missing, power on what is off, network rules,
// ISO, API, join, detach. Every step is skipped when already done, so create
// and start share it and a rerun resumes.
func (o *op) bringUp(ctx context.Context, c repository.Cluster) (endpoint string, err error) {
	s := o.s
	machines, err := s.infra.Machines(ctx, c.ID)
	if err != nil {
		return "", err
	}
	have := map[infra.Role]int32{}
	var stopped, unjoined int32
	for _, m := range machines {
		have[m.Role]++
		stopped += int32(boolInt(m.Power == infra.PowerStopped))
		unjoined += int32(boolInt(!m.Joined))
	}
	want := []struct {
		role  infra.Role
		count int32
	}{{infra.RoleControl, c.Spec.ControlNodeCount}, {infra.RoleWorker, c.Spec.WorkerNodeCount}}
	missing := max(0, c.Spec.ControlNodeCount-have[infra.RoleControl]) + max(0, c.Spec.WorkerNodeCount-have[infra.RoleWorker])
	// provision, power on, network, attach, API, join, detach
	o.expect(missing + stopped + 1 + (unjoined + missing) + 1 + 2*(unjoined+missing))
	for _, w := range want {
		for i := have[w.role]; i < w.count; i++ {
			id := machineID(o.job.ID, fmt.Sprintf("%s-%d", w.role, i))
			m, err := o.provision(ctx, id, w.role, c.Spec)
			if err != nil {
				return "", err
			}
			machines = append(machines, m)
		}
	}
	for _, m := range machines {
		if m.Power == infra.PowerStopped {
			if err := o.do(ctx, infra.StepPowerOn, func() error { return s.infra.PowerOn(ctx, o.call(m.ID)) }); err != nil {
				return "", err
			}
		}
	}
	if err := o.configureNetwork(ctx, machines); err != nil {
		return "", err
	}
	iso := s.isoOf(ctx, c.Spec.KubernetesVersion)
	for _, m := range machines {
		if !m.Joined && m.AttachedISO != iso {
			if err := o.do(ctx, infra.StepAttachISO, func() error { return s.infra.AttachISO(ctx, o.call(m.ID), iso) }); err != nil {
				return "", err
			}
		}
	}
	if err := o.do(ctx, infra.StepWaitAPI, func() (err error) {
		endpoint, err = s.infra.WaitAPI(ctx, o.call(""))
		return err
	}); err != nil {
		return "", err
	}
	for _, m := range machines {
		if !m.Joined {
			if err := o.joinNode(ctx, m.ID, m.Role, c.Spec.KubernetesVersion); err != nil {
				return "", err
			}
		}
	}
	if err := o.detachISOs(ctx, c.ID); err != nil {
		return "", err
	}
	return endpoint, nil
}

// provision is the provision_machine step of machine id (create, start and
// scale share it): like every infrastructure change, it runs through o.do,
// so its failure is the operation's STEP_FAILED naming the step.
func (o *op) provision(ctx context.Context, id string, role infra.Role, spec repository.Spec) (m infra.Machine, err error) {
	err = o.do(ctx, infra.StepProvisionMachine, func() (err error) {
		offering := spec.ServiceOffering
		if role == infra.RoleControl {
			offering = spec.ControlOfferingOrDefault()
		}
		m, err = o.s.infra.ProvisionMachine(ctx, o.call(id), id, role, offering, spec.KubernetesVersion)
		return err
	})
	return m, err
}

// finishUp fetches the kubeconfig and deploys the provider and, if wanted,
// the autoscaler: the part of bringing a cluster up that comes after its
// nodes have joined.
func (o *op) finishUp(ctx context.Context, c repository.Cluster) error {
	s := o.s
	o.expect(2 + int32(boolInt(c.Spec.Autoscaling.Enabled)))
	if err := o.do(ctx, infra.StepFetchKubeconfig, func() error { return s.infra.FetchKubeconfig(ctx, o.call("")) }); err != nil {
		return err
	}
	if err := o.do(ctx, infra.StepDeployProvider, func() error { return s.infra.DeployProvider(ctx, o.call("")) }); err != nil {
		return err
	}
	if a := c.Spec.Autoscaling; a.Enabled {
		if err := o.do(ctx, infra.StepDeployAutoscaler, func() error { return s.infra.DeployAutoscaler(ctx, o.call(""), true, a.MinSize, a.MaxSize) }); err != nil {
			return err
		}
	}
	return nil
}

// configureNetwork converges the cluster's rules to those its machines need:
// ssh to every node, the API port to control nodes. An adopted operation
// skips the step when the rules are already those (an earlier attempt
// configured them).
func (o *op) configureNetwork(ctx context.Context, machines []infra.Machine) error {
	want := rulesFor(machines)
	if o.resumed() {
		have, err := o.s.infra.Rules(ctx, o.job.ResourceID)
		if err != nil {
			return err
		}
		if sameRules(have, want) {
			o.expect(-1)
			return nil
		}
	}
	return o.do(ctx, infra.StepConfigureNetwork, func() error {
		return o.s.infra.ConfigureNetwork(ctx, o.call(""), want)
	})
}

// rulesFor is the desired network rules of a set of machines (a machine
// listed twice gets its rules once).
func rulesFor(machines []infra.Machine) []infra.Rule {
	var rules []infra.Rule
	seen := map[string]bool{}
	for _, m := range machines {
		if seen[m.ID] {
			continue
		}
		seen[m.ID] = true
		rules = append(rules, infra.Rule{MachineID: m.ID, Kind: "ssh", Port: 22})
		if m.Role == infra.RoleControl {
			rules = append(rules, infra.Rule{MachineID: m.ID, Kind: "api", Port: 6443})
		}
	}
	return rules
}

// detachISOs detaches every ISO left attached to the cluster's machines.
func (o *op) detachISOs(ctx context.Context, clusterID string) error {
	machines, err := o.s.infra.Machines(ctx, clusterID)
	if err != nil {
		return err
	}
	for _, m := range machines {
		if m.AttachedISO != "" {
			if err := o.do(ctx, infra.StepDetachISO, func() error { return o.s.infra.DetachISO(ctx, o.call(m.ID)) }); err != nil {
				return err
			}
		}
	}
	return nil
}
