// Package sim is clusterd's default infrastructure: a simulator whose
// machines and network rules live in clusterd's own database (so they
// outlive a server crash, and a restarted server finds what its operations
// left), with a configurable delay on every step and fault injection that
// fails, delays or holds any named step (SPEC §6).
//
// Every step is idempotent, like a real driver's must be: an operation run
// again after an interruption converges instead of failing on what it did
// the first time. Every step is fenced, as infra's package doc asks of a
// driver: its machine writes and the repository's guard (its job still
// holds its cluster) are one transaction (repository.Store.Guarded), and
// every call, accepted or refused, is logged in the simulator's own table,
// sim_calls, so that tests can check the promise independently (Calls).
// The simulator owns that table: Open creates it through the repository's
// hook for a driver's own migrations (repository.Store.Migrate). Its
// machines and network rules are still clusterd's tables, kept by the
// repository.
package sim

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/repository"
)

// Store is the part of the repository the simulator keeps its machines and
// network rules in.
type Store interface {
	CreateMachine(ctx context.Context, m repository.Machine) (repository.Machine, error)
	GetMachine(ctx context.Context, id string) (repository.Machine, error)
	ListMachines(ctx context.Context, clusterIDs ...string) ([]repository.Machine, error)
	GetClusterWithMachines(ctx context.Context, id string) (repository.Cluster, []repository.Machine, error)
	UpdateMachine(ctx context.Context, id string, cond repository.MachineCondition, ch repository.MachineChanges) (repository.Machine, error)
	ListNetworkRules(ctx context.Context, clusterID string) ([]repository.NetworkRule, error)
	// Guarded runs a step's writes in one transaction, only while the
	// step's job holds its cluster (repository.ErrFenced otherwise).
	Guarded(ctx context.Context, f repository.Fence, fn func(tx *repository.Store) error) error
	// CallStore writes and reads the simulator's own table, the call log.
	CallStore
	// Migrate brings the simulator's own tables up to date (Open).
	Migrate(ctx context.Context, name string, dir fs.FS) error
}

// Config tunes the simulator.
type Config struct {
	// StepDelay is slept at the start of every step, so that demos show
	// progress; tests use 0.
	StepDelay time.Duration
	// Clock stamps held steps; nil is time.Now.
	Clock func() time.Time
	// Logger records faults firing and being released; nil discards.
	Logger *slog.Logger
}

// Simulator implements infra.Infrastructure over a Store. It is safe for
// concurrent use.
type Simulator struct {
	store Store
	delay time.Duration
	now   func() time.Time
	log   *slog.Logger
	inj   *injector
	// refused counts the calls refused because their job no longer held
	// the cluster.
	refused atomic.Int64
	// received is what each machine's joins were handed (Received).
	received *receipts
}

var _ infra.Infrastructure = (*Simulator)(nil)

// Open brings the simulator's own tables up to date in store's database
// (Migrate) and returns a simulator keeping its machines there.
func Open(ctx context.Context, store Store, cfg Config) (*Simulator, error) {
	if err := Migrate(ctx, store); err != nil {
		return nil, err
	}
	return New(store, cfg), nil
}

