package sim

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/google/uuid"

	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/repository"
)

// The steps. Each one starts with s.step (delay and faults) and then makes
// one idempotent change, in a fenced transaction (s.fenced): the change is
// made only if the call's job still holds the call's cluster, checked with
// both rows locked, or the call is refused with infra.ErrFenced and nothing
// changes (infra's package doc). A step that acts on a machine only touches
// it while it belongs to the call's cluster or to the free pool (where
// delete_node puts it, so a step run again after delete_node still
// succeeds); a machine another cluster has taken is infra.ErrUnusable.

// ProvisionMachine creates machine id for the call's cluster, running and
// not joined. The machine already existing in that cluster is success.
func (s *Simulator) ProvisionMachine(ctx context.Context, c infra.Call, id string, role infra.Role, offering, version string) (infra.Machine, error) {
	const step = infra.StepProvisionMachine
	if c.MachineID == "" {
		c.MachineID = id
	}
	if err := checkMachineID(id); err != nil {
		return infra.Machine{}, fmt.Errorf("%s: %w", step, err)
	}
	if c.ClusterID == "" {
		return infra.Machine{}, fmt.Errorf("%s: machine %s: the call names no cluster", step, id)
	}
	if role != infra.RoleControl && role != infra.RoleWorker {
		return infra.Machine{}, fmt.Errorf("%s: machine %s: a cluster provisions %s or %s machines, not %q", step, id, infra.RoleControl, infra.RoleWorker, role)
	}
	if err := s.step(ctx, step, c); err != nil {
		return infra.Machine{}, err
	}
	var m repository.Machine
	err := s.fenced(ctx, step, c, func(tx *repository.Store) error {
		var err error
		m, err = tx.GetMachine(ctx, id)
		switch {
		case errors.Is(err, repository.ErrNotFound):
			m, err = tx.CreateMachine(ctx, repository.Machine{
				ID: id, ClusterID: c.ClusterID, Role: string(role), Power: string(infra.PowerRunning),
				KubernetesVersion: version, Offering: offering,
			})
			return err
		case err != nil:
			return err
		case m.ClusterID != c.ClusterID:
			return fmt.Errorf("machine %s exists in %s, not cluster %s: %w", id, clusterOrFree(m.ClusterID), c.ClusterID, infra.ErrUnusable)
		}
		return nil
	})
	if err != nil {
		return infra.Machine{}, err
	}
	return toMachine(m), nil
}

// checkMachineID insists on a lowercase canonical UUID: the Simulator API
// names machines machines/{uuid}, and the column holds 36 characters on
// every backend (SQLite would silently store a longer id that MySQL refuses).
func checkMachineID(id string) error {
	u, err := uuid.Parse(id)
	if err != nil || u.String() != id {
		return fmt.Errorf("machine id %q is not a lowercase UUID", id)
	}
	return nil
}

// PowerOn starts the call's machine.
func (s *Simulator) PowerOn(ctx context.Context, c infra.Call) error {
	return s.change(ctx, infra.StepPowerOn, c, repository.MachineCondition{},
		repository.MachineChanges{Power: new(string(infra.PowerRunning))})
}

// PowerOff stops the call's machine.
func (s *Simulator) PowerOff(ctx context.Context, c infra.Call) error {
	return s.change(ctx, infra.StepPowerOff, c, repository.MachineCondition{},
		repository.MachineChanges{Power: new(string(infra.PowerStopped))})
}

// ResizeMachine gives the call's machine another service offering.
func (s *Simulator) ResizeMachine(ctx context.Context, c infra.Call, offering string) error {
	if offering == "" {
		return fmt.Errorf("%s: machine %s: empty offering", infra.StepResizeMachine, c.MachineID)
	}
	return s.change(ctx, infra.StepResizeMachine, c, repository.MachineCondition{},
		repository.MachineChanges{Offering: &offering})
}

// AttachISO attaches iso to the call's machine (replacing any other).
func (s *Simulator) AttachISO(ctx context.Context, c infra.Call, iso string) error {
	if iso == "" {
		return fmt.Errorf("%s: machine %s: empty ISO name", infra.StepAttachISO, c.MachineID)
	}
	return s.change(ctx, infra.StepAttachISO, c, repository.MachineCondition{},
		repository.MachineChanges{AttachedISO: &iso})
}

