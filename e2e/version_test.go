package e2e

import (
	"os/exec"
	"regexp"
	"testing"
)

// stampFlags stamp the e2e binary as the Makefile stamps bin/clusterd, so
// that the test below checks the -ldflags wiring `make build` relies on.
const stampFlags = "-X github.com/clusterd/clusterd/version.version=v0.0.0-e2e -X github.com/clusterd/clusterd/version.commit=e2ecommit"

// TestVersion: `clusterd --version` prints the stamped version and commit
// and the Go version on stdout, and exits 0 without serving.
func TestVersion(t *testing.T) {
	out, err := exec.Command(binary, "--version").Output()
	if err != nil {
		t.Fatalf("clusterd --version: %v", err)
	}
	if !regexp.MustCompile(`^clusterd v0\.0\.0-e2e \(commit e2ecommit, go1\.\d+\S*\)\n$`).Match(out) {
		t.Errorf("clusterd --version = %q", out)
	}
}
