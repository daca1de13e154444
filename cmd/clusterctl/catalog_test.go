package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/server"
)

// TestCatalogCommands: versions and offerings list for every caller and
// change for admins only; a version in use cannot be deleted; upgrade
// targets and shell completion come from the server.
func TestCatalogCommands(t *testing.T) {
	tokens := filepath.Join(t.TempDir(), "tokens")
	line := func(token, account, role string) string {
		sum := sha256.Sum256([]byte(token))
		return fmt.Sprintf("sha256:%s %s %s\n", hex.EncodeToString(sum[:]), account, role)
	}
	if err := os.WriteFile(tokens, []byte(line("admin-token", "ops", "admin")+line("team-a-token", "team-a", "user")), 0o600); err != nil {
		t.Fatal(err)
	}
	secretsKey := filepath.Join(t.TempDir(), "secrets.key")
	if err := os.WriteFile(secretsKey, []byte("k1 AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := serve(t, func(c *server.Config) { c.AuthTokens, c.SecretsKeyFile = tokens, secretsKey })
	admin := map[string]string{"CLUSTERCTL_SERVER": addr, "CLUSTERCTL_TOKEN": "admin-token"}
	user := map[string]string{"CLUSTERCTL_SERVER": addr, "CLUSTERCTL_TOKEN": "team-a-token"}

	// Every caller reads the catalog the flags seeded.
	if r := ok(t, user, "versions"); !regexp.MustCompile(`(?m)^1\.30\.2\s+ENABLED\s+2\s+2048\s+-$`).MatchString(r.stdout) {
		t.Errorf("versions =\n%s", r.stdout)
	}
	if r := ok(t, user, "offerings"); !regexp.MustCompile(`(?m)^medium\s+ENABLED\s+2\s+2048\s+-$`).MatchString(r.stdout) {
		t.Errorf("offerings =\n%s", r.stdout)
	}
	// Only admins write.
	refused(t, user, 1, "(ADMIN_REQUIRED)", "versions", "create", "1.32.0")
	refused(t, user, 1, "(ADMIN_REQUIRED)", "offerings", "update", "small", "--state", "DISABLED")
	r := ok(t, admin, "versions", "create", "1.32.0", "--min-cpus", "4", "--min-memory-mb", "8192", "-o", "json")
	var v clv1.KubernetesVersion
	if err := protojson.Unmarshal([]byte(r.stdout), &v); err != nil || v.GetName() != "kubernetesVersions/1.32.0" || v.GetMinCpus() != 4 || v.GetState() != clv1.CatalogState_ENABLED {
		t.Errorf("versions create -o json = %s (%v)", r.stdout, err)
	}
	ok(t, admin, "offerings", "create", "huge", "--cpus", "16", "--memory-mb", "65536", "--description", "big nodes")
	if r := ok(t, admin, "offerings", "update", "huge", "--state", "DISABLED"); !regexp.MustCompile(`(?m)^huge\s+DISABLED\s+16\s+65536\s+big nodes$`).MatchString(r.stdout) {
		t.Errorf("offerings update =\n%s", r.stdout)
	}
	refused(t, admin, 2, "nothing to change", "offerings", "update", "huge")

	// A cluster with its own control offering; its version cannot go.
	ok(t, user, "create", "web", "--kubernetes-version", "1.30.2", "--offering", "medium", "--control-offering", "large", "--wait")
	if r := ok(t, user, "get", "web"); !strings.Contains(r.stdout, "1 control (large) + 1 workers (medium)") {
		t.Errorf("get web =\n%s", r.stdout)
	}
	refused(t, admin, 1, "(CATALOG_ENTRY_IN_USE)", "versions", "delete", "1.30.2")
	refused(t, user, 1, "(CATALOG_ENTRY_UNUSABLE)", "create", "big", "--kubernetes-version", "1.30.2", "--offering", "huge")
	if r := ok(t, user, "versions", "--upgrades-for", "web"); strings.Count(r.stdout, "ENABLED") != 2 || !strings.Contains(r.stdout, "1.30.5") || !strings.Contains(r.stdout, "1.31.1") {
		t.Errorf("versions --upgrades-for web =\n%s\nwant 1.30.5 and 1.31.1", r.stdout)
	}
	if r := ok(t, admin, "versions", "delete", "1.28.9"); !strings.Contains(r.stdout, "Deleted kubernetesVersions/1.28.9.") {
		t.Errorf("versions delete = %q", r.stdout)
	}

	// Completion from the server: versions and offerings, the upgrade
	// targets of a cluster.
	if r := ok(t, user, "__complete", "create", "x", "--kubernetes-version", ""); !strings.Contains(r.stdout, "1.32.0\tENABLED") || strings.Contains(r.stdout, "1.28.9") {
		t.Errorf("completion of --kubernetes-version =\n%s", r.stdout)
	}
	if r := ok(t, user, "__complete", "scale", "web", "--offering", ""); !strings.Contains(r.stdout, "medium\t2 vCPU, 2048 MB, ENABLED") || strings.Contains(r.stdout, "huge") {
		t.Errorf("completion of --offering =\n%s", r.stdout)
	}
	if r := ok(t, user, "__complete", "upgrade", "web", ""); !strings.Contains(r.stdout, "1.30.5") || strings.Contains(r.stdout, "1.30.2\t") || strings.Contains(r.stdout, "1.32.0") {
		t.Errorf("completion of an upgrade's version =\n%s", r.stdout)
	}
	if r := ok(t, admin, "__complete", "offerings", "delete", ""); !strings.Contains(r.stdout, "huge\t16 vCPU, 65536 MB, DISABLED") {
		t.Errorf("completion of offerings delete =\n%s", r.stdout)
	}
}
