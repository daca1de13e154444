package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	grpcmd "google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
)

// connCounter counts the transport connections a client opens.
type connCounter struct{ begins atomic.Int32 }

func (c *connCounter) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context   { return ctx }
func (c *connCounter) HandleRPC(context.Context, stats.RPCStats)                         {}
func (c *connCounter) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (c *connCounter) HandleConn(_ context.Context, s stats.ConnStats) {
	if _, ok := s.(*stats.ConnBegin); ok {
		c.begins.Add(1)
	}
}

func tokenLine(token, account, role string) string {
	sum := sha256.Sum256([]byte(token))
	return fmt.Sprintf("sha256:%s %s %s\n", hex.EncodeToString(sum[:]), account, role)
}

// TestTokensReloadOnSIGHUP runs clusterd with --auth-tokens, rewrites the
// file and sends SIGHUP: the new token is accepted, the removed one refused,
// over the same connection (no reconnect), and health needed no token
// throughout (startServer waits for it).
func TestTokensReloadOnSIGHUP(t *testing.T) {
	t.Parallel()
	dsn := newDatabase(t)
	path := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(path, []byte(tokenLine("first-token", "team-a", "user")), 0o600); err != nil {
		t.Fatal(err)
	}
	keys := filepath.Join(t.TempDir(), "secrets.key")
	if err := os.WriteFile(keys, []byte("k1 "+base64.StdEncoding.EncodeToString(make([]byte, 32))+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startServer(t, dsn, "e2e-sighup", "--auth-tokens", path, "--secrets-key-file", keys)
	counter := &connCounter{}
	conn, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithStatsHandler(counter))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ops := longrunningpb.NewOperationsClient(conn)
	call := func(token string) codes.Code {
		ctx, cancel := rpcCtx()
		defer cancel()
		_, err := ops.ListOperations(grpcmd.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token), &longrunningpb.ListOperationsRequest{})
		return status.Code(err)
	}
	if got := call("first-token"); got != codes.OK {
		t.Fatalf("first token: %v", got)
	}
	if got := call("second-token"); got != codes.Unauthenticated {
		t.Fatalf("a token not yet in the file: %v; want UNAUTHENTICATED", got)
	}
	if err := os.WriteFile(path, []byte(tokenLine("second-token", "team-a", "user")), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(opTimeout)
	for call("second-token") != codes.OK {
		if time.Now().After(deadline) {
			t.Fatalf("the new token is not accepted %s after SIGHUP", opTimeout)
		}
		time.Sleep(pollEvery)
	}
	if got := call("first-token"); got != codes.Unauthenticated {
		t.Errorf("a token removed from the file: %v; want UNAUTHENTICATED", got)
	}
	if n := counter.begins.Load(); n != 1 {
		t.Errorf("the client opened %d connections; a reload must not drop them", n)
	}
	select {
	case <-s.exited:
		t.Fatal("clusterd exited on SIGHUP")
	default:
	}
	if log := readLog(s.logPath); !strings.Contains(log, "auth tokens loaded") {
		t.Errorf("no reload line in the log:\n%s", log)
	}
}
