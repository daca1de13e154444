package repository

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"gorm.io/gorm"
)

// CatalogState says whether new claims may take a catalog entry (a Kubernetes
// version or a service offering). A DISABLED entry keeps the clusters that
// use it; only new creates, upgrades and scales onto it are refused.
type CatalogState string

// Catalog entry states.
const (
	CatalogEnabled  CatalogState = "ENABLED"
	CatalogDisabled CatalogState = "DISABLED"
)

// KubernetesVersion is an installable Kubernetes version (x.y.z) and what a
// node needs to run it.
type KubernetesVersion struct {
	Version string
	State   CatalogState
	// MinCPUs and MinMemoryMB bound the offerings of the nodes that run it.
	MinCPUs     int32
	MinMemoryMB int32
	// BinariesISO names the ISO that installs it (the driver's default,
	// kubernetes-<version>.iso, when empty).
	BinariesISO string
	CreateTime  time.Time
	UpdateTime  time.Time
}

// ServiceOffering is a machine size nodes can have. Its size never changes
// once created (quota accounting counts clusters' sizes by offering name).
type ServiceOffering struct {
	Name        string
	CPUs        int32
	MemoryMB    int32
	Description string
	State       CatalogState
	CreateTime  time.Time
	UpdateTime  time.Time
}

// KubernetesVersionChanges are the fields UpdateKubernetesVersion may write;
// nil keeps a field.
type KubernetesVersionChanges struct {
	State       *CatalogState
	MinCPUs     *int32
	MinMemoryMB *int32
	BinariesISO *string
}

// ServiceOfferingChanges are the fields UpdateServiceOffering may write: an
// offering's size is not among them.
type ServiceOfferingChanges struct {
	State       *CatalogState
	Description *string
}

// Uses are the catalog entries a claim needs ENABLED and takes in its own
// transaction (see the package doc, "The catalog"): a create's version and
// offerings, an upgrade's target version, a scale's new offering. Empty
// fields take nothing.
type Uses struct {
	Version         string
	Offering        string
	ControlOffering string
}

// ErrUnusable: a claim needs a catalog entry that does not exist or is
// DISABLED. Nothing was written. Use errors.As with *UnusableError.
var ErrUnusable = errors.New("catalog entry not usable")

// ErrInUse: a catalog entry's delete was refused because a live cluster or a
// running job uses it. Nothing was written. Use errors.As with *InUseError.
var ErrInUse = errors.New("catalog entry in use")

// UnusableError names the catalog entry a claim could not take and why.
type UnusableError struct {
	// Kind is "kubernetes version" or "service offering".
	Kind string
	Name string
	// Missing is true when the entry does not exist, false when DISABLED.
	Missing bool
}

// Error says which entry and why.
func (e *UnusableError) Error() string {
	if e.Missing {
		return fmt.Sprintf("%s %q does not exist", e.Kind, e.Name)
	}
	return fmt.Sprintf("%s %q is disabled", e.Kind, e.Name)
}

// Unwrap makes errors.Is(err, ErrUnusable) true.
func (e *UnusableError) Unwrap() error { return ErrUnusable }

// InUseError names one user of a catalog entry whose delete was refused: a
// live cluster on it, or the cluster of a running job moving onto it.
type InUseError struct {
	Kind        string
	Name        string
	ClusterID   string
	ClusterName string
	Account     string
	// Job is set when the user is a running job (an upgrade or a scale)
	// rather than the cluster's own spec.
	Job string
}

// Error names the user.
func (e *InUseError) Error() string {
	by := fmt.Sprintf("cluster %q (account %s, id %s)", e.ClusterName, e.Account, e.ClusterID)
	if e.Job != "" {
		by = fmt.Sprintf("operation %s of %s", e.Job, by)
	}
	return fmt.Sprintf("%s %q is in use by %s", e.Kind, e.Name, by)
}

// Unwrap makes errors.Is(err, ErrInUse) true.
func (e *InUseError) Unwrap() error { return ErrInUse }

const (
	kindVersion  = "kubernetes version"
	kindOffering = "service offering"
	// maxCatalog bounds a catalog listing: catalogs are tens of entries.
	maxCatalog = 10000
)

