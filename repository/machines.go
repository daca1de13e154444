package repository

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// Machine is a simulated machine as stored. The simulator keeps its machines
// here, next to the clusters, so that they outlive a server crash and a
// restarted server sees what its operations left. Role and Power are the
// infrastructure's names (CONTROL, WORKER, EXTERNAL; RUNNING, STOPPED); the
// repository stores them without interpreting them.
type Machine struct {
	ID string
	// ClusterID is the cluster the machine belongs to; empty for a free one.
	ClusterID         string
	Role              string
	Power             string
	Joined            bool
	Cordoned          bool
	KubernetesVersion string
	AttachedISO       string
	Offering          string
	CreateTime        time.Time
	UpdateTime        time.Time
}

// MachineCondition is what a conditional machine update requires of the row,
// so that a check and the write it justifies are one statement: adopting a
// free machine, for instance, must not let two clusters both take it. Empty
// fields require nothing.
type MachineCondition struct {
	// ClusterIDs, when not empty, requires the machine's cluster to be one
	// of them ("" is the free pool).
	ClusterIDs []string
	// Role and Power, when set, require that role and that power state.
	Role  string
	Power string
}

// MachineChanges are the fields an update writes; nil fields keep their value.
type MachineChanges struct {
	ClusterID         *string
	Role              *string
	Power             *string
	Joined            *bool
	Cordoned          *bool
	KubernetesVersion *string
	AttachedISO       *string
	Offering          *string
}

// NetworkRule lets one kind of traffic reach one machine of a cluster.
type NetworkRule struct {
	ClusterID string
	MachineID string
	Kind      string
	Port      int32
}

// machineRow and networkRuleRow are the GORM mappings, unexported like the others.
type machineRow struct {
	ID                string `gorm:"primaryKey"`
	ClusterID         string
	Role              string
	Power             string
	Joined            bool
	Cordoned          bool
	KubernetesVersion string
	AttachedISO       string `gorm:"column:attached_iso"`
	Offering          string
	CreateTime        time.Time
	UpdateTime        time.Time
}

func (machineRow) TableName() string { return "machines" }

type networkRuleRow struct {
	ID        int64 `gorm:"primaryKey;autoIncrement"`
	ClusterID string
	MachineID string
	Kind      string
	Port      int32
}

func (networkRuleRow) TableName() string { return "network_rules" }

func (r *machineRow) toMachine() Machine {
	return Machine{
		ID:                r.ID,
		ClusterID:         r.ClusterID,
		Role:              r.Role,
		Power:             r.Power,
		Joined:            r.Joined,
		Cordoned:          r.Cordoned,
		KubernetesVersion: r.KubernetesVersion,
		AttachedISO:       r.AttachedISO,
		Offering:          r.Offering,
		CreateTime:        r.CreateTime.UTC(),
		UpdateTime:        r.UpdateTime.UTC(),
	}
}

// CreateMachine inserts a machine with the id the caller chose (ErrAlreadyExists
// if it is taken), so that a step run again finds its machine instead of
// making another. The times are stamped here.
func (s *Store) CreateMachine(ctx context.Context, m Machine) (Machine, error) {
	if m.ID == "" {
		return Machine{}, errors.New("create machine: empty id")
	}
	now := s.stamp()
	row := machineRow{
		ID:                m.ID,
		ClusterID:         m.ClusterID,
		Role:              m.Role,
		Power:             m.Power,
		Joined:            m.Joined,
		Cordoned:          m.Cordoned,
		KubernetesVersion: m.KubernetesVersion,
		AttachedISO:       m.AttachedISO,
		Offering:          m.Offering,
		CreateTime:        now,
		UpdateTime:        now,
	}
	err := s.retrying(ctx, func() error { return classify(s.db.WithContext(ctx).Create(&row).Error) })
	if err != nil {
		return Machine{}, fmt.Errorf("create machine %s: %w", m.ID, err)
	}
	return row.toMachine(), nil
}

// GetMachine reads one machine (ErrNotFound).
func (s *Store) GetMachine(ctx context.Context, id string) (Machine, error) {
	return s.getMachine(s.rdb.WithContext(ctx), id)
}

