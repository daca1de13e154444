package repository

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"
)

// Secret is one of a cluster's secrets as stored: sealed by the caller
// (package secrets) before it gets here, so the repository never holds a
// key in the clear. KeyID names the key that sealed it.
type Secret struct {
	ClusterID  string
	Kind       string
	KeyID      string
	Nonce      []byte
	Ciphertext []byte
	UpdateTime time.Time
}

// KubeconfigRead is the history entry of every read of a cluster's admin
// credentials (GetKubeconfig); its message names who read them.
const KubeconfigRead = "KUBECONFIG_READ"

type secretRow struct {
	ClusterID  string `gorm:"primaryKey"`
	Kind       string `gorm:"primaryKey"`
	KeyID      string
	Nonce      []byte
	Ciphertext []byte
	UpdateTime time.Time
}

func (secretRow) TableName() string { return "cluster_secrets" }

func (r *secretRow) toSecret() Secret {
	return Secret{ClusterID: r.ClusterID, Kind: r.Kind, KeyID: r.KeyID, Nonce: r.Nonce, Ciphertext: r.Ciphertext, UpdateTime: r.UpdateTime.UTC()}
}

// NewClusterID returns the id of a cluster about to be created: a caller
// that seals the cluster's secrets before CreateCluster binds them to it
// (NewCluster.ID, NewCluster.Secrets).
func NewClusterID() string {
	return uuid.Must(uuid.NewV7()).String()
}

// insertSecrets writes a new cluster's sealed secrets inside its create
// transaction: each must name the cluster.
func insertSecrets(tx *gorm.DB, clusterID string, ss []Secret, now time.Time) error {
	if len(ss) == 0 {
		return nil
	}
	rows := make([]secretRow, len(ss))
	for i, sec := range ss {
		if sec.ClusterID != clusterID {
			return fmt.Errorf("secret %s is for cluster %q, not %s", sec.Kind, sec.ClusterID, clusterID)
		}
		rows[i] = secretRow{ClusterID: clusterID, Kind: sec.Kind, KeyID: sec.KeyID, Nonce: sec.Nonce, Ciphertext: sec.Ciphertext, UpdateTime: now}
	}
	// One statement for all of them: the create is the hottest write.
	if err := tx.Create(&rows).Error; err != nil {
		return fmt.Errorf("insert secrets: %w", classify(err))
	}
	return nil
}

// deleteSecrets removes a cluster's secrets; the write that makes it
// DESTROYED calls it in its transaction, so a destroyed cluster keeps no
// credentials (its machines, and its CA's use, are gone).
func deleteSecrets(tx *gorm.DB, clusterID string) error {
	if err := tx.Exec("DELETE FROM cluster_secrets WHERE cluster_id = ?", clusterID).Error; err != nil {
		return fmt.Errorf("delete secrets of cluster %s: %w", clusterID, classify(err))
	}
	return nil
}

// ClusterSecrets returns a cluster's sealed secrets (none for a cluster
// made before they existed, or destroyed). With audit set, its history
// entry is written in the same transaction, first: a read that cannot be
// recorded returns nothing. The entry's state fields and time are the
// caller's as read; Server defaults to the Store's.
func (s *Store) ClusterSecrets(ctx context.Context, clusterID string, audit *Event) ([]Secret, error) {
	var rows []secretRow
	if audit == nil {
		// A read alone (a join's bootstrap) needs no transaction.
		if err := s.rdb.WithContext(ctx).Where("cluster_id = ?", clusterID).Order("kind").Find(&rows).Error; err != nil {
			return nil, fmt.Errorf("read secrets of cluster %s: %w", clusterID, classify(err))
		}
		return toSecrets(rows), nil
	}
	err := s.transaction(ctx, func(tx *gorm.DB) error {
		rows = nil
		{
			server := audit.Server
			if server == "" {
				server = s.server
			}
			ev := eventRow{
				ClusterID: clusterID, Time: s.stamp(), FromState: audit.From.String(), Event: audit.Name,
				ToState: audit.To.String(), Operation: audit.Operation, Server: server, Message: audit.Message,
			}
			if err := tx.Create(&ev).Error; err != nil {
				return fmt.Errorf("record %s: %w", audit.Name, classify(err))
			}
			if err := s.recordClusterChange(tx, clusterID, audit.Operation); err != nil {
				return err
			}
		}
		return classify(tx.Where("cluster_id = ?", clusterID).Order("kind").Find(&rows).Error)
	})
	if err != nil {
		return nil, fmt.Errorf("read secrets of cluster %s: %w", clusterID, err)
	}
	return toSecrets(rows), nil
}

func toSecrets(rows []secretRow) []Secret {
	out := make([]Secret, len(rows))
	for i := range rows {
		out[i] = rows[i].toSecret()
	}
	return out
}

// SecretRef names one secret row: where a scan of them resumes.
type SecretRef struct {
	ClusterID string
	Kind      string
}

// SecretsNotUnder returns up to limit secrets, in (cluster, kind) order
// after the row after (zero: from the first), that were not sealed under
// key keyID: what a rotation still has to seal again.
func (s *Store) SecretsNotUnder(ctx context.Context, keyID string, after SecretRef, limit int) ([]Secret, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("list secrets: limit %d must be positive", limit)
	}
	var rows []secretRow
	err := s.rdb.WithContext(ctx).
		Where("key_id <> ? AND (cluster_id > ? OR (cluster_id = ? AND kind > ?))", keyID, after.ClusterID, after.ClusterID, after.Kind).
		Order("cluster_id").Order("kind").Limit(limit).Find(&rows).Error
	if err != nil {
		return nil, fmt.Errorf("list secrets not under key %s: %w", keyID, classify(err))
	}
	out := make([]Secret, len(rows))
	for i := range rows {
		out[i] = rows[i].toSecret()
	}
	return out, nil
}

// ReplaceSecret writes next over the secret old read, on condition that
// the row is still sealed under old's key: two rotations running at once
// (or a rotation beside a destroy) never overwrite each other's writes. A
// row that has changed key or is gone is ErrConflict, and nothing is
// written.
func (s *Store) ReplaceSecret(ctx context.Context, old, next Secret) error {
	if old.ClusterID != next.ClusterID || old.Kind != next.Kind {
		return fmt.Errorf("replace secret %s/%s with %s/%s: not the same row", old.ClusterID, old.Kind, next.ClusterID, next.Kind)
	}
	var affected int64
	err := s.transaction(ctx, func(tx *gorm.DB) error {
		res := tx.Exec("UPDATE cluster_secrets SET key_id = ?, nonce = ?, ciphertext = ?, update_time = ? WHERE cluster_id = ? AND kind = ? AND key_id = ?",
			next.KeyID, next.Nonce, next.Ciphertext, s.stamp(), old.ClusterID, old.Kind, old.KeyID)
		affected = res.RowsAffected
		return classify(res.Error)
	})
	if err != nil {
		return fmt.Errorf("replace secret %s of cluster %s: %w", old.Kind, old.ClusterID, err)
	}
	if affected != 1 {
		return fmt.Errorf("replace secret %s of cluster %s: no longer under key %s: %w", old.Kind, old.ClusterID, old.KeyID, ErrConflict)
	}
	return nil
}