type versionRow struct {
	Version     string `gorm:"primaryKey"`
	State       string
	MinCPUs     int32  `gorm:"column:min_cpus"`
	MinMemoryMB int32  `gorm:"column:min_memory_mb"`
	BinariesISO string `gorm:"column:binaries_iso"`
	Claims      int64
	CreateTime  time.Time
	UpdateTime  time.Time
}

func (versionRow) TableName() string { return "kubernetes_versions" }

func (r versionRow) toVersion() KubernetesVersion {
	return KubernetesVersion{Version: r.Version, State: CatalogState(r.State), MinCPUs: r.MinCPUs, MinMemoryMB: r.MinMemoryMB,
		BinariesISO: r.BinariesISO, CreateTime: r.CreateTime.UTC(), UpdateTime: r.UpdateTime.UTC()}
}

type offeringRow struct {
	Name        string `gorm:"primaryKey"`
	CPUs        int32  `gorm:"column:cpus"`
	MemoryMB    int32  `gorm:"column:memory_mb"`
	Description string
	State       string
	Claims      int64
	CreateTime  time.Time
	UpdateTime  time.Time
}

func (offeringRow) TableName() string { return "service_offerings" }

func (r offeringRow) toOffering() ServiceOffering {
	return ServiceOffering{Name: r.Name, CPUs: r.CPUs, MemoryMB: r.MemoryMB, Description: r.Description,
		State: CatalogState(r.State), CreateTime: r.CreateTime.UTC(), UpdateTime: r.UpdateTime.UTC()}
}

func checkState(st CatalogState) error {
	if st != CatalogEnabled && st != CatalogDisabled {
		return fmt.Errorf("catalog state %q: want %s or %s", st, CatalogEnabled, CatalogDisabled)
	}
	return nil
}

// CreateKubernetesVersion inserts a version; ErrAlreadyExists if it exists.
func (s *Store) CreateKubernetesVersion(ctx context.Context, v KubernetesVersion) (KubernetesVersion, error) {
	if err := checkState(v.State); err != nil {
		return KubernetesVersion{}, err
	}
	now := s.stamp()
	row := versionRow{Version: v.Version, State: string(v.State), MinCPUs: v.MinCPUs, MinMemoryMB: v.MinMemoryMB,
		BinariesISO: v.BinariesISO, CreateTime: now, UpdateTime: now}
	err := s.transaction(ctx, func(tx *gorm.DB) error { return tx.Create(&row).Error })
	if err != nil {
		return KubernetesVersion{}, fmt.Errorf("create %s %s: %w", kindVersion, v.Version, classify(err))
	}
	return row.toVersion(), nil
}

// GetKubernetesVersion reads one version; ErrNotFound if it does not exist.
func (s *Store) GetKubernetesVersion(ctx context.Context, version string) (KubernetesVersion, error) {
	var row versionRow
	err := s.rdb.WithContext(ctx).Where("version = ?", version).Take(&row).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return KubernetesVersion{}, fmt.Errorf("%s %s: %w", kindVersion, version, ErrNotFound)
	}
	if err != nil {
		return KubernetesVersion{}, fmt.Errorf("get %s %s: %w", kindVersion, version, classify(err))
	}
	return row.toVersion(), nil
}

// ListKubernetesVersions returns every version (a catalog is small; the
// service orders and pages it).
func (s *Store) ListKubernetesVersions(ctx context.Context) ([]KubernetesVersion, error) {
	var rows []versionRow
	if err := s.rdb.WithContext(ctx).Order("version").Limit(maxCatalog).Find(&rows).Error; err != nil {
		return nil, fmt.Errorf("list %ss: %w", kindVersion, classify(err))
	}
	out := make([]KubernetesVersion, len(rows))
	for i, r := range rows {
		out[i] = r.toVersion()
	}
	return out, nil
}

