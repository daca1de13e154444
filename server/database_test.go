package server

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// lockedBuffer is a log destination safe for concurrent writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A database that does not answer at start-up is waited for, up to
// DatabaseWait, with a log line per attempt, then New fails saying so.
func TestStartWaitsForTheDatabase(t *testing.T) {
	logs := &lockedBuffer{}
	began := time.Now()
	_, err := New(tctx(t), Config{
		// Nothing listens on port 1.
		Database: "mysql://u:p@127.0.0.1:1/db", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", ServerID: "s",
		DatabaseWait: 2 * time.Second, Logger: slog.New(slog.NewTextHandler(logs, nil)),
	})
	took := time.Since(began)
	if err == nil || !strings.Contains(err.Error(), "database not reachable after") {
		t.Fatalf("New on a database that never answers: %v; want it to give up saying so", err)
	}
	if took < 2*time.Second || took > 15*time.Second {
		t.Errorf("New gave up after %s; want about the 2s it was told to wait", took)
	}
	if n := strings.Count(logs.String(), "database not reachable yet; waiting"); n < 2 {
		t.Errorf("%d attempts logged; want one line per attempt:\n%s", n, logs)
	}
	// A DSN that cannot be right is not waited for.
	began = time.Now()
	if _, err := New(tctx(t), Config{Database: "mysql://u:p@127.0.0.1:1/", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", ServerID: "s"}); err == nil {
		t.Error("New accepted a DSN without a database name")
	}
	if took := time.Since(began); took > time.Second {
		t.Errorf("New waited %s on a DSN that cannot be right; want at once", took)
	}
}