func (s *Store) getMachine(db *gorm.DB, id string) (Machine, error) {
	m, err := scanMachine(rowDirect(db, "SELECT "+s.cols.machine+" FROM machines WHERE id = ?", id))
	if errors.Is(err, sql.ErrNoRows) {
		return Machine{}, fmt.Errorf("machine %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return Machine{}, fmt.Errorf("get machine %s: %w", id, classify(err))
	}
	return m, nil
}

// scanMachine scans one row of hotColumns.machine: a machine's reads are
// written out and scanned by hand, since every step of the simulator reads
// its machine back and every job its cluster's machines.
func scanMachine(r interface{ Scan(dest ...any) error }) (Machine, error) {
	var m Machine
	if err := scanMachineInto(r, &m); err != nil {
		return Machine{}, err
	}
	return m, nil
}

// scanMachineInto is scanMachine into *m, which a list's rows are scanned
// into where they are kept (a Machine scanned into a variable of its own
// goes to the heap: its fields' addresses are passed to Scan).
func scanMachineInto(r interface{ Scan(dest ...any) error }, m *Machine) error {
	return r.Scan(&m.ID, &m.ClusterID, &m.Role, &m.Power, &m.Joined, &m.Cordoned, &m.KubernetesVersion,
		&m.AttachedISO, &m.Offering, stamp{&m.CreateTime}, stamp{&m.UpdateTime})
}

// ListMachines returns the machines of the given clusters ("" names the free
// pool), or every machine when none is given, oldest first.
func (s *Store) ListMachines(ctx context.Context, clusterIDs ...string) ([]Machine, error) {
	if !s.inTx && len(clusterIDs) > 0 {
		return s.readMachines(ctx, clusterIDs)
	}
	db := s.rdb.WithContext(ctx)
	if len(clusterIDs) > 0 {
		db = db.Where("cluster_id IN ?", clusterIDs)
	}
	var rows []machineRow
	if err := db.Order("create_time, id").Find(&rows).Error; err != nil {
		return nil, fmt.Errorf("list machines: %w", classify(err))
	}
	out := make([]Machine, len(rows))
	for i := range rows {
		out[i] = rows[i].toMachine()
	}
	return out, nil
}

// readMachines is ListMachines of the given clusters on the readers,
// scanned by hand (GetCluster and ListClusters read them for every call).
func (s *Store) readMachines(ctx context.Context, clusterIDs []string) ([]Machine, error) {
	args := make([]any, len(clusterIDs))
	for i, id := range clusterIDs {
		args[i] = id
	}
	rows, err := s.readDB().QueryContext(ctx, "SELECT "+s.cols.machine+
		" FROM machines WHERE cluster_id IN (?"+strings.Repeat(", ?", len(clusterIDs)-1)+") ORDER BY create_time, id", args...)
	if err != nil {
		return nil, fmt.Errorf("list machines: %w", classify(err))
	}
	defer rows.Close()
	// Room for three machines a cluster (a control node and two workers)
	// before the slice grows; each row is scanned in place.
	out := make([]Machine, 0, 3*len(clusterIDs))
	for rows.Next() {
		out = append(out, Machine{})
		if err := scanMachineInto(rows, &out[len(out)-1]); err != nil {
			return nil, fmt.Errorf("list machines: %w", classify(err))
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list machines: %w", classify(err))
	}
	return out, nil
}

// UpdateMachine writes ch to machine id if, in the same statement, the row
// still meets cond; it returns the machine as written. A machine that does
// not meet cond is left alone and the error is ErrConflict (with what the
// row holds now); a missing machine is ErrNotFound.
func (s *Store) UpdateMachine(ctx context.Context, id string, cond MachineCondition, ch MachineChanges) (Machine, error) {
	return s.updateMachine(ctx, id, cond, ch, true)
}

// ChangeMachine is UpdateMachine for a caller that does not need the machine
// back, such as a driver's step: the same write, the same errors, and one
// statement when the row meets cond, where UpdateMachine reads the row
// again to return it.
func (s *Store) ChangeMachine(ctx context.Context, id string, cond MachineCondition, ch MachineChanges) error {
	_, err := s.updateMachine(ctx, id, cond, ch, false)
	return err
}

// updateMachine is UpdateMachine; without readBack it reads the row only
// when the write missed, to say why, and returns no machine.
func (s *Store) updateMachine(ctx context.Context, id string, cond MachineCondition, ch MachineChanges, readBack bool) (Machine, error) {
	// Written out: every step of the simulator changes a machine.
	set := "update_time = ?"
	args := []any{s.stamp()}
	add := func(col string, v any) {
		set += ", " + col + " = ?"
		args = append(args, v)
	}
	if ch.ClusterID != nil {
		add("cluster_id", *ch.ClusterID)
	}
	if ch.Role != nil {
		add("role", *ch.Role)
	}
	if ch.Power != nil {
		add("power", *ch.Power)
	}
	if ch.Joined != nil {
		add("joined", *ch.Joined)
	}
	if ch.Cordoned != nil {
		add("cordoned", *ch.Cordoned)
	}
	if ch.KubernetesVersion != nil {
		add("kubernetes_version", *ch.KubernetesVersion)
	}
	if ch.AttachedISO != nil {
		add("attached_iso", *ch.AttachedISO)
	}
	if ch.Offering != nil {
		add("offering", *ch.Offering)
	}
	where := "id = ?"
	args = append(args, id)
	if n := len(cond.ClusterIDs); n > 0 {
		where += " AND cluster_id IN (?" + strings.Repeat(", ?", n-1) + ")"
		for _, c := range cond.ClusterIDs {
			args = append(args, c)
		}
	}
	if cond.Role != "" {
		where += " AND role = ?"
		args = append(args, cond.Role)
	}
	if cond.Power != "" {
		where += " AND power = ?"
		args = append(args, cond.Power)
	}

	var out Machine
	err := s.transaction(ctx, func(tx *gorm.DB) error {
		n, err := execDirect(tx, "UPDATE machines SET "+set+" WHERE "+where, args...)
		if err != nil {
			return fmt.Errorf("update machine %s: %w", id, classify(err))
		}
		if n == 1 && !readBack {
			return nil
		}
		m, err := s.getMachine(tx, id)
		if err != nil {
			return err
		}
		if n != 1 {
			return fmt.Errorf("machine %s is %s, not %s: %w", id, describeMachine(m), cond, ErrConflict)
		}
		out = m
		return nil
	})
	if err != nil {
		return Machine{}, err
	}
	return out, nil
}

// String prints a condition for error messages.
func (c MachineCondition) String() string {
	var parts []string
	if len(c.ClusterIDs) > 0 {
		names := make([]string, len(c.ClusterIDs))
		for i, id := range c.ClusterIDs {
			names[i] = clusterOrFree(id)
		}
		parts = append(parts, "in "+strings.Join(names, " or "))
	}
	if c.Role != "" {
		parts = append(parts, c.Role)
	}
	if c.Power != "" {
		parts = append(parts, c.Power)
	}
	if len(parts) == 0 {
		return "anything"
	}
	return strings.Join(parts, ", ")
}

func describeMachine(m Machine) string {
	return fmt.Sprintf("in %s, %s, %s", clusterOrFree(m.ClusterID), m.Role, m.Power)
}

func clusterOrFree(id string) string {
	if id == "" {
		return "the free pool"
	}
	return "cluster " + id
}

// DeleteMachine deletes a machine and its network rules in one transaction.
// A machine that is already gone is deleted: destroying is idempotent.
func (s *Store) DeleteMachine(ctx context.Context, id string) error {
	err := s.transaction(ctx, func(tx *gorm.DB) error {
		if err := tx.Where("machine_id = ?", id).Delete(&networkRuleRow{}).Error; err != nil {
			return classify(err)
		}
		return classify(tx.Where("id = ?", id).Delete(&machineRow{}).Error)
	})
	if err != nil {
		return fmt.Errorf("delete machine %s: %w", id, err)
	}
	return nil
}

// ListNetworkRules returns a cluster's network rules ordered by machine,
// kind and port.
func (s *Store) ListNetworkRules(ctx context.Context, clusterID string) ([]NetworkRule, error) {
	var rows []networkRuleRow
	err := s.rdb.WithContext(ctx).Where("cluster_id = ?", clusterID).
		Order("machine_id, kind, port").Find(&rows).Error
	if err != nil {
		return nil, fmt.Errorf("list network rules of cluster %s: %w", clusterID, classify(err))
	}
	out := make([]NetworkRule, len(rows))
	for i, r := range rows {
		out[i] = NetworkRule{ClusterID: r.ClusterID, MachineID: r.MachineID, Kind: r.Kind, Port: r.Port}
	}
	return out, nil
}

// AddNetworkRules inserts the rules in one statement; rules that exist
// already are left as they are, so adding is idempotent.
func (s *Store) AddNetworkRules(ctx context.Context, rules []NetworkRule) error {
	if len(rules) == 0 {
		return nil
	}
	rows := make([]networkRuleRow, len(rules))
	for i, r := range rules {
		rows[i] = networkRuleRow{ClusterID: r.ClusterID, MachineID: r.MachineID, Kind: r.Kind, Port: r.Port}
	}
	err := s.retrying(ctx, func() error {
		return classify(s.db.WithContext(ctx).Clauses(clause.OnConflict{DoNothing: true}).Create(&rows).Error)
	})
	if err != nil {
		return fmt.Errorf("add %d network rules: %w", len(rules), err)
	}
	return nil
}

// DeleteNetworkRules deletes the rules in one transaction; rules that are
// gone already are deleted, so deleting is idempotent.
func (s *Store) DeleteNetworkRules(ctx context.Context, rules []NetworkRule) error {
	if len(rules) == 0 {
		return nil
	}
	err := s.transaction(ctx, func(tx *gorm.DB) error {
		for _, r := range rules {
			err := tx.Where("cluster_id = ? AND machine_id = ? AND kind = ? AND port = ?",
				r.ClusterID, r.MachineID, r.Kind, r.Port).Delete(&networkRuleRow{}).Error
			if err != nil {
				return classify(err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("delete %d network rules: %w", len(rules), err)
	}
	return nil
}