// DetachISO detaches whatever ISO the call's machine has.
func (s *Simulator) DetachISO(ctx context.Context, c infra.Call) error {
	return s.change(ctx, infra.StepDetachISO, c, repository.MachineCondition{},
		repository.MachineChanges{AttachedISO: new("")})
}

// JoinNode joins the call's machine to its cluster's Kubernetes at version;
// it must be running. What it was handed of the cluster's credentials is
// recorded (Received) once the join is made.
func (s *Simulator) JoinNode(ctx context.Context, c infra.Call, version string, creds infra.NodeCredentials) error {
	if err := s.change(ctx, infra.StepJoinNode, c, repository.MachineCondition{Power: string(infra.PowerRunning)},
		repository.MachineChanges{Joined: new(true), KubernetesVersion: &version}); err != nil {
		return err
	}
	s.received.record(c.MachineID, creds)
	return nil
}

// UncordonNode lets work back onto the call's machine.
func (s *Simulator) UncordonNode(ctx context.Context, c infra.Call) error {
	return s.change(ctx, infra.StepUncordonNode, c, repository.MachineCondition{},
		repository.MachineChanges{Cordoned: new(false)})
}

// DrainNode cordons the call's machine.
func (s *Simulator) DrainNode(ctx context.Context, c infra.Call) error {
	return s.change(ctx, infra.StepDrainNode, c, repository.MachineCondition{},
		repository.MachineChanges{Cordoned: new(true)})
}

// DeleteNode removes the call's machine from Kubernetes and from its
// cluster: it goes back to the free pool as an EXTERNAL machine, with no ISO.
func (s *Simulator) DeleteNode(ctx context.Context, c infra.Call) error {
	return s.change(ctx, infra.StepDeleteNode, c, repository.MachineCondition{}, repository.MachineChanges{
		ClusterID:   new(""),
		Role:        new(string(infra.RoleExternal)),
		Joined:      new(false),
		Cordoned:    new(false),
		AttachedISO: new(""),
	})
}

// UpgradeNode moves the call's machine to Kubernetes version and uncordons it.
func (s *Simulator) UpgradeNode(ctx context.Context, c infra.Call, version string) error {
	if version == "" {
		return fmt.Errorf("%s: machine %s: empty version", infra.StepUpgradeNode, c.MachineID)
	}
	return s.change(ctx, infra.StepUpgradeNode, c, repository.MachineCondition{},
		repository.MachineChanges{KubernetesVersion: &version, Cordoned: new(false)})
}

// change is a step that writes ch to the call's machine, if the machine
// belongs to the call's cluster or the free pool and meets cond, in one
// conditional update.
func (s *Simulator) change(ctx context.Context, step string, c infra.Call, cond repository.MachineCondition, ch repository.MachineChanges) error {
	if c.MachineID == "" {
		return fmt.Errorf("%s: the call names no machine", step)
	}
	if err := s.step(ctx, step, c); err != nil {
		return err
	}
	cond.ClusterIDs = []string{c.ClusterID, ""}
	return s.fenced(ctx, step, c, func(tx *repository.Store) error {
		err := tx.ChangeMachine(ctx, c.MachineID, cond, ch)
		if errors.Is(err, repository.ErrConflict) {
			err = explain(ctx, tx, c, cond)
		}
		return missing(err, c.MachineID)
	})
}

// explain says why a machine did not meet a step's condition.
func explain(ctx context.Context, tx *repository.Store, c infra.Call, cond repository.MachineCondition) error {
	m, err := tx.GetMachine(ctx, c.MachineID)
	switch {
	case err != nil:
		return err
	case len(cond.ClusterIDs) > 0 && !slices.Contains(cond.ClusterIDs, m.ClusterID):
		return fmt.Errorf("machine %s belongs to cluster %s, not %s: %w", m.ID, m.ClusterID, c.ClusterID, infra.ErrUnusable)
	case cond.Power == string(infra.PowerRunning) && m.Power != cond.Power:
		return fmt.Errorf("machine %s is powered off", m.ID)
	default:
		// The machine changed between the update and this read.
		return fmt.Errorf("machine %s changed concurrently: %w", m.ID, repository.ErrConflict)
	}
}

