package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRollingUpgrade upgrades clusterd as an operator would: three servers
// of the previous release (scripts/release.sh previous: the newest release
// of CHANGELOG.md before this commit, built from the repository's own
// history) run on one MariaDB database under the soak's load, and are
// replaced one at a time by this tree's binary (SIGTERM, exit 0, the new
// one started on the same address, so the same server id). The new
// servers migrate the schema while old ones still run on it. Every
// operation must succeed (a stopping server hands its operations off, and
// a peer of either release adopts them), the soak's invariants must hold
// (no cluster left in an operation state, the machines match the record),
// and at least one operation a previous-release server was running must be
// finished by a current one.
func TestRollingUpgrade(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the rolling upgrade builds the previous release")
	}
	root := repoRoot(t)
	out, err := exec.Command("bash", filepath.Join(root, "scripts", "release.sh"), "previous").CombinedOutput()
	if err != nil {
		skipOrFail(t, "no previous release to upgrade from: %v: %s", err, out)
	}
	commit := strings.TrimSpace(string(out))
	previous := buildRelease(t, root, commit)

	cfg, _ := chaosSettings(t)
	t.Parallel()
	cfg.duration = 40 * time.Second
	cfg.rolling = true
	cfg.onOwnerLoss = "resume"
	cfg.previous = previous
	// Slower steps than the soak's, so that every stopping server has
	// operations to hand off.
	cfg.flags = []string{"--heartbeat-interval", "300ms", "--peer-timeout", "3s", "--scan-interval", "500ms", "--reconcile-interval", "2s", "--sim-step-delay", "100ms"}
	c := newChaos(t, cfg)
	c.run()
	c.settle()
	c.check()
	c.report()

	for _, s := range c.slots {
		if s.previous || s.currentSince.IsZero() {
			t.Errorf("slot %d still runs the previous release after the rolling upgrade", s.i)
		}
	}
	handedOff, byCurrent := 0, 0
	for id, held := range c.previousHeld {
		var status, owner string
		var attempt int32
		var end *time.Time
		if err := c.raw.QueryRow("SELECT status, attempt, server_id, end_time FROM jobs WHERE id = ?", id).Scan(&status, &attempt, &owner, &end); err != nil {
			t.Errorf("job %s: %v", id, err)
			continue
		}
		if status != "SUCCEEDED" || attempt <= held.attempt {
			continue // check() reports a failed one
		}
		handedOff++
		for _, s := range c.slots {
			if c.serverID(s) == owner && end != nil && !s.currentSince.IsZero() && end.After(s.currentSince) {
				byCurrent++
			}
		}
	}
	t.Logf("rolling upgrade from %s: %d operations handed off by previous-release servers finished after adoption, %d of them by current-release servers", commit[:12], handedOff, byCurrent)
	if byCurrent == 0 {
		t.Errorf("no operation a previous-release server was running was finished by a current-release server (%d handed off)", handedOff)
	}
}

// buildRelease builds cmd/clusterd of commit from the repository's history
// (git archive, so the work tree is untouched) and returns the binary.
func buildRelease(t *testing.T, root, commit string) string {
	t.Helper()
	dir := t.TempDir()
	archive := exec.Command("sh", "-c", `git -C "$1" archive --format=tar "$2" | tar -x -C "$3"`, "sh", root, commit, dir)
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("git archive %s: %v\n%s", commit, err, out)
	}
	bin := filepath.Join(dir, "clusterd-previous")
	build := exec.Command(goTool(), "build", "-ldflags", "-X github.com/clusterd/clusterd/version.version=previous-release -X github.com/clusterd/clusterd/version.commit="+commit, "-o", bin, "./cmd/clusterd")
	build.Dir = dir
	build.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build clusterd of %s: %v\n%s", commit, err, out)
	}
	return bin
}
