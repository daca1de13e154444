package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/repository/repotest"
	"github.com/clusterd/clusterd/secrets"
)

func keyLine(id string, b byte) string {
	return id + " " + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{b}, secrets.KeySize)) + "\n"
}

// TestRotateSecretsCommand: clusterd rotate-secrets reseals the rows under
// the old key with the new one, prints the counts, and finds nothing to do
// when run again.
func TestRotateSecretsCommand(t *testing.T) {
	dir := t.TempDir()
	dsn := "sqlite:" + filepath.Join(dir, "clusterd.db")
	ctx := context.Background()
	store, err := repository.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	repotest.SeedCatalog(t, store)
	old, err := secrets.ParseKeyFile([]byte(keyLine("k1", 1)))
	if err != nil {
		t.Fatal(err)
	}
	id := repository.NewClusterID()
	sealed, err := old.Seal([]byte("ca"), secrets.AAD(id, secrets.KindCA))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := store.CreateCluster(ctx, repository.NewCluster{ID: id, Account: "acme", DisplayName: "web",
		Spec:    repository.Spec{KubernetesVersion: "1.30.2", ControlNodeCount: 1, ServiceOffering: "medium"},
		Secrets: []repository.Secret{{ClusterID: id, Kind: secrets.KindCA, KeyID: sealed.KeyID, Nonce: sealed.Nonce, Ciphertext: sealed.Ciphertext}}},
		repository.NewJob{Kind: "create", ServerID: "s1", Deadline: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	_ = store.Close()
	keys := filepath.Join(dir, "keys")
	if err := os.WriteFile(keys, []byte(keyLine("k2", 2)+keyLine("k1", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	env := func(name string) string {
		return map[string]string{"CLUSTERD_DATABASE": dsn}[name]
	}
	for i, want := range []string{"resealed 1, skipped 0", "resealed 0, skipped 0"} {
		var out, stderr bytes.Buffer
		if err := rotateSecrets(ctx, []string{"--secrets-key-file", keys}, env, &out, &stderr); err != nil {
			t.Fatalf("run %d: %v %s", i, err, stderr.String())
		}
		if !strings.Contains(out.String(), want) {
			t.Errorf("run %d printed %q; want %q", i, out.String(), want)
		}
	}
	if err := os.Chmod(keys, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := rotateSecrets(ctx, []string{"--secrets-key-file", keys}, env, &bytes.Buffer{}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "others at the keys") {
		t.Errorf("a world-readable key file: %v; want a refusal", err)
	}
}

// TestIdentitiesNeedASecretsKeyFile: a server with identities and no
// --secrets-key-file does not start, and says why.
func TestIdentitiesNeedASecretsKeyFile(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte("sha256:"+strings.Repeat("ab", 32)+" team-a user\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	err := run([]string{"--database", "sqlite:" + filepath.Join(dir, "c.db"), "--auth-tokens", tokens, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"},
		func(string) string { return "" }, &stderr)
	if err == nil || !strings.Contains(err.Error(), "--secrets-key-file is required") {
		t.Fatalf("start with identities and no key file: %v", err)
	}
	if _, serr := os.Stat(filepath.Join(dir, "c.db")); serr == nil {
		t.Error("the database was opened before the key file was checked")
	}
}
