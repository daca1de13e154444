package repository_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
)

func sealedFor(id string, kinds ...string) []repository.Secret {
	var out []repository.Secret
	for _, k := range kinds {
		out = append(out, repository.Secret{ClusterID: id, Kind: k, KeyID: "k1", Nonce: []byte("nonce-" + k), Ciphertext: []byte("sealed-" + k)})
	}
	return out
}

func createWithSecrets(t *testing.T, s *repository.Store, name string) (repository.Cluster, repository.Job) {
	t.Helper()
	id := repository.NewClusterID()
	c, j, err := s.CreateCluster(ctxT(t), repository.NewCluster{ID: id, Account: "acme", DisplayName: name, Spec: spec, Secrets: sealedFor(id, "admin", "ca")},
		repository.NewJob{Kind: "create", ServerID: "s1", Deadline: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatalf("CreateCluster(%s): %v", name, err)
	}
	return c, j
}

// A cluster's sealed secrets are written in its create transaction, read
// back with an audit entry in the history, and deleted with the write that
// makes it DESTROYED.
func TestClusterSecretsLiveAndDieWithTheCluster(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		ctx := ctxT(t)
		c, j := createWithSecrets(t, s, "web")
		got, err := s.ClusterSecrets(ctx, c.ID, &repository.Event{From: c.State, To: c.State, Name: repository.KubeconfigRead, Message: "kubeconfig read by alice"})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 2 || got[0].Kind != "admin" || got[1].Kind != "ca" || !bytes.Equal(got[1].Ciphertext, []byte("sealed-ca")) ||
			!bytes.Equal(got[1].Nonce, []byte("nonce-ca")) || got[1].KeyID != "k1" {
			t.Fatalf("ClusterSecrets = %+v", got)
		}
		evs, _ := s.ListEvents(ctx, c.ID, 0, 100)
		if last := evs[len(evs)-1]; last.Name != repository.KubeconfigRead || last.Message != "kubeconfig read by alice" {
			t.Fatalf("last history entry %+v; want the read", last)
		}
		finishRunning(t, s, c, j)
		c, _ = s.GetCluster(ctx, c.ID)
		d, _, err := s.Claim(ctx, repository.Transition{ClusterID: c.ID, Expect: c.Expect(), Event: lifecycle.DestroyRequested},
			repository.NewJob{Kind: "delete", ServerID: "s1", Deadline: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := s.ClusterSecrets(ctx, c.ID, nil); len(got) != 2 {
			t.Fatalf("secrets of a DESTROYING cluster: %d rows; want both still", len(got))
		}
		if _, err := s.Transition(ctx, repository.Transition{ClusterID: c.ID, Expect: d.Expect(), Event: lifecycle.OperationSucceeded}); err != nil {
			t.Fatal(err)
		}
		if got, err := s.ClusterSecrets(ctx, c.ID, nil); err != nil || len(got) != 0 {
			t.Fatalf("secrets of a DESTROYED cluster: %+v, %v; want none", got, err)
		}
	})
}

// Nothing half-written: a create whose secrets cannot be inserted leaves
// no cluster, job or secret behind.
func TestCreateClusterWithBadSecretsWritesNothing(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		ctx := ctxT(t)
		id := repository.NewClusterID()
		dup := append(sealedFor(id, "ca"), sealedFor(id, "ca")...)
		for name, ss := range map[string][]repository.Secret{"other cluster's": sealedFor("x", "ca"), "duplicate kind": dup} {
			if _, _, err := s.CreateCluster(ctx, repository.NewCluster{ID: id, Account: "acme", DisplayName: "web", Spec: spec, Secrets: ss},
				repository.NewJob{Kind: "create", ServerID: "s1", Deadline: time.Now().Add(time.Hour)}); err == nil {
				t.Fatalf("%s secrets: created", name)
			}
			if _, err := s.GetCluster(ctx, id); !errors.Is(err, repository.ErrNotFound) {
				t.Fatalf("%s secrets: the cluster exists (%v)", name, err)
			}
			if got, _ := s.ClusterSecrets(ctx, id, nil); len(got) != 0 {
				t.Fatalf("%s secrets: %d rows left", name, len(got))
			}
		}
	})
}

// A rotation lists the rows not under the current key batch by batch, and
// replaces each only if it is still under the key it read.
func TestSecretsRotationIsConditional(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		ctx := ctxT(t)
		a, _ := createWithSecrets(t, s, "a")
		b, _ := createWithSecrets(t, s, "b")
		var seen []repository.Secret
		for after := (repository.SecretRef{}); ; {
			page, err := s.SecretsNotUnder(ctx, "k2", after, 3)
			if err != nil {
				t.Fatal(err)
			}
			if len(page) == 0 {
				break
			}
			seen = append(seen, page...)
			last := page[len(page)-1]
			after = repository.SecretRef{ClusterID: last.ClusterID, Kind: last.Kind}
		}
		if len(seen) != 4 || seen[0].ClusterID != a.ID || seen[3].ClusterID != b.ID {
			t.Fatalf("rows not under k2: %+v; want 4, a's then b's", seen)
		}
		old := seen[0]
		next := repository.Secret{ClusterID: old.ClusterID, Kind: old.Kind, KeyID: "k2", Nonce: []byte("n2"), Ciphertext: []byte("c2")}
		if err := s.ReplaceSecret(ctx, old, next); err != nil {
			t.Fatal(err)
		}
		if err := s.ReplaceSecret(ctx, old, next); !errors.Is(err, repository.ErrConflict) {
			t.Fatalf("second replace of a row no longer under k1: %v; want ErrConflict", err)
		}
		left, err := s.SecretsNotUnder(ctx, "k2", repository.SecretRef{}, 10)
		if err != nil || len(left) != 3 {
			t.Fatalf("rows left to rotate: %d, %v; want 3", len(left), err)
		}
		got, _ := s.ClusterSecrets(ctx, a.ID, nil)
		if got[0].KeyID != "k2" || !bytes.Equal(got[0].Ciphertext, []byte("c2")) {
			t.Fatalf("replaced row reads %+v", got[0])
		}
	})
}