// ConfigureNetwork converges the call's cluster's rules to want: it adds the
// missing rules first and only then deletes the extra ones, so no machine is
// ever left without the rules it keeps.
func (s *Simulator) ConfigureNetwork(ctx context.Context, c infra.Call, want []infra.Rule) error {
	const step = infra.StepConfigureNetwork
	if c.ClusterID == "" {
		return fmt.Errorf("%s: the call names no cluster", step)
	}
	wanted := make(map[repository.NetworkRule]bool, len(want))
	for _, r := range want {
		if r.MachineID == "" || r.Kind == "" || r.Port < 1 || r.Port > 65535 {
			return fmt.Errorf("%s: invalid rule %+v", step, r)
		}
		wanted[repository.NetworkRule{ClusterID: c.ClusterID, MachineID: r.MachineID, Kind: r.Kind, Port: r.Port}] = true
	}
	if err := s.step(ctx, step, c); err != nil {
		return err
	}
	return s.fenced(ctx, step, c, func(tx *repository.Store) error {
		have, err := tx.ListNetworkRules(ctx, c.ClusterID)
		if err != nil {
			return err
		}
		var add, del []repository.NetworkRule
		had := make(map[repository.NetworkRule]bool, len(have))
		for _, r := range have {
			had[r] = true
			if !wanted[r] {
				del = append(del, r)
			}
		}
		for r := range wanted {
			if !had[r] {
				add = append(add, r)
			}
		}
		if err := tx.AddNetworkRules(ctx, add); err != nil {
			return err
		}
		return tx.DeleteNetworkRules(ctx, del)
	})
}

