package service

import (
	"context"
	"errors"
	"fmt"

	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/secrets"
)

// SecretStore is the part of the repository a rotation of the secrets
// key uses.
type SecretStore interface {
	SecretsNotUnder(ctx context.Context, keyID string, after repository.SecretRef, limit int) ([]repository.Secret, error)
	ReplaceSecret(ctx context.Context, old, next repository.Secret) error
}

// RotationCounts is what a rotation did.
type RotationCounts struct {
	// Resealed rows are now under the current key.
	Resealed int
	// Skipped rows changed under the rotation (another rotation resealed
	// them, or their cluster was destroyed): nothing to do.
	Skipped int
	// Failed rows could not be opened (a key the key file no longer holds,
	// or a damaged row); they stay as they were.
	Failed int
}

// RotateSecrets seals again, under the keyring's current key, every
// cluster secret sealed under another one, batch rows at a time, each by a
// conditional write (ReplaceSecret: only if the row is still under the key
// it was read under). It is safe beside running servers (they read either
// key while the key file holds both) and beside another rotation, and a
// rotation cut short is finished by running it again. progress, when set,
// is called after each batch. A row that does not open is counted and
// left; the error says how many once the scan is done.
func RotateSecrets(ctx context.Context, store SecretStore, keys *secrets.Keyring, batch int, progress func(RotationCounts)) (RotationCounts, error) {
	var n RotationCounts
	if batch <= 0 {
		batch = 100
	}
	for after := (repository.SecretRef{}); ; {
		rows, err := store.SecretsNotUnder(ctx, keys.Current(), after, batch)
		if err != nil {
			return n, err
		}
		if len(rows) == 0 {
			break
		}
		for _, old := range rows {
			after = repository.SecretRef{ClusterID: old.ClusterID, Kind: old.Kind}
			aad := secrets.AAD(old.ClusterID, old.Kind)
			sealed, err := keys.Reseal(secrets.Sealed{KeyID: old.KeyID, Nonce: old.Nonce, Ciphertext: old.Ciphertext}, aad)
			if err != nil {
				n.Failed++
				continue
			}
			next := repository.Secret{ClusterID: old.ClusterID, Kind: old.Kind, KeyID: sealed.KeyID, Nonce: sealed.Nonce, Ciphertext: sealed.Ciphertext}
			switch err := store.ReplaceSecret(ctx, old, next); {
			case errors.Is(err, repository.ErrConflict):
				n.Skipped++
			case err != nil:
				return n, err
			default:
				n.Resealed++
			}
		}
		if progress != nil {
			progress(n)
		}
	}
	if n.Failed > 0 {
		return n, fmt.Errorf("%d secrets did not open with the key file's keys (%v); they are left as they were", n.Failed, keys.IDs())
	}
	return n, nil
}