// UpdateKubernetesVersion writes the set fields of a version and returns it
// as written; ErrNotFound if it does not exist.
func (s *Store) UpdateKubernetesVersion(ctx context.Context, version string, ch KubernetesVersionChanges) (KubernetesVersion, error) {
	set := map[string]any{"update_time": s.stamp()}
	if ch.State != nil {
		if err := checkState(*ch.State); err != nil {
			return KubernetesVersion{}, err
		}
		set["state"] = string(*ch.State)
	}
	if ch.MinCPUs != nil {
		set["min_cpus"] = *ch.MinCPUs
	}
	if ch.MinMemoryMB != nil {
		set["min_memory_mb"] = *ch.MinMemoryMB
	}
	if ch.BinariesISO != nil {
		set["binaries_iso"] = *ch.BinariesISO
	}
	var row versionRow
	err := s.transaction(ctx, func(tx *gorm.DB) error {
		res := tx.Model(&versionRow{}).Where("version = ?", version).Updates(set)
		if res.Error != nil {
			return res.Error
		}
		if res.RowsAffected != 1 {
			return fmt.Errorf("%s %s: %w", kindVersion, version, ErrNotFound)
		}
		return tx.Where("version = ?", version).Take(&row).Error
	})
	if err != nil {
		return KubernetesVersion{}, fmt.Errorf("update %s %s: %w", kindVersion, version, classify(err))
	}
	return row.toVersion(), nil
}

// DeleteKubernetesVersion deletes a version no live cluster runs and no
// running job moves a cluster to; otherwise it returns an *InUseError naming
// one user. See the package doc, "The catalog".
func (s *Store) DeleteKubernetesVersion(ctx context.Context, version string) error {
	err := s.transaction(ctx, func(tx *gorm.DB) error {
		if err := s.takeForDelete(tx, "kubernetes_versions", "version", kindVersion, version); err != nil {
			return err
		}
		user, err := s.firstUser(tx, kindVersion, version,
			"SELECT id, display_name, account, '' FROM clusters WHERE kubernetes_version = ? AND alive = 1",
			"SELECT c.id, c.display_name, c.account, j.id FROM jobs j JOIN clusters c ON c.id = j.resource_id"+
				" WHERE j.target_version = ? AND j.status = ?", version)
		if err != nil {
			return err
		}
		if user != nil {
			return user
		}
		return tx.Exec("DELETE FROM kubernetes_versions WHERE version = ?", version).Error
	})
	if err != nil {
		return fmt.Errorf("delete %s %s: %w", kindVersion, version, classify(err))
	}
	return nil
}

// CreateServiceOffering inserts an offering; ErrAlreadyExists if it exists.
func (s *Store) CreateServiceOffering(ctx context.Context, o ServiceOffering) (ServiceOffering, error) {
	if err := checkState(o.State); err != nil {
		return ServiceOffering{}, err
	}
	now := s.stamp()
	row := offeringRow{Name: o.Name, CPUs: o.CPUs, MemoryMB: o.MemoryMB, Description: o.Description, State: string(o.State),
		CreateTime: now, UpdateTime: now}
	err := s.transaction(ctx, func(tx *gorm.DB) error { return tx.Create(&row).Error })
	if err != nil {
		return ServiceOffering{}, fmt.Errorf("create %s %s: %w", kindOffering, o.Name, classify(err))
	}
	return row.toOffering(), nil
}

// GetServiceOffering reads one offering; ErrNotFound if it does not exist.
func (s *Store) GetServiceOffering(ctx context.Context, name string) (ServiceOffering, error) {
	var row offeringRow
	err := s.rdb.WithContext(ctx).Where("name = ?", name).Take(&row).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return ServiceOffering{}, fmt.Errorf("%s %s: %w", kindOffering, name, ErrNotFound)
	}
	if err != nil {
		return ServiceOffering{}, fmt.Errorf("get %s %s: %w", kindOffering, name, classify(err))
	}
	return row.toOffering(), nil
}

// ListServiceOfferings returns every offering, by name.
func (s *Store) ListServiceOfferings(ctx context.Context) ([]ServiceOffering, error) {
	var rows []offeringRow
	if err := s.rdb.WithContext(ctx).Order("name").Limit(maxCatalog).Find(&rows).Error; err != nil {
		return nil, fmt.Errorf("list %ss: %w", kindOffering, classify(err))
	}
	out := make([]ServiceOffering, len(rows))
	for i, r := range rows {
		out[i] = r.toOffering()
	}
	return out, nil
}