// WaitAPI succeeds once the cluster has a running control machine and
// returns the API endpoint.
func (s *Simulator) WaitAPI(ctx context.Context, c infra.Call) (string, error) {
	const step = infra.StepWaitAPI
	if err := s.step(ctx, step, c); err != nil {
		return "", err
	}
	err := s.fenced(ctx, step, c, func(tx *repository.Store) error {
		ms, err := clusterMachines(ctx, tx, c)
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(ms, func(m repository.Machine) bool {
			return m.Role == string(infra.RoleControl) && m.Power == string(infra.PowerRunning)
		}) {
			return fmt.Errorf("cluster %s has no running control machine", c.ClusterID)
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("https://%s.clusterd.sim:6443", c.ClusterID[:min(8, len(c.ClusterID))]), nil
}

// FetchKubeconfig has nothing to change in the simulator; it checks that
// the cluster has machines.
func (s *Simulator) FetchKubeconfig(ctx context.Context, c infra.Call) error {
	return s.clusterStep(ctx, infra.StepFetchKubeconfig, c)
}

// DeployProvider has nothing to change in the simulator; it checks that the
// cluster has machines.
func (s *Simulator) DeployProvider(ctx context.Context, c infra.Call) error {
	return s.clusterStep(ctx, infra.StepDeployProvider, c)
}

// DeployAutoscaler has nothing to change in the simulator; it checks the
// sizes and that the cluster has machines.
func (s *Simulator) DeployAutoscaler(ctx context.Context, c infra.Call, enabled bool, minSize, maxSize int32) error {
	if enabled && (minSize < 0 || maxSize < minSize) {
		return fmt.Errorf("%s: cluster %s: invalid autoscaler sizes %d..%d", infra.StepDeployAutoscaler, c.ClusterID, minSize, maxSize)
	}
	return s.clusterStep(ctx, infra.StepDeployAutoscaler, c)
}

func (s *Simulator) clusterStep(ctx context.Context, step string, c infra.Call) error {
	if err := s.step(ctx, step, c); err != nil {
		return err
	}
	return s.fenced(ctx, step, c, func(tx *repository.Store) error {
		_, err := clusterMachines(ctx, tx, c)
		return err
	})
}

// clusterMachines lists the call's cluster's machines; a cluster without
// any cannot have Kubernetes to talk to.
func clusterMachines(ctx context.Context, tx *repository.Store, c infra.Call) ([]repository.Machine, error) {
	ms, err := tx.ListMachines(ctx, c.ClusterID)
	if err != nil {
		return nil, err
	}
	if len(ms) == 0 {
		return nil, fmt.Errorf("cluster %s has no machines", c.ClusterID)
	}
	return ms, nil
}

// ValidateNode adopts a free, running EXTERNAL machine into the call's
// cluster as a worker. The checks and the adoption are one conditional
// update, so of clusters racing for one machine exactly one gets it; the
// others, and machines that are not usable, get infra.ErrUnusable. A
// machine the call's cluster already has validates.
func (s *Simulator) ValidateNode(ctx context.Context, c infra.Call) error {
	const step = infra.StepValidateNode
	if c.MachineID == "" || c.ClusterID == "" {
		return fmt.Errorf("%s: the call must name a cluster and a machine", step)
	}
	if err := s.step(ctx, step, c); err != nil {
		return err
	}
	return s.fenced(ctx, step, c, func(tx *repository.Store) error {
		m, err := tx.GetMachine(ctx, c.MachineID)
		if errors.Is(err, repository.ErrNotFound) {
			return fmt.Errorf("no such machine %s: %w", c.MachineID, infra.ErrUnusable)
		}
		if err != nil {
			return err
		}
		if m.ClusterID == c.ClusterID {
			return nil
		}
		if err := usable(m); err != nil {
			return err
		}
		err = tx.ChangeMachine(ctx, m.ID,
			repository.MachineCondition{ClusterIDs: []string{""}, Role: string(infra.RoleExternal), Power: string(infra.PowerRunning)},
			repository.MachineChanges{ClusterID: &c.ClusterID, Role: new(string(infra.RoleWorker))})
		if errors.Is(err, repository.ErrConflict) || errors.Is(err, repository.ErrNotFound) {
			// Lost a race: a concurrent validate of the same cluster is success.
			now, gerr := tx.GetMachine(ctx, m.ID)
			if gerr == nil && now.ClusterID == c.ClusterID {
				return nil
			}
			return fmt.Errorf("machine %s was taken or changed concurrently: %w", m.ID, infra.ErrUnusable)
		}
		return err
	})
}

// usable says why a machine cannot be adopted.
func usable(m repository.Machine) error {
	switch {
	case m.ClusterID != "":
		return fmt.Errorf("machine %s belongs to cluster %s: %w", m.ID, m.ClusterID, infra.ErrUnusable)
	case m.Role != string(infra.RoleExternal):
		return fmt.Errorf("machine %s is a %s machine, not %s: %w", m.ID, m.Role, infra.RoleExternal, infra.ErrUnusable)
	case m.Power != string(infra.PowerRunning):
		return fmt.Errorf("machine %s is powered off: %w", m.ID, infra.ErrUnusable)
	}
	return nil
}

// DestroyMachine deletes the call's machine and its network rules; a machine
// that is gone already is destroyed. A machine in the free pool (where
// delete_node put it) is first taken back into the call's cluster by a
// conditional update, so a cluster adopting it at that moment either wins
// (and the destroy fails with infra.ErrUnusable) or never sees it.
func (s *Simulator) DestroyMachine(ctx context.Context, c infra.Call) error {
	const step = infra.StepDestroyMachine
	if c.MachineID == "" {
		return fmt.Errorf("%s: the call names no machine", step)
	}
	if err := s.step(ctx, step, c); err != nil {
		return err
	}
	return s.fenced(ctx, step, c, func(tx *repository.Store) error {
		cond := repository.MachineCondition{ClusterIDs: []string{c.ClusterID, ""}}
		err := tx.ChangeMachine(ctx, c.MachineID, cond, repository.MachineChanges{ClusterID: &c.ClusterID})
		if errors.Is(err, repository.ErrConflict) {
			err = explain(ctx, tx, c, cond)
		}
		if errors.Is(err, repository.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		return tx.DeleteMachine(ctx, c.MachineID)
	})
}

func clusterOrFree(id string) string {
	if id == "" {
		return "the free pool"
	}
	return "cluster " + id
}