// New returns a simulator keeping its machines in store, whose database
// must have the simulator's tables already (Open, Migrate). A simulator
// whose steps are only validated may have no store.
func New(store Store, cfg Config) *Simulator {
	s := &Simulator{store: store, delay: cfg.StepDelay, now: cfg.Clock, log: cfg.Logger, inj: newInjector(), received: newReceipts()}
	if s.now == nil {
		s.now = time.Now
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	return s
}

// step is the start of every step: the step delay, then the first fault
// that matches. A cancelled context is returned as ctx.Err().
func (s *Simulator) step(ctx context.Context, name string, c infra.Call) error {
	s.log.Debug("step", "step", name, "cluster", c.ClusterID, "operation", c.Operation, "machine", c.MachineID)
	if err := sleep(ctx, s.delay); err != nil {
		return err
	}
	if err := s.fire(ctx, name, c); err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil && errors.Is(err, ctxErr) {
			return err
		}
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// fenced runs a step's writes only while the call's job, at the call's
// attempt, holds the call's cluster (repository.Store.Guarded), and logs the
// call in the same transaction. A refusal is counted, logged (in a
// transaction of its own: nothing else is written), and returned wrapping
// infra.ErrFenced; nothing was changed.
func (s *Simulator) fenced(ctx context.Context, step string, c infra.Call, fn func(tx *repository.Store) error) error {
	f := repository.Fence{ClusterID: c.ClusterID, JobID: c.Operation, Attempt: c.Attempt, Step: step, MachineID: c.MachineID}
	err := s.store.Guarded(ctx, f, func(tx *repository.Store) error {
		if err := fn(tx); err != nil {
			return err
		}
		return s.logCall(ctx, tx, f, "")
	})
	var refused *repository.FencedError
	if errors.As(err, &refused) {
		if f.ClusterID != "" && f.JobID != "" {
			if lerr := s.logCall(ctx, s.store, f, refused.Reason); lerr != nil {
				return fmt.Errorf("%s: log its refusal (%v): %w", step, refused, lerr)
			}
		}
		s.refused.Add(1)
		s.log.Warn("step refused: its job no longer holds the cluster", "step", step, "cluster", c.ClusterID,
			"operation", c.Operation, "machine", c.MachineID, "found", refused.Reason)
		return fmt.Errorf("%s on cluster %s by operation %s: %w: %s", step, c.ClusterID, c.Operation, infra.ErrFenced, refused.Reason)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", step, err)
	}
	return nil
}

// Refused is how many calls this simulator refused because their job no
// longer held the cluster (the sim_calls table has every process's).
func (s *Simulator) Refused() int64 { return s.refused.Load() }

// sleep waits d, or returns ctx's error as soon as ctx ends (at once if it
// has ended already).
func sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// PurgeCallLog deletes up to limit entries of the fencing log (every call,
// accepted or refused) made before cutoff, oldest first; the scanner calls it
// with the job retention, so the log lives as long as the jobs it records.
func (s *Simulator) PurgeCallLog(ctx context.Context, cutoff time.Time, limit int) (int64, error) {
	n, err := purgeCalls(ctx, s.store, cutoff, limit)
	if err != nil {
		return 0, fmt.Errorf("purge the fencing log: %w", err)
	}
	return n, nil
}

// Machines lists the machines of the given clusters, or every machine
// (free ones too) when none is given, oldest first.
func (s *Simulator) Machines(ctx context.Context, clusterIDs ...string) ([]infra.Machine, error) {
	ms, err := s.store.ListMachines(ctx, clusterIDs...)
	if err != nil {
		return nil, fmt.Errorf("list machines: %w", err)
	}
	out := make([]infra.Machine, len(ms))
	for i, m := range ms {
		out[i] = toMachine(m)
	}
	return out, nil
}

// ClusterWithMachines reads cluster id and its machines (oldest first) in
// one statement: the simulator keeps its machines in the clusters'
// database, so a reader of both need not make two reads
// (repository.ErrNotFound when the cluster does not exist).
func (s *Simulator) ClusterWithMachines(ctx context.Context, id string) (repository.Cluster, []infra.Machine, error) {
	c, ms, err := s.store.GetClusterWithMachines(ctx, id)
	if err != nil {
		return repository.Cluster{}, nil, err
	}
	out := make([]infra.Machine, len(ms))
	for i, m := range ms {
		out[i] = toMachine(m)
	}
	return c, out, nil
}

// Machine reads one machine (infra.ErrNotFound).
func (s *Simulator) Machine(ctx context.Context, id string) (infra.Machine, error) {
	m, err := s.store.GetMachine(ctx, id)
	if err != nil {
		return infra.Machine{}, missing(err, id)
	}
	return toMachine(m), nil
}

// CreateMachine adds a free, running EXTERNAL machine to the pool that
// AddNodes takes machines from. Machines of other roles only exist in a
// cluster, which provisions them itself, so they are refused.
func (s *Simulator) CreateMachine(ctx context.Context, role infra.Role) (infra.Machine, error) {
	if role != infra.RoleExternal {
		return infra.Machine{}, fmt.Errorf("create machine: only %s machines can exist without a cluster, not %q", infra.RoleExternal, role)
	}
	m, err := s.store.CreateMachine(ctx, repository.Machine{
		ID: uuid.Must(uuid.NewV7()).String(), Role: string(role), Power: string(infra.PowerRunning),
	})
	if err != nil {
		return infra.Machine{}, fmt.Errorf("create machine: %w", err)
	}
	s.log.Info("machine created", "machine", m.ID, "role", m.Role)
	return toMachine(m), nil
}

// SetMachinePower powers a machine on or off out of band, as an operator or
// a failure would: no step, so no delay and no faults. The scanner is meant
// to notice.
func (s *Simulator) SetMachinePower(ctx context.Context, id string, p infra.Power) (infra.Machine, error) {
	if p != infra.PowerRunning && p != infra.PowerStopped {
		return infra.Machine{}, fmt.Errorf("set power of machine %s: power %q is not %s or %s", id, p, infra.PowerRunning, infra.PowerStopped)
	}
	m, err := s.store.UpdateMachine(ctx, id, repository.MachineCondition{}, repository.MachineChanges{Power: new(string(p))})
	if err != nil {
		return infra.Machine{}, fmt.Errorf("set power of machine %s: %w", id, missing(err, id))
	}
	s.log.Info("machine power set out of band", "machine", id, "power", p)
	return toMachine(m), nil
}

// Rules lists a cluster's network rules, by machine, kind and port.
func (s *Simulator) Rules(ctx context.Context, clusterID string) ([]infra.Rule, error) {
	rs, err := s.store.ListNetworkRules(ctx, clusterID)
	if err != nil {
		return nil, err
	}
	out := make([]infra.Rule, len(rs))
	for i, r := range rs {
		out[i] = infra.Rule{MachineID: r.MachineID, Kind: r.Kind, Port: r.Port}
	}
	return out, nil
}

func toMachine(m repository.Machine) infra.Machine {
	return infra.Machine{
		ID:                m.ID,
		ClusterID:         m.ClusterID,
		Role:              infra.Role(m.Role),
		Power:             infra.Power(m.Power),
		Joined:            m.Joined,
		Cordoned:          m.Cordoned,
		KubernetesVersion: m.KubernetesVersion,
		AttachedISO:       m.AttachedISO,
		Offering:          m.Offering,
		CreateTime:        m.CreateTime,
	}
}

// missing turns the repository's ErrNotFound for a machine into infra's.
func missing(err error, id string) error {
	if errors.Is(err, repository.ErrNotFound) {
		return fmt.Errorf("machine %s: %w", id, infra.ErrNotFound)
	}
	return err
}
