package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
)

// The operations below are the scanner's (SPEC §5). The scanner decides when
// (it reads, and asks the state machine); these claim the cluster with the
// same compare-and-set as any request, on the cluster as the scanner read
// it, and run the work as a job, so a recovery interrupted by a crash is
// itself recovered. Losing the compare-and-set is normal: it returns an
// error wrapping repository.ErrConflict.

// RecoverOrphan takes over an operation whose job is no longer running on a
// live server (SPEC §5.1): a DESTROYING cluster is destroyed again in place;
// any other is claimed in place by a recovery job that repairs what the
// interrupted operation left (SPEC §5.3) and then ends the operation with its
// orphan event (-> ALERT, RUNNING or ERROR). orphan is the interrupted job
// (zero if it does not exist); reason goes to the history.
func (s *Clusters) RecoverOrphan(ctx context.Context, c repository.Cluster, orphan repository.Job, reason string) error {
	if ev, _ := lifecycle.OrphanEvent(c.State); ev == lifecycle.DestroyRequested {
		return s.RetryDestroy(ctx, c, reason)
	}
	plan := recoverPlan{Orphan: c.CurrentOperation, Kind: repairKind(orphan), Reason: reason}
	t := repository.Move(c, lifecycle.Stay(c.State))
	t.History = repository.RecoveryStarted
	t.Message = fmt.Sprintf("recovering orphaned operation %s: %s", operationName(c.CurrentOperation), reason)
	_, err := s.claim(ctx, t, VerbRecover, idempotency{}, plan, s.orphanWork(plan), repository.Progress{})
	return err
}

