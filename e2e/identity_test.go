package e2e

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/stats"
	"google.golang.org/protobuf/types/known/durationpb"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
)

// waitLog waits until the process's log contains want.
func (s *server) waitLog(t *testing.T, want string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if b, err := os.ReadFile(s.logPath); err == nil && strings.Contains(string(b), want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("clusterd %s did not log %q within %s:\n%s", s.id, want, timeout, readLog(s.logPath))
		}
		time.Sleep(pollEvery)
	}
}

// exitCode waits for the process to exit and returns its code.
func (s *server) exitCode(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-s.exited:
		return s.cmd.ProcessState.ExitCode()
	case <-time.After(timeout):
		t.Fatalf("clusterd %s still running after %s:\n%s", s.id, timeout, readLog(s.logPath))
		return 0
	}
}

// A second process under the server id of a live one refuses to start, with
// a message saying why and what to do, and exits non-zero; the live one
// keeps its id and serves on. (Before, the newcomer took the id, failed the
// other's jobs and recovered its clusters while the other kept serving.)
func TestDuplicateServerIDIsRefused(t *testing.T) {
	t.Parallel()
	dsn := newDatabase(t)
	flags := []string{"--heartbeat-interval", "200ms", "--reconcile-interval", "1h"}
	live := startServer(t, dsn, "e2e-dup", flags...)
	cluster := live.create(t, "dup").GetName()
	live.hold(t, "join_node", cluster)
	ctx, cancel := rpcCtx()
	resp, err := scaleTo(3)(ctx, live, &crashEnv{cluster: cluster})
	cancel()
	op := started(t, "scale up", resp, err)
	live.waitHeld(t, "join_node", heldStep("join_node", cluster))

	dup, err := spawn(t, "e2e-dup", append([]string{"--database", dsn, "--server-id", "e2e-dup", "--sim-step-delay", "0"}, flags...), 0)
	if err != nil {
		t.Fatal(err)
	}
	if code := dup.exitCode(t, 30*time.Second); code == 0 {
		t.Errorf("the duplicate exited 0; want non-zero")
	}
	out := readLog(dup.logPath)
	if !strings.Contains(out, `server id "e2e-dup" is in use by a live clusterd`) || !strings.Contains(out, "--server-id") {
		t.Errorf("the duplicate's output does not say why it refused to start:\n%s", out)
	}

	// The live server is untouched: SERVING (waited for, as health follows
	// the database and a busy machine can slow a ping; a server whose id was
	// taken would never be SERVING again), its operation still running.
	if err := live.waitServing(t, time.Minute); err != nil {
		t.Fatalf("the live server after the refused duplicate: %v; want SERVING", err)
	}
	ctx, cancel = rpcCtx()
	got, err := live.ops.GetOperation(ctx, &longrunningpb.GetOperationRequest{Name: op})
	cancel()
	if err != nil || got.GetDone() {
		t.Errorf("the live server's operation after the refused duplicate: done %t, %v; want still running", got.GetDone(), err)
	}
	if c := live.cluster(t, cluster); c.GetState() != clv1.Cluster_SCALING || c.GetCurrentOperation() != op {
		t.Errorf("%s is %s held by %q; want SCALING held by %s", cluster, c.GetState(), c.GetCurrentOperation(), op)
	}
}

// SIGTERM while a client waits on an operation whose step is held (with
// --on-owner-loss=fail; TestSIGTERMHandsOffToAPeer is the default): the wait
// is answered at once with the operation as it stands, the job stops at its
// held step and records its end, and the process exits 0, which it does only
// when the stop ended inside --shutdown-timeout (a stop that runs out of its
// budget exits 1). (Before, every such stop took the whole 15s, exited 1,
// and once left the job IN_PROGRESS: "sql: database is closed".) How long
// the stop took is logged, not asserted: the machine may be busy.
func TestSIGTERMAnswersOpenWaitsAndExitsZero(t *testing.T) {
	t.Parallel()
	dsn := newDatabase(t)
	s := startServer(t, dsn, "e2e-sigterm", append([]string{"--reconcile-interval", "1h"}, failOnOwnerLoss...)...)
	cluster := s.create(t, "sigterm").GetName()
	s.hold(t, "join_node", cluster)
	ctx, cancel := rpcCtx()
	resp, err := scaleTo(3)(ctx, s, &crashEnv{cluster: cluster})
	cancel()
	op := started(t, "scale up", resp, err)
	s.waitHeld(t, "join_node", heldStep("join_node", cluster))

	type answer struct {
		op  *longrunningpb.Operation
		err error
		at  time.Time
	}
	// A client of its own, that says when its request is on the wire.
	sent := &sentSignal{ch: make(chan struct{})}
	conn, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithStatsHandler(sent))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	answered := make(chan answer, 1)
	go func() {
		got, err := longrunningpb.NewOperationsClient(conn).WaitOperation(context.Background(), &longrunningpb.WaitOperationRequest{Name: op, Timeout: durationpb.New(time.Minute)})
		answered <- answer{got, err, time.Now()}
	}()
	select {
	case <-sent.ch:
	case a := <-answered:
		t.Fatalf("WaitOperation returned before SIGTERM: %v, %v", a.op, a.err)
	case <-time.After(rpcTimeout):
		t.Fatal("WaitOperation was never sent")
	}

	began := time.Now()
	s.terminate(t, 20*time.Second) // requires exit code 0
	took := time.Since(began)
	a := <-answered
	if a.err != nil || a.op.GetName() != op {
		t.Errorf("WaitOperation open at SIGTERM: %v, %v; want the operation as it stood", a.op.GetName(), a.err)
	}
	t.Logf("SIGTERM with a held step and an open wait: wait answered after %s, exit 0 after %s (--shutdown-timeout 15s)",
		a.at.Sub(began).Round(time.Millisecond), took.Round(time.Millisecond))

	db := openSQL(t, dsn)
	var status, jobErr string
	if err := db.QueryRow("SELECT status, error FROM jobs WHERE id = ?", strings.TrimPrefix(op, "operations/")).Scan(&status, &jobErr); err != nil {
		t.Fatal(err)
	}
	if status != "FAILED" || !strings.Contains(jobErr, "server shutting down") {
		t.Errorf("the held job after SIGTERM: %s %s; want FAILED, server shutting down", status, jobErr)
	}
	var state, holder string
	if err := db.QueryRow("SELECT state, current_operation FROM clusters WHERE id = ?", strings.TrimPrefix(cluster, "clusters/")).Scan(&state, &holder); err != nil {
		t.Fatal(err)
	}
	if holder != "" || state == "SCALING" {
		t.Errorf("cluster after SIGTERM: %s held by %q; want released", state, holder)
	}
	if out := readLog(s.logPath); strings.Contains(out, "database is closed") {
		t.Errorf("the store was closed under a job:\n%s", out)
	}
}

// sentSignal is a client stats handler that closes ch once a request
// message has been written to the connection.
type sentSignal struct {
	ch   chan struct{}
	once sync.Once
}

func (h *sentSignal) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context   { return ctx }
func (h *sentSignal) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (h *sentSignal) HandleConn(context.Context, stats.ConnStats)                       {}
func (h *sentSignal) HandleRPC(_ context.Context, s stats.RPCStats) {
	if _, ok := s.(*stats.OutPayload); ok {
		h.once.Do(func() { close(h.ch) })
	}
}
