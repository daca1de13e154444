package agent_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/clusterd/clusterd/agent"
)

// A join hands the node its cluster's CA: the agent stores the certificate
// (0644) and, for a control node, the key (0600) under its PKI folder.
func TestJoinStoresTheClusterCA(t *testing.T) {
	for _, tc := range []struct {
		name    string
		key     string
		wantKey bool
	}{{"control", "-----BEGIN EC PRIVATE KEY-----\nk\n", true}, {"worker", "", false}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "etc", "kubernetes", "pki")
			cfg := agent.Config{State: &agent.MemStore{}, ISO: &fakeISO{version: "1.30.2"}, Machine: "m-1", PKIDir: dir}
			resp := agent.Handle(cfg, agent.Request{ID: 1, Op: agent.OpJoin, Cluster: "c1", Version: "1.30.2",
				CACert: "-----BEGIN CERTIFICATE-----\nc\n", CAKey: tc.key})
			if !resp.OK {
				t.Fatalf("join: %s", resp.Error)
			}
			crt, err := os.Stat(filepath.Join(dir, "ca.crt"))
			if err != nil || crt.Mode().Perm() != 0o644 {
				t.Fatalf("ca.crt: %v, %v", crt, err)
			}
			key, err := os.Stat(filepath.Join(dir, "ca.key"))
			switch {
			case tc.wantKey && (err != nil || key.Mode().Perm() != 0o600):
				t.Fatalf("ca.key: %v, %v; want mode 0600", key, err)
			case !tc.wantKey && err == nil:
				t.Fatal("a worker's join stored the CA key")
			}
			if data, _ := os.ReadFile(filepath.Join(dir, "ca.crt")); string(data) != "-----BEGIN CERTIFICATE-----\nc\n" {
				t.Errorf("ca.crt holds %q", data)
			}
		})
	}
}
