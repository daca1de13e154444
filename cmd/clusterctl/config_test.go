package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/clusterd/clusterd/server"
)

// TestContexts: config set-context writes a 0600 file where XDG says (or
// CLUSTERCTL_CONFIG), use-context, get-contexts and current-context read
// it, and a command uses the current context's server, token file and CA,
// under the flags and their CLUSTERCTL_* twins.
func TestContexts(t *testing.T) {
	dir := t.TempDir()
	caFile, certFile, keyFile := writeTLS(t, dir)
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte(tokenLine("ops-token", "ops", "admin")), 0o600); err != nil {
		t.Fatal(err)
	}
	secretsKey := filepath.Join(dir, "secrets.key")
	if err := os.WriteFile(secretsKey, []byte("k1 AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	secure := serve(t, func(c *server.Config) {
		c.AuthTokens, c.TLSCert, c.TLSKey, c.SecretsKeyFile = tokens, certFile, keyFile, secretsKey
	})
	plain := serve(t)
	ok(t, map[string]string{"CLUSTERCTL_SERVER": plain}, "create", "local", "--kubernetes-version", "1.30.2", "--offering", "medium", "--wait")
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("ops-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	xdg := filepath.Join(dir, "xdg")
	env := map[string]string{"XDG_CONFIG_HOME": xdg, "HOME": filepath.Join(dir, "home")}
	file := filepath.Join(xdg, "clusterctl", "config")
	refused(t, env, 1, "no current context", "config", "current-context")

	// The first context set becomes the current one.
	ok(t, env, "config", "set-context", "prod", "--server", "https://"+secure, "--token-file", tokenFile, "--ca-file", caFile)
	ok(t, env, "config", "set-context", "dev", "--server", plain)
	if info, err := os.Stat(file); err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("config file %s: %v, %v; want mode 0600", file, info, err)
	}
	if r := ok(t, env, "config", "current-context"); r.stdout != "prod\n" {
		t.Errorf("current-context = %q; want prod", r.stdout)
	}
	r := ok(t, env, "config", "get-contexts")
	if !regexp.MustCompile(`(?m)^\*\s+prod\s+https://\S+\s+true\s+-\s+`+regexp.QuoteMeta(tokenFile)+`$`).MatchString(r.stdout) ||
		!regexp.MustCompile(`(?m)^\s+dev\s+127\.0\.0\.1:\d+\s+false\s+-\s+-$`).MatchString(r.stdout) {
		t.Errorf("get-contexts =\n%s", r.stdout)
	}

	// prod: TLS with its CA and its token file; nothing else given.
	if r := ok(t, env, "list"); strings.TrimSpace(r.stdout) != "No clusters." {
		t.Errorf("list in prod = %q", r.stdout)
	}
	// The twin beats the context, the flag beats the twin.
	if r := ok(t, map[string]string{"XDG_CONFIG_HOME": xdg, "CLUSTERCTL_CONTEXT": "dev"}, "list"); !strings.Contains(r.stdout, "local") {
		t.Errorf("CLUSTERCTL_CONTEXT=dev list = %q", r.stdout)
	}
	wrong := map[string]string{"XDG_CONFIG_HOME": xdg, "CLUSTERCTL_SERVER": "127.0.0.1:1"}
	refused(t, wrong, 1, "cannot reach clusterd at 127.0.0.1:1", "list", "--timeout", "5s")
	ok(t, wrong, "--server", "https://"+secure, "list")
	refused(t, map[string]string{"XDG_CONFIG_HOME": xdg, "CLUSTERCTL_TOKEN": "wrong"}, 1, "(CREDENTIALS_INVALID)", "list")
	ok(t, map[string]string{"XDG_CONFIG_HOME": xdg, "CLUSTERCTL_TOKEN": "wrong"}, "--token", "ops-token", "list")
	refused(t, env, 2, `no context "nosuch"`, "--context", "nosuch", "list")

	ok(t, env, "config", "use-context", "dev")
	if r := ok(t, env, "list"); !strings.Contains(r.stdout, "local") {
		t.Errorf("list in dev = %q", r.stdout)
	}
	refused(t, env, 2, `no context "nosuch"`, "config", "use-context", "nosuch")
	refused(t, env, 2, "never the token", "config", "set-context", "x", "--token", "t")
	refused(t, env, 2, "did you mean use-context?", "config", "use-contxt", "dev")

	// CLUSTERCTL_CONFIG names another file; the environment does not leak
	// into set-context.
	other := filepath.Join(dir, "other")
	ok(t, map[string]string{"CLUSTERCTL_CONFIG": other, "CLUSTERCTL_SERVER": "127.0.0.1:1"}, "config", "set-context", "x", "--account", "team-a")
	if data, err := os.ReadFile(other); err != nil || !strings.Contains(string(data), "account: team-a") || strings.Contains(string(data), "127.0.0.1:1") {
		t.Errorf("CLUSTERCTL_CONFIG file: %q, %v", data, err)
	}
	// A file that is not a configuration is said, not ignored.
	broken := filepath.Join(dir, "broken")
	if err := os.WriteFile(broken, []byte("contexts: [{nme: x}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	refused(t, map[string]string{"CLUSTERCTL_CONFIG": broken, "CLUSTERCTL_SERVER": plain}, 2, "read "+broken, "list")
	ok(t, env, "config", "delete-context", "dev")
	if r := ok(t, env, "config", "get-contexts", "-o", "name"); r.stdout != "prod\n" {
		t.Errorf("get-contexts -o name after delete = %q", r.stdout)
	}
}