// recoverPlan is a recovery job's parameters: the orphaned operation it
// takes over, its kind and why (all empty for the recovery of an ALERT
// cluster, RecoverAlert).
type recoverPlan struct {
	Orphan string `json:"orphan,omitempty"`
	Kind   string `json:"kind,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// repairKind is the kind of operation whose leftovers a recovery of job j
// repairs: j's own kind, or, when j is itself a recovery of an orphan (lost
// or failed before it ended), the kind of the operation that one was
// repairing. Without it a chain of recoveries forgets that a scale, add or
// remove was changing the node set, keeps its joined machines and leaves
// the spec's counts behind them (SPEC §5.3).
func repairKind(j repository.Job) string {
	if j.Kind != VerbRecover {
		return j.Kind
	}
	var p recoverPlan
	if err := json.Unmarshal([]byte(j.Params), &p); err != nil {
		return j.Kind
	}
	return p.Kind
}

// orphanWork repairs what the orphaned operation left (SPEC §5.3) and then
// ends it with the orphan event of the state it held the cluster in (->
// ALERT, RUNNING or ERROR; a state with none, e.g. an ERROR cluster whose
// in-place start died, is only released), whatever the repairs do. Should
// it fail, its repair on the way out is for the orphan's kind too.
func (s *Clusters) orphanWork(p recoverPlan) workFunc {
	return func(ctx context.Context, o *op) (repository.Changes, error) {
		o.repairKind = p.Kind
		c, err := o.held(ctx)
		if err != nil {
			return repository.Changes{}, err
		}
		ev, _ := lifecycle.OrphanEvent(c.State)
		o.endEvent, o.failEvent = ev, ev
		ch, err := o.repair(ctx, p.Kind)
		if err != nil {
			return ch, err
		}
		o.endMessage = fmt.Sprintf("orphaned operation %s ended: %s", operationName(p.Orphan), p.Reason)
		return ch, nil
	}
}

// RetryDestroy destroys a DESTROYING cluster again, in place (SPEC §3.4).
func (s *Clusters) RetryDestroy(ctx context.Context, c repository.Cluster, reason string) error {
	t, err := decided(c, lifecycle.DestroyRequested)
	if err != nil {
		return err
	}
	t.Message = "destroy retried: " + reason
	_, err = s.claim(ctx, t, VerbDelete, idempotency{}, struct{}{}, s.deleteWork, repository.Progress{})
	return err
}

// MarkFaulty moves a RUNNING or STOPPED cluster whose machines are not in the
// desired power state to ALERT (FAULTS_DETECTED); no job, one CAS.
func (s *Clusters) MarkFaulty(ctx context.Context, c repository.Cluster, reason string) error {
	t, err := decided(c, lifecycle.FaultsDetected)
	if err != nil {
		return err
	}
	t.Message = reason
	_, err = s.store.Transition(ctx, t)
	return err
}

// RecoverAlert brings back an ALERT cluster whose machines all run and whose
// nodes have all joined: RECOVERING, then RUNNING once the job has checked
// the machines again and converged the leftovers. Only this job completes
// the recovery it started.
func (s *Clusters) RecoverAlert(ctx context.Context, c repository.Cluster) error {
	t, err := decided(c, lifecycle.RecoveryRequested)
	if err != nil {
		return err
	}
	t.Message = "machines all running and nodes joined"
	_, err = s.claim(ctx, t, VerbRecover, idempotency{}, recoverPlan{}, s.recoverAlertWork, repository.Progress{})
	return err
}

// recoverAlertWork checks the machines of a RECOVERING cluster again,
// converges the leftovers, and finishes the cluster if its create never did.
func (s *Clusters) recoverAlertWork(ctx context.Context, o *op) (repository.Changes, error) {
	c, err := o.held(ctx)
	if err != nil {
		return repository.Changes{}, err
	}
	machines, err := s.infra.Machines(ctx, c.ID)
	if err != nil {
		return repository.Changes{}, err
	}
	if mismatch := infra.Mismatch(machines, c.Spec.KubernetesVersion); mismatch != "" {
		return repository.Changes{}, &MachinesChangedError{Cluster: c.ID, Mismatch: mismatch}
	}
	ch, err := o.repair(ctx, "")
	if err != nil || c.Endpoint != "" {
		return ch, err
	}
	// A create that failed after its nodes joined never got its API,
	// kubeconfig and provider: finish it as a start would.
	o.expect(1)
	var endpoint string
	if err := o.do(ctx, infra.StepWaitAPI, func() (err error) {
		endpoint, err = s.infra.WaitAPI(ctx, o.call(""))
		return err
	}); err != nil {
		return ch, err
	}
	if err := o.finishUp(ctx, c); err != nil {
		return ch, err
	}
	ch.Endpoint = &endpoint
	return ch, nil
}

// StopAlert finishes stopping an ALERT cluster whose machines are all
// stopped: STOPPING, then STOPPED. The claim is on the cluster as the scanner
// listed it, so a user's start since then wins.
func (s *Clusters) StopAlert(ctx context.Context, c repository.Cluster) error {
	t, err := decided(c, lifecycle.StopRequested)
	if err != nil {
		return err
	}
	t.Message = "machines all stopped"
	_, err = s.claim(ctx, t, VerbStop, idempotency{}, struct{}{}, s.stopWork, stopFirst(c))
	return err
}

// decided is the transition that sends ev to cluster c as the scanner read
// it, with the state machine's decision (a *lifecycle.TransitionError if its
// state has none).
func decided(c repository.Cluster, ev lifecycle.Event) (repository.Transition, error) {
	d, err := lifecycle.Decide(c.State, ev)
	if err != nil {
		return repository.Transition{}, fmt.Errorf("cluster %s: %w", c.ID, err)
	}
	return repository.Move(c, d), nil
}

// repair converges what an interrupted or failed operation left (SPEC
// §5.3): machines beyond the node count that never joined are removed
// (returned to the free pool when an AddNodes adopted them, destroyed
// otherwise), machines are resized back to the spec's offering, nodes an
// interrupted drain left cordoned are uncordoned, ISOs left attached are
// detached, and the network rules match the machines. Each repair is
// recorded in the cluster's history. When the operation was changing the
// node set (scale, add or remove nodes), the returned changes record the
// counts of the nodes kept, so the spec says what exists. An interrupted
// upgrade needs nothing more: run again, it skips the nodes already done.
func (o *op) repair(ctx context.Context, kind string) (repository.Changes, error) {
	s := o.s
	c := o.cluster
	if o.ending {
		// On the way out of a failure: the failure may be that the
		// cluster was taken, and then there is nothing to repair.
		var err error
		if c, err = o.held(ctx); err != nil {
			return repository.Changes{}, err
		}
	}
	machines, err := s.infra.Machines(ctx, c.ID)
	if err != nil {
		return repository.Changes{}, err
	}
	want := map[infra.Role]int32{infra.RoleControl: c.Spec.ControlNodeCount, infra.RoleWorker: c.Spec.WorkerNodeCount}
	have := map[infra.Role]int32{}
	for _, m := range machines {
		have[m.Role]++
	}
	var keep []infra.Machine
	// Newest first: the extras are the machines the interrupted operation added.
	for i := len(machines) - 1; i >= 0; i-- {
		m := machines[i]
		if m.Joined || have[m.Role] <= want[m.Role] {
			keep = append(keep, m)
			continue
		}
		have[m.Role]--
		// A machine AddNodes adopted goes back to the free pool; any other
		// is destroyed.
		name := infra.StepDestroyMachine
		if kind == VerbAddNodes {
			name = infra.StepDeleteNode
		}
		if err := o.fix(ctx, c, name, func() error {
			if name == infra.StepDeleteNode {
				return s.infra.DeleteNode(ctx, o.call(m.ID))
			}
			return s.infra.DestroyMachine(ctx, o.call(m.ID))
		},
			"%s: %s%s beyond the %d %s nodes never joined", name, machinePrefix, m.ID, want[m.Role], m.Role); err != nil {
			return repository.Changes{}, err
		}
	}
	slices.Reverse(keep)
	for _, m := range keep {
		// A machine AddNodes adopted keeps its own size (its offering is
		// unknown to clusterd); the others follow the spec's.
		off := c.Spec.ServiceOffering
		if m.Role == infra.RoleControl {
			off = c.Spec.ControlOfferingOrDefault()
		}
		if off != "" && m.Offering != "" && m.Offering != off {
			if err := o.fix(ctx, c, infra.StepResizeMachine, func() error { return s.infra.ResizeMachine(ctx, o.call(m.ID), off) },
				"resize_machine: %s%s back from %q to the cluster's offering %q", machinePrefix, m.ID, m.Offering, off); err != nil {
				return repository.Changes{}, err
			}
		}
		if m.Joined && m.Cordoned {
			if err := o.fix(ctx, c, infra.StepUncordonNode, func() error { return s.infra.UncordonNode(ctx, o.call(m.ID)) },
				"uncordon_node: %s%s was left cordoned", machinePrefix, m.ID); err != nil {
				return repository.Changes{}, err
			}
		}
		if iso := m.AttachedISO; iso != "" {
			if err := o.fix(ctx, c, infra.StepDetachISO, func() error { return s.infra.DetachISO(ctx, o.call(m.ID)) },
				"detach_iso: %s left attached to %s%s", iso, machinePrefix, m.ID); err != nil {
				return repository.Changes{}, err
			}
		}
	}
	rules, err := s.infra.Rules(ctx, c.ID)
	if err != nil {
		return repository.Changes{}, err
	}
	if wantRules := rulesFor(keep); !sameRules(rules, wantRules) {
		if err := o.fix(ctx, c, infra.StepConfigureNetwork, func() error { return s.infra.ConfigureNetwork(ctx, o.call(""), wantRules) },
			"configure_network: %d rules converged to %d", len(rules), len(wantRules)); err != nil {
			return repository.Changes{}, err
		}
	}
	if !slices.Contains([]string{VerbScale, VerbAddNodes, VerbRemoveNodes}, kind) {
		return repository.Changes{}, nil
	}
	kept := map[infra.Role]int32{}
	for _, m := range keep {
		kept[m.Role]++
	}
	if kept[infra.RoleControl] == c.Spec.ControlNodeCount && kept[infra.RoleWorker] == c.Spec.WorkerNodeCount {
		return repository.Changes{}, nil
	}
	spec := c.Spec
	spec.ControlNodeCount, spec.WorkerNodeCount = kept[infra.RoleControl], kept[infra.RoleWorker]
	o.repaired(ctx, c, fmt.Sprintf("spec: %d control and %d worker nodes recorded (were %d and %d) to match the nodes the interrupted %s left",
		spec.ControlNodeCount, spec.WorkerNodeCount, c.Spec.ControlNodeCount, c.Spec.WorkerNodeCount, kind))
	return repository.Changes{Spec: &spec}, nil
}

// fix runs one repair step and records it.
func (o *op) fix(ctx context.Context, c repository.Cluster, step string, do func() error, format string, args ...any) error {
	o.expect(1)
	if err := o.do(ctx, step, do); err != nil {
		return err
	}
	o.repaired(ctx, c, fmt.Sprintf(format, args...))
	return nil
}

// repairAfterFailure runs repair on the way out of a failed, cancelled or
// interrupted operation, so a failure leaves no more debris than a crash
// does. It is best effort, except that a database that did not answer
// (repository.ErrUnavailable, e.g. the first query on a connection a
// database restart broke) is returned, so that the runner works the end out
// again, repair included: a cluster released to ALERT with an unjoined
// machine left is not converged by anything later (a start would join it).
func (o *op) repairAfterFailure(ctx context.Context) (repository.Changes, error) {
	o.ending = true
	ch, err := o.repair(ctx, o.repairKind)
	switch {
	case err == nil, errors.Is(err, errNotHeld):
	case errors.Is(err, repository.ErrUnavailable):
		return ch, fmt.Errorf("repair after a failed operation: %w", err)
	default:
		o.s.log.Warn("repair after a failed operation did not finish", "job", o.job.ID, "error", err)
	}
	return ch, nil
}

// repaired records a repair in the cluster's history and the logs.
func (o *op) repaired(ctx context.Context, c repository.Cluster, msg string) {
	o.s.log.Info("repaired leftover", "cluster", c.ID, "job", o.job.ID, "repair", msg)
	o.s.repairs.Add(1)
	if err := o.s.store.RecordEvent(ctx, repository.Event{
		ClusterID: c.ID, From: c.State, Name: repository.Repair, To: c.State, Operation: o.job.ID, Message: msg,
	}); err != nil {
		o.s.log.Warn("could not record a repair", "cluster", c.ID, "error", err)
	}
}

// sameRules compares two rule sets, ignoring order.
func sameRules(a, b []infra.Rule) bool {
	if len(a) != len(b) {
		return false
	}
	set := map[infra.Rule]int{}
	for _, r := range a {
		set[r]++
	}
	for _, r := range b {
		if set[r] == 0 {
			return false
		}
		set[r]--
	}
	return true
}