// UpdateServiceOffering writes the state and description of an offering
// (its size never changes) and returns it as written; ErrNotFound if it does
// not exist.
func (s *Store) UpdateServiceOffering(ctx context.Context, name string, ch ServiceOfferingChanges) (ServiceOffering, error) {
	set := map[string]any{"update_time": s.stamp()}
	if ch.State != nil {
		if err := checkState(*ch.State); err != nil {
			return ServiceOffering{}, err
		}
		set["state"] = string(*ch.State)
	}
	if ch.Description != nil {
		set["description"] = *ch.Description
	}
	var row offeringRow
	err := s.transaction(ctx, func(tx *gorm.DB) error {
		res := tx.Model(&offeringRow{}).Where("name = ?", name).Updates(set)
		if res.Error != nil {
			return res.Error
		}
		if res.RowsAffected != 1 {
			return fmt.Errorf("%s %s: %w", kindOffering, name, ErrNotFound)
		}
		return tx.Where("name = ?", name).Take(&row).Error
	})
	if err != nil {
		return ServiceOffering{}, fmt.Errorf("update %s %s: %w", kindOffering, name, classify(err))
	}
	return row.toOffering(), nil
}

// DeleteServiceOffering deletes an offering no live cluster's workers or
// control nodes have and no running scale moves a cluster to; otherwise it
// returns an *InUseError naming one user. See the package doc, "The
// catalog".
func (s *Store) DeleteServiceOffering(ctx context.Context, name string) error {
	err := s.transaction(ctx, func(tx *gorm.DB) error {
		if err := s.takeForDelete(tx, "service_offerings", "name", kindOffering, name); err != nil {
			return err
		}
		user, err := s.firstUser(tx, kindOffering, name,
			"SELECT id, display_name, account, '' FROM clusters WHERE (service_offering = ? OR control_offering = ?) AND alive = 1",
			"SELECT c.id, c.display_name, c.account, j.id FROM jobs j JOIN clusters c ON c.id = j.resource_id"+
				" WHERE j.target_offering = ? AND j.status = ?", name)
		if err != nil {
			return err
		}
		if user != nil {
			return user
		}
		return tx.Exec("DELETE FROM service_offerings WHERE name = ?", name).Error
	})
	if err != nil {
		return fmt.Errorf("delete %s %s: %w", kindOffering, name, classify(err))
	}
	return nil
}

// takeForDelete is a delete's first statement: it writes the entry's row
// (claims = claims + 1, which a concurrent claim also writes), so the delete
// holds the row's lock before it looks for users, and on Galera its
// write-set conflicts with any claim's.
func (s *Store) takeForDelete(tx *gorm.DB, table, key, kind, name string) error {
	res := tx.Exec("UPDATE "+table+" SET claims = claims + 1, update_time = ? WHERE "+key+" = ?", s.stamp(), name)
	if res.Error != nil {
		return classify(res.Error)
	}
	if res.RowsAffected != 1 {
		return fmt.Errorf("%s %s: %w", kind, name, ErrNotFound)
	}
	return nil
}

// firstUser runs the two user queries of a delete (live clusters, then
// running jobs; the cluster query takes name once per '?') as locking reads,
// and returns the first user found, or nil.
func (s *Store) firstUser(tx *gorm.DB, kind, name, clustersQuery, jobsQuery string, arg string) (*InUseError, error) {
	lock := ""
	if s.backend == MySQL {
		// A locking read sees the latest committed rows, not the
		// transaction's snapshot.
		lock = " FOR UPDATE"
	}
	args := []any{arg}
	for range countPlaceholders(clustersQuery) - 1 {
		args = append(args, arg)
	}
	for _, q := range []struct {
		sql  string
		args []any
	}{{clustersQuery + " LIMIT 1" + lock, args}, {jobsQuery + " LIMIT 1" + lock, []any{arg, string(JobInProgress)}}} {
		rows, err := tx.Raw(q.sql, q.args...).Rows()
		if err != nil {
			return nil, classify(err)
		}
		u := &InUseError{Kind: kind, Name: name}
		found := rows.Next()
		if found {
			err = rows.Scan(&u.ClusterID, &u.ClusterName, &u.Account, &u.Job)
		}
		if cerr := rows.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = rows.Err()
		}
		if err != nil {
			return nil, classify(err)
		}
		if found {
			return u, nil
		}
	}
	return nil, nil
}

