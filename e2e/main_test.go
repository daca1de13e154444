// Package e2e tests clusterd as its users and operators meet it: the real
// binary, started as a child process on MariaDB, driven over gRPC with the
// generated clients, killed with SIGKILL in the middle of its operations
// (held there by the simulator's HOLD faults) and started again. It checks
// what SPEC §4-§5 promise after a crash: every cluster leaves its operation
// state, the interrupted job is failed with a reason, the leftovers are
// repaired, and the next operation succeeds; and it reports how long
// recovery took.
package e2e

import (
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// binary is the clusterd built once for the whole package.
var binary string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	// The MySQL driver logs connections that a private MariaDB's restart
	// broke; the tests report what matters. Set before any test runs: the
	// logger is a global.
	_ = mysql.SetLogger(log.New(io.Discard, "", 0))
	dir, err := os.MkdirTemp("", "clusterd-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: temporary directory:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	binary = filepath.Join(dir, "clusterd")
	build := exec.Command(goTool(), "build", "-ldflags", stampFlags, "-o", binary, "github.com/clusterd/clusterd/cmd/clusterd")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: go build ./cmd/clusterd:", err)
		return 1
	}
	code := m.Run()
	printTimings()
	return code
}

// goTool is the go command: the one on PATH, else $GOROOT's.
func goTool() string {
	if path, err := exec.LookPath("go"); err == nil {
		return path
	}
	if root := os.Getenv("GOROOT"); root != "" {
		return filepath.Join(root, "bin", "go")
	}
	return "go"
}

// timing is one measured recovery.
type timing struct {
	name string
	d    time.Duration
}

var timings struct {
	sync.Mutex
	list []timing
}

// recordRecovery logs and keeps how long a recovery took, for the table
// printed at the end of the run.
func recordRecovery(t *testing.T, name string, d time.Duration) {
	t.Helper()
	t.Logf("recovery %s: %.2fs", name, d.Seconds())
	timings.Lock()
	timings.list = append(timings.list, timing{name, d})
	timings.Unlock()
}

func printTimings() {
	timings.Lock()
	defer timings.Unlock()
	if len(timings.list) == 0 {
		return
	}
	list := slices.Clone(timings.list)
	sort.SliceStable(list, func(i, j int) bool { return list[i].name < list[j].name })
	var b strings.Builder
	fmt.Fprintln(&b, "\nrecovery times (restart or peer death to cluster out of its operation state):")
	for _, tm := range list {
		fmt.Fprintf(&b, "  %-70s %6.2fs\n", tm.name, tm.d.Seconds())
	}
	fmt.Print(b.String())
}
