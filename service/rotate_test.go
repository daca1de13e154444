package service_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/repository/repotest"
	"github.com/clusterd/clusterd/secrets"
	"github.com/clusterd/clusterd/service"
)

func ring(t *testing.T, keys ...secrets.Key) *secrets.Keyring {
	t.Helper()
	k, err := secrets.NewKeyring(keys...)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// createSealed inserts a cluster whose two secrets are sealed by keys.
func createSealed(t *testing.T, s *repository.Store, name string, keys *secrets.Keyring) string {
	t.Helper()
	id := repository.NewClusterID()
	var ss []repository.Secret
	for _, kind := range []string{secrets.KindCA, secrets.KindAdmin} {
		sealed, err := keys.Seal([]byte("plain "+kind+" of "+name), secrets.AAD(id, kind))
		if err != nil {
			t.Fatal(err)
		}
		ss = append(ss, repository.Secret{ClusterID: id, Kind: kind, KeyID: sealed.KeyID, Nonce: sealed.Nonce, Ciphertext: sealed.Ciphertext})
	}
	if _, _, err := s.CreateCluster(context.Background(), repository.NewCluster{ID: id, Account: "acme", DisplayName: name, Secrets: ss,
		Spec: repository.Spec{KubernetesVersion: "1.30.2", ControlNodeCount: 1, ServiceOffering: "medium"}},
		repository.NewJob{Kind: "create", ServerID: "s1", Deadline: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	return id
}

func TestRotateSecrets(t *testing.T) {
	k1 := secrets.Key{ID: "k1", Bytes: bytes.Repeat([]byte{1}, 32)}
	k2 := secrets.Key{ID: "k2", Bytes: bytes.Repeat([]byte{2}, 32)}
	k0 := secrets.Key{ID: "k0", Bytes: bytes.Repeat([]byte{9}, 32)}
	for _, b := range repotest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			s := repotest.Open(t, b)
			ctx := context.Background()
			var ids []string
			for _, name := range []string{"a", "b", "c"} {
				ids = append(ids, createSealed(t, s, name, ring(t, k1)))
			}
			lost := createSealed(t, s, "lost", ring(t, k0)) // under a key the file no longer holds
			both := ring(t, k2, k1)

			// Cut short after its first batch: rows are resealed one by one.
			cut, cancel := context.WithCancel(ctx)
			n, err := service.RotateSecrets(cut, s, both, 1, func(service.RotationCounts) { cancel() })
			if err == nil || n.Resealed != 1 {
				t.Fatalf("interrupted rotation: %+v, %v; want 1 resealed and the cancellation", n, err)
			}
			n, err = service.RotateSecrets(ctx, s, both, 2, nil)
			if err == nil || n.Resealed != 5 || n.Failed != 2 {
				t.Fatalf("second run: %+v, %v; want the 5 rows left resealed and the 2 of the lost key failed", n, err)
			}
			n, err = service.RotateSecrets(ctx, s, both, 2, nil)
			if n.Resealed != 0 || n.Failed != 2 {
				t.Fatalf("third run: %+v, %v; want nothing left but the lost key's", n, err)
			}
			onlyNew := ring(t, k2)
			for _, id := range ids {
				rows, err := s.ClusterSecrets(ctx, id, nil)
				if err != nil || len(rows) != 2 {
					t.Fatalf("cluster %s: %d rows, %v", id, len(rows), err)
				}
				for _, r := range rows {
					if _, err := onlyNew.Open(secrets.Sealed{KeyID: r.KeyID, Nonce: r.Nonce, Ciphertext: r.Ciphertext}, secrets.AAD(id, r.Kind)); err != nil {
						t.Errorf("cluster %s %s after rotation: %v", id, r.Kind, err)
					}
				}
			}
			if rows, _ := s.ClusterSecrets(ctx, lost, nil); rows[0].KeyID != "k0" {
				t.Errorf("a row that did not open was rewritten: %+v", rows[0])
			}
		})
	}
}

// A rotation beside another one (or a destroy) skips the rows changed
// under it rather than overwrite them.
func TestRotateSecretsSkipsRowsChangedUnderIt(t *testing.T) {
	k1 := secrets.Key{ID: "k1", Bytes: bytes.Repeat([]byte{1}, 32)}
	k2 := secrets.Key{ID: "k2", Bytes: bytes.Repeat([]byte{2}, 32)}
	s := repotest.Open(t, repotest.Backends(t)[0])
	createSealed(t, s, "a", ring(t, k1))
	racer := racingStore{Store: s}
	n, err := service.RotateSecrets(context.Background(), &racer, ring(t, k2, k1), 10, nil)
	if err != nil || n.Resealed != 1 || n.Skipped != 1 {
		t.Fatalf("rotation beside another: %+v, %v; want 1 resealed, 1 skipped", n, err)
	}
}

// racingStore reseals the first row it is asked to replace behind the
// rotation's back, as a concurrent rotation would, just before the write.
type racingStore struct {
	*repository.Store
	raced bool
}

func (r *racingStore) ReplaceSecret(ctx context.Context, old, next repository.Secret) error {
	if !r.raced {
		r.raced = true
		other := next
		other.Nonce = append([]byte(nil), next.Nonce...)
		if err := r.Store.ReplaceSecret(ctx, old, other); err != nil {
			return err
		}
	}
	return r.Store.ReplaceSecret(ctx, old, next)
}
