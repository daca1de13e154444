package secrets_test

import (
	"bytes"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clusterd/clusterd/secrets"
)

func key(id string, b byte) secrets.Key {
	return secrets.Key{ID: id, Bytes: bytes.Repeat([]byte{b}, secrets.KeySize)}
}

func mustRing(t *testing.T, keys ...secrets.Key) *secrets.Keyring {
	t.Helper()
	k, err := secrets.NewKeyring(keys...)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestOpenRefusesWhatItMustRefuse(t *testing.T) {
	ring := mustRing(t, key("k1", 1))
	aad := secrets.AAD("c1", secrets.KindCA)
	plain := []byte("-----BEGIN EC PRIVATE KEY-----")
	sealed, err := ring.Seal(plain, aad)
	if err != nil {
		t.Fatal(err)
	}
	flip := func(b []byte, i int) []byte {
		c := append([]byte(nil), b...)
		c[i] ^= 1
		return c
	}
	tests := []struct {
		name string
		ring *secrets.Keyring
		s    secrets.Sealed
		aad  []byte
		want error
	}{
		{"as sealed", ring, sealed, aad, nil},
		{"unknown key id", ring, secrets.Sealed{KeyID: "k9", Nonce: sealed.Nonce, Ciphertext: sealed.Ciphertext}, aad, secrets.ErrUnknownKey},
		{"other key under the same id", mustRing(t, key("k1", 2)), sealed, aad, secrets.ErrOpen},
		{"tampered ciphertext", ring, secrets.Sealed{KeyID: "k1", Nonce: sealed.Nonce, Ciphertext: flip(sealed.Ciphertext, 0)}, aad, secrets.ErrOpen},
		{"tampered tag", ring, secrets.Sealed{KeyID: "k1", Nonce: sealed.Nonce, Ciphertext: flip(sealed.Ciphertext, len(sealed.Ciphertext)-1)}, aad, secrets.ErrOpen},
		{"tampered nonce", ring, secrets.Sealed{KeyID: "k1", Nonce: flip(sealed.Nonce, 3), Ciphertext: sealed.Ciphertext}, aad, secrets.ErrOpen},
		{"short nonce", ring, secrets.Sealed{KeyID: "k1", Nonce: sealed.Nonce[:4], Ciphertext: sealed.Ciphertext}, aad, secrets.ErrOpen},
		{"other cluster", ring, sealed, secrets.AAD("c2", secrets.KindCA), secrets.ErrOpen},
		{"other kind", ring, sealed, secrets.AAD("c1", secrets.KindAdmin), secrets.ErrOpen},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.ring.Open(tc.s, tc.aad)
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Fatalf("Open: error %v, want %v", err, tc.want)
			}
			if tc.want == nil && !bytes.Equal(got, plain) {
				t.Fatalf("Open = %q, want %q", got, plain)
			}
		})
	}
	if bytes.Contains(sealed.Ciphertext, plain) {
		t.Fatal("the ciphertext holds the plaintext")
	}
}

func TestRotation(t *testing.T) {
	old := mustRing(t, key("k1", 1))
	aad := secrets.AAD("c1", secrets.KindAdmin)
	sealed, err := old.Seal([]byte("secret"), aad)
	if err != nil {
		t.Fatal(err)
	}
	both := mustRing(t, key("k2", 2), key("k1", 1))
	if got, err := both.Open(sealed, aad); err != nil || string(got) != "secret" {
		t.Fatalf("the old key no longer reads: %q, %v", got, err)
	}
	again, err := both.Reseal(sealed, aad)
	if err != nil {
		t.Fatal(err)
	}
	if again.KeyID != "k2" || both.Current() != "k2" {
		t.Fatalf("resealed under %q, want k2", again.KeyID)
	}
	if got, err := mustRing(t, key("k2", 2)).Open(again, aad); err != nil || string(got) != "secret" {
		t.Fatalf("the new key alone does not read the resealed value: %q, %v", got, err)
	}
}

