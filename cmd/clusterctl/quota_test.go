package main

import (
	"strings"
	"testing"
)

// TestQuotaCommands: quota shows used and limit per resource, quota set
// changes only the limits it names, and a create past a limit is refused
// with its reason.
func TestQuotaCommands(t *testing.T) {
	addr := serve(t)
	env := map[string]string{"CLUSTERCTL_SERVER": addr}
	r := ok(t, env, "quota")
	if !strings.Contains(r.stdout, "accounts/default/quota (limits: the server's default)") || !strings.Contains(r.stdout, "unlimited") {
		t.Errorf("quota printed:\n%s", r.stdout)
	}
	r = ok(t, env, "quota", "set", "default", "--clusters", "1", "--nodes", "10")
	if !strings.Contains(r.stdout, "set by an admin") {
		t.Errorf("quota set printed:\n%s", r.stdout)
	}
	ok(t, env, "create", "one", "--kubernetes-version", "1.30.2", "--workers", "1", "--offering", "medium", "--wait")
	refused(t, env, 1, "clusterctl: quota exceeded: accounts/default: clusters limit 1", "create", "two", "--kubernetes-version", "1.30.2", "--workers", "1", "--offering", "medium")
	r = refused(t, env, 1, "accounts/default: clusters limit 1: 1 in use, 1 requested", "create", "two", "--kubernetes-version", "1.30.2", "--workers", "1", "--offering", "medium")
	r = ok(t, env, "quota", "default")
	for _, want := range []string{"clusters   1     1", "nodes      2     10", "cpus       4     unlimited"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("quota printed:\n%s\nwant a line %q", r.stdout, want)
		}
	}
	ok(t, env, "quota", "set", "default", "--clusters", "unlimited")
	ok(t, env, "create", "two", "--kubernetes-version", "1.30.2", "--workers", "1", "--offering", "medium")
	refused(t, env, 2, "--nodes \"x\"", "quota", "set", "default", "--nodes", "x")
	refused(t, env, 2, "name at least one", "quota", "set", "default")
}