func countPlaceholders(q string) int {
	n := 0
	for _, r := range q {
		if r == '?' {
			n++
		}
	}
	return n
}

// use takes the catalog entries a claim needs, in the claim's transaction:
// one conditional write per entry (claims = claims + 1 where it is
// ENABLED), the version first, then the offerings by name, so two claims
// lock them in the same order. A write that matches no row is an
// *UnusableError saying whether the entry is missing or disabled.
func (s *Store) use(tx *gorm.DB, u Uses) error {
	now := s.stamp()
	if u.Version != "" {
		if err := s.take(tx, "kubernetes_versions", "version", kindVersion, u.Version, now); err != nil {
			return err
		}
	}
	offerings := []string{}
	for _, o := range []string{u.Offering, u.ControlOffering} {
		if o != "" && !slices.Contains(offerings, o) {
			offerings = append(offerings, o)
		}
	}
	slices.Sort(offerings)
	for _, o := range offerings {
		if err := s.take(tx, "service_offerings", "name", kindOffering, o, now); err != nil {
			return err
		}
	}
	return nil
}

func (s *Store) take(tx *gorm.DB, table, key, kind, name string, now time.Time) error {
	res := tx.Exec("UPDATE "+table+" SET claims = claims + 1 WHERE "+key+" = ? AND state = ?", name, string(CatalogEnabled))
	if res.Error != nil {
		return fmt.Errorf("take %s %s: %w", kind, name, classify(res.Error))
	}
	if res.RowsAffected == 1 {
		return nil
	}
	var n int64
	if err := tx.Table(table).Where(key+" = ?", name).Count(&n).Error; err != nil {
		return fmt.Errorf("read %s %s: %w", kind, name, classify(err))
	}
	return &UnusableError{Kind: kind, Name: name, Missing: n == 0}
}

// SeedCatalog fills an empty catalog: the versions when no version exists,
// the offerings when no offering exists (the --kubernetes-versions and
// --service-offerings flags). An entry that exists is kept as is (insert if
// absent), so servers that start together with the same flags all succeed
// and the catalog holds each entry once; once an admin has written a
// catalog, flags change nothing.
func (s *Store) SeedCatalog(ctx context.Context, versions []KubernetesVersion, offerings []ServiceOffering) error {
	ignore := "INSERT OR IGNORE"
	if s.backend == MySQL {
		ignore = "INSERT IGNORE"
	}
	now := s.stamp()
	err := s.transaction(ctx, func(tx *gorm.DB) error {
		var n int64
		if err := tx.Model(&versionRow{}).Count(&n).Error; err != nil {
			return err
		}
		for _, v := range versions {
			if n > 0 {
				break
			}
			if v.State == "" {
				v.State = CatalogEnabled
			}
			if err := tx.Exec(ignore+" INTO kubernetes_versions (version, state, min_cpus, min_memory_mb, binaries_iso, claims, create_time, update_time)"+
				" VALUES (?, ?, ?, ?, ?, 0, ?, ?)", v.Version, string(v.State), v.MinCPUs, v.MinMemoryMB, v.BinariesISO, now, now).Error; err != nil {
				return err
			}
		}
		if err := tx.Model(&offeringRow{}).Count(&n).Error; err != nil {
			return err
		}
		for _, o := range offerings {
			if n > 0 {
				break
			}
			if o.State == "" {
				o.State = CatalogEnabled
			}
			if err := tx.Exec(ignore+" INTO service_offerings (name, cpus, memory_mb, description, state, claims, create_time, update_time)"+
				" VALUES (?, ?, ?, ?, ?, 0, ?, ?)", o.Name, o.CPUs, o.MemoryMB, o.Description, string(o.State), now, now).Error; err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("seed catalog: %w", classify(err))
	}
	return nil
}