func TestKeyFile(t *testing.T) {
	b64 := func(b byte) string {
		return base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{b}, secrets.KeySize))
	}
	tests := []struct {
		name    string
		content string
		mode    os.FileMode
		current string
		wantErr string
	}{
		{"two keys, first current", "# comment\n\nk2 " + b64(2) + "\nk1 " + b64(1) + "\n", 0o600, "k2", ""},
		{"read-only owner", "k1 " + b64(1) + "\n", 0o400, "k1", ""},
		{"group readable", "k1 " + b64(1) + "\n", 0o640, "", "read the keys"},
		{"world readable", "k1 " + b64(1) + "\n", 0o604, "", "others at the keys"},
		{"empty", "# nothing\n", 0o600, "", "no key"},
		{"short key", "k1 " + base64.StdEncoding.EncodeToString([]byte("short")) + "\n", 0o600, "", "want 32"},
		{"not base64", "k1 !!!\n", 0o600, "", "not base64"},
		{"three fields", "k1 " + b64(1) + " extra\n", 0o600, "", "line 1"},
		{"duplicate id", "k1 " + b64(1) + "\nk1 " + b64(2) + "\n", 0o600, "", "twice"},
		{"bad id", "k/1 " + b64(1) + "\n", 0o600, "", "key id"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "keys")
			if err := os.WriteFile(path, []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(path, tc.mode); err != nil {
				t.Fatal(err)
			}
			k, err := secrets.LoadKeyFile(path)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("LoadKeyFile: error %v, want one saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if k.Current() != tc.current {
				t.Fatalf("current key %q, want %q", k.Current(), tc.current)
			}
		})
	}
}

func TestLoadOrCreateKeyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "clusterd.db.secrets-key")
	k, created, err := secrets.LoadOrCreateKeyFile(path, time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	if err != nil || !created {
		t.Fatalf("first call: created %v, error %v", created, err)
	}
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := info.Mode().Perm(); got != 0o600 {
		t.Fatalf("mode %04o, want 0600", got)
	}
	sealed, err := k.Seal([]byte("x"), nil)
	if err != nil {
		t.Fatal(err)
	}
	again, created, err := secrets.LoadOrCreateKeyFile(path, time.Now())
	if err != nil || created {
		t.Fatalf("second call: created %v, error %v", created, err)
	}
	if _, err := again.Open(sealed, nil); err != nil || again.Current() != "k20260102T030405Z" {
		t.Fatalf("the file read back is another key (%s): %v", again.Current(), err)
	}
}

func TestNewCredentials(t *testing.T) {
	now := time.Now()
	c, err := secrets.NewCredentials(now)
	if err != nil {
		t.Fatal(err)
	}
	parse := func(p []byte) *x509.Certificate {
		blk, _ := pem.Decode(p)
		if blk == nil {
			t.Fatalf("not PEM: %q", p)
		}
		cert, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		return cert
	}
	ca, admin := parse(c.CACert), parse(c.AdminCert)
	if !ca.IsCA {
		t.Error("the CA certificate is not a CA")
	}
	if admin.Subject.CommonName != "kubernetes-admin" || len(admin.Subject.Organization) != 1 || admin.Subject.Organization[0] != "system:masters" {
		t.Errorf("admin subject %v", admin.Subject)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	if _, err := admin.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, CurrentTime: now}); err != nil {
		t.Errorf("the admin certificate does not verify as a client certificate of the CA: %v", err)
	}
	for name, k := range map[string][]byte{"CA": c.CAKey, "admin": c.AdminKey} {
		blk, _ := pem.Decode(k)
		if blk == nil || !strings.Contains(blk.Type, "PRIVATE KEY") {
			t.Errorf("%s key is not a PEM private key", name)
			continue
		}
		if _, err := x509.ParseECPrivateKey(blk.Bytes); err != nil {
			t.Errorf("%s key: %v", name, err)
		}
	}
	cert, key, err := secrets.SplitBundle(secrets.Bundle(c.AdminCert, c.AdminKey))
	if err != nil || !bytes.Equal(cert, c.AdminCert) || !bytes.Equal(key, c.AdminKey) {
		t.Fatalf("SplitBundle(Bundle) does not give back what went in: %v", err)
	}
}

// TestLoadOrCreateKeyFileConcurrently: development servers starting at once
// (tests, or several on one machine) all get the one key file's key: none
// reads the file before its key is in it, and exactly one creates it.
func TestLoadOrCreateKeyFileConcurrently(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dev-secrets-key")
	const n = 32
	type result struct {
		k       *secrets.Keyring
		created bool
		err     error
	}
	results := make(chan result, n)
	start := make(chan struct{})
	for range n {
		go func() {
			<-start
			k, created, err := secrets.LoadOrCreateKeyFile(path, time.Now())
			results <- result{k, created, err}
		}()
	}
	close(start)
	var keys []*secrets.Keyring
	created := 0
	for range n {
		r := <-results
		if r.err != nil {
			t.Fatalf("LoadOrCreateKeyFile: %v", r.err)
		}
		if r.created {
			created++
		}
		keys = append(keys, r.k)
	}
	if created != 1 {
		t.Errorf("%d callers created the file, want 1", created)
	}
	sealed, err := keys[0].Seal([]byte("x"), nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		if _, err := k.Open(sealed, nil); err != nil {
			t.Errorf("caller %d has another key: %v", i, err)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".secrets-key-*")); len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
}
