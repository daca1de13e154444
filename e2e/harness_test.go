package e2e

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"github.com/go-sql-driver/mysql"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/repository/repotest"
)

// failOnOwnerLoss runs clusterd as before adoption existed: a running
// operation whose server dies or stops is failed and its cluster recovered
// (--on-owner-loss=fail). The tests of that recovery path run so; the
// default, resume, is tested in adopt_test.go.
var failOnOwnerLoss = []string{"--on-owner-loss", "fail"}

// Bounds of every wait: generous, so a loaded machine does not fail a test,
// yet finite, so a broken recovery fails instead of hanging.
const (
	rpcTimeout   = 10 * time.Second
	startTimeout = 20 * time.Second
	opTimeout    = 30 * time.Second
	pollEvery    = 20 * time.Millisecond
)

// newDatabase returns the DSN of a fresh MariaDB database, dropped when the
// test ends. Without MariaDB the test is skipped (repotest prints a banner),
// or fails when CI is set.
func newDatabase(t *testing.T) string {
	t.Helper()
	for _, b := range repotest.Backends(t) {
		if b.Name == "mysql" {
			return b.NewDSN(t)
		}
	}
	t.Skip("MariaDB is unreachable (see the banner above): the crash tests need a database shared by processes")
	return ""
}

// openSQL opens the test database directly, to write what only an older
// server or an operator would (legacy job rows, server rows).
func openSQL(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("parse DSN: %v", err)
	}
	cfg := mysql.NewConfig()
	cfg.Net, cfg.Addr = "tcp", u.Host
	cfg.User = u.User.Username()
	cfg.Passwd, _ = u.User.Password()
	cfg.DBName = strings.TrimPrefix(u.Path, "/")
	cfg.ParseTime = true
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatalf("open %s: %v", u.Host, err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// server is one clusterd process and gRPC clients connected to it.
type server struct {
	id      string
	args    []string
	cmd     *exec.Cmd
	exited  chan struct{}
	logPath string
	// logStart is the log's size when this process started: a process
	// restarted on the same log appends to it.
	logStart int64
	addr     string
	started  time.Time
	conn     *grpc.ClientConn
	clusters clv1.ClusterLifecycleClient
	sim      clv1.SimulatorClient
	ops      longrunningpb.OperationsClient
}

// startServer runs the clusterd binary on database dsn as server id, with
// --sim-step-delay 0 and the given flags (which may override it), and
// returns once its gRPC health check answers SERVING. The process is killed
// when the test ends, and its log printed if the test failed.
func startServer(t *testing.T, dsn, id string, flags ...string) *server {
	t.Helper()
	args := append([]string{"--database", dsn, "--server-id", id, "--sim-step-delay", "0"}, flags...)
	var last error
	for attempt := range 3 {
		s, err := launch(t, id, args, attempt)
		if err == nil {
			return s
		}
		last = err
		if !errors.Is(err, errBind) {
			break
		}
	}
	t.Fatalf("start clusterd %s: %v", id, last)
	return nil
}

// errBind: the ports picked were taken before the server bound them; retry.
var errBind = errors.New("address in use")

func launch(t *testing.T, id string, args []string, attempt int) (*server, error) {
	t.Helper()
	s, err := spawn(t, id, args, attempt)
	if err != nil {
		return nil, err
	}
	if err := s.waitServing(t, startTimeout); err != nil {
		return nil, err
	}
	return s, nil
}

// spawn starts the clusterd binary with args on free ports and connects
// clients to it, without waiting for it to serve.
func spawn(t *testing.T, id string, args []string, attempt int) (*server, error) {
	t.Helper()
	return spawnAt(t, id, args, freeAddr(t), freeAddr(t), filepath.Join(t.TempDir(), fmt.Sprintf("%s-%d.log", id, attempt)))
}

// spawnAt is spawn on given addresses, logging to logPath (appending, so a
// process restarted on the same addresses keeps one log).
func spawnAt(t *testing.T, id string, args []string, grpcAddr, httpAddr, logPath string) (*server, error) {
	t.Helper()
	return spawnBinaryAt(t, binary, id, args, grpcAddr, httpAddr, logPath)
}

// spawnBinaryAt is spawnAt with another clusterd binary (an older release's).
func spawnBinaryAt(t *testing.T, bin, id string, args []string, grpcAddr, httpAddr, logPath string) (*server, error) {
	t.Helper()
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	s := &server{id: id, args: args, exited: make(chan struct{}), logPath: logPath, addr: grpcAddr}
	if fi, err := logFile.Stat(); err == nil {
		s.logStart = fi.Size()
	}
	s.cmd = exec.Command(bin, append(slices.Clone(args), "--grpc-addr", grpcAddr, "--http-addr", httpAddr)...)
	s.cmd.Stdout, s.cmd.Stderr = logFile, logFile
	dieWithParent(s.cmd)
	s.started = time.Now()
	if err := s.cmd.Start(); err != nil {
		_ = logFile.Close()
		return nil, err
	}
	go func() {
		_ = s.cmd.Wait()
		_ = logFile.Close()
		close(s.exited)
	}()
	t.Cleanup(func() {
		s.kill9()
		if s.conn != nil {
			_ = s.conn.Close()
		}
		if t.Failed() {
			t.Logf("log of clusterd %s (%s, started %s):\n%s", id, strings.Join(args, " "), s.started.Format("15:04:05.000"), readLog(logPath))
		}
	})
	if err := s.dial(grpcAddr); err != nil {
		return nil, err
	}
	return s, nil
}

// dial connects the server's gRPC clients to grpcAddr.
func (s *server) dial(grpcAddr string) error {
	// A short reconnect backoff: the client is made before the server
	// listens, and gRPC's default (1s) would add a second to every measured
	// restart.
	backoffCfg := backoff.Config{BaseDelay: 10 * time.Millisecond, Multiplier: 1.6, MaxDelay: 100 * time.Millisecond}
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoffCfg, MinConnectTimeout: time.Second}))
	if err != nil {
		return err
	}
	s.conn = conn
	s.clusters = clv1.NewClusterLifecycleClient(conn)
	s.sim = clv1.NewSimulatorClient(conn)
	s.ops = longrunningpb.NewOperationsClient(conn)
	return nil
}

// waitServing waits until the process's health check answers SERVING; it
// fails (errBind for ports taken under it) if the process exits first.
func (s *server) waitServing(t *testing.T, timeout time.Duration) error {
	t.Helper()
	health := healthpb.NewHealthClient(s.conn)
	deadline := time.Now().Add(timeout)
	for {
		select {
		case <-s.exited:
			out := readLog(s.logPath)
			if strings.Contains(out, "address already in use") {
				return fmt.Errorf("%w: %s", errBind, out)
			}
			return fmt.Errorf("exited before serving (%v):\n%s", s.cmd.ProcessState, out)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		// The answer may come from another process that took the port
		// after it was picked (another test's server, on a busy machine):
		// this one has served only once it logged that it is ready, after
		// it bound its ports. Until then, it may still exit on the bind.
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING && s.loggedReady() {
			return nil
		}
		if time.Now().After(deadline) {
			s.kill9()
			return fmt.Errorf("not SERVING within %s (last: %v %v):\n%s", timeout, resp.GetStatus(), err, readLog(s.logPath))
		}
		time.Sleep(pollEvery)
	}
}

// loggedReady reports whether this process has logged "clusterd ready"
// (the ports it was given are its own from then on).
func (s *server) loggedReady() bool {
	f, err := os.Open(s.logPath)
	if err != nil {
		return false
	}
	defer f.Close()
	if _, err := f.Seek(s.logStart, io.SeekStart); err != nil {
		return false
	}
	out, err := io.ReadAll(f)
	return err == nil && bytes.Contains(out, []byte("clusterd ready"))
}

// freeAddr picks a port that is free now; launch retries if another process
// takes it before clusterd binds it.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("pick a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().String()
}

// stableAddr is a free loopback address for a process the test restarts on
// the same address (stablePort).
func stableAddr(t *testing.T) string {
	t.Helper()
	return fmt.Sprintf("127.0.0.1:%d", stablePort(t))
}

// stablePort picks a free loopback port between 28000 and the kernel's
// ephemeral range (ip_local_port_range, from 32768 by default), for a
// process the test restarts on the same port. A port of the ephemeral
// range, free while its process is down, may be taken by any process's
// outgoing connection or :0 listener (a chaos soak beside another make test
// lost a restart so: "bind: address already in use"); one below it only by
// a process that chose it. The Galera clusters of the tests and of make
// test keep below 28000 (galeraBases, scripts/test.sh).
func stablePort(t *testing.T) int {
	t.Helper()
	high := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil && n > 28100 {
				high = n
			}
		}
	}
	for range 500 {
		p := 28000 + rand.IntN(high-28000)
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue
		}
		_ = l.Close()
		return p
	}
	t.Fatalf("no free port from 28000 to %d", high)
	return 0
}

// readLog returns a process's log without the per-request lines of
// successful calls (the tests poll, so those would drown the rest).
func readLog(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if strings.Contains(l, `msg="finished call"`) && strings.Contains(l, "grpc.code=OK") {
			continue
		}
		lines = append(lines, l)
	}
	const keep = 300
	if len(lines) > keep {
		lines = append([]string{fmt.Sprintf("... %d earlier lines", len(lines)-keep)}, lines[len(lines)-keep:]...)
	}
	return strings.Join(lines, "\n")
}

// kill9 kills the process with SIGKILL, as a crash would, and waits for it.
func (s *server) kill9() {
	select {
	case <-s.exited:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.exited
}

// terminate stops the process gracefully (SIGTERM, as main handles it) and
// waits for it to exit, for at most timeout.
func (s *server) terminate(t *testing.T, timeout time.Duration) {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM clusterd %s: %v", s.id, err)
	}
	select {
	case <-s.exited:
		if code := s.cmd.ProcessState.ExitCode(); code != 0 {
			t.Errorf("clusterd %s exited with code %d after SIGTERM", s.id, code)
		}
	case <-time.After(timeout):
		s.kill9()
		t.Fatalf("clusterd %s did not exit within %s of SIGTERM", s.id, timeout)
	}
}

func rpcCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), rpcTimeout)
}

// spec is the cluster most tests use: one control node, two workers.
func spec(displayName string) *clv1.Cluster {
	return &clv1.Cluster{
		DisplayName: displayName, KubernetesVersion: "1.30.2",
		ControlNodeCount: 1, WorkerNodeCount: 2, ServiceOffering: "medium",
	}
}

// started checks that an RPC started an operation and returns its name.
func started(t *testing.T, what string, op *longrunningpb.Operation, err error) string {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return op.GetName()
}

// metadata decodes an operation's OperationMetadata.
func metadata(t *testing.T, op *longrunningpb.Operation) *clv1.OperationMetadata {
	t.Helper()
	md := &clv1.OperationMetadata{}
	if err := op.GetMetadata().UnmarshalTo(md); err != nil {
		t.Fatalf("operation %s metadata: %v", op.GetName(), err)
	}
	return md
}

// waitOp polls an operation until it is done.
func (s *server) waitOp(t *testing.T, name string) *longrunningpb.Operation {
	t.Helper()
	deadline := time.Now().Add(opTimeout)
	for {
		ctx, cancel := rpcCtx()
		op, err := s.ops.GetOperation(ctx, &longrunningpb.GetOperationRequest{Name: name})
		cancel()
		if err != nil {
			t.Fatalf("GetOperation %s: %v", name, err)
		}
		if op.GetDone() {
			return op
		}
		if time.Now().After(deadline) {
			t.Fatalf("operation %s not done within %s: %v", name, opTimeout, metadata(t, op))
		}
		time.Sleep(pollEvery)
	}
}

// succeed waits for an operation started by what and requires it to succeed.
func (s *server) succeed(t *testing.T, what string, op *longrunningpb.Operation, err error) *longrunningpb.Operation {
	t.Helper()
	done := s.waitOp(t, started(t, what, op, err))
	if e := done.GetError(); e != nil {
		t.Fatalf("%s (%s) failed: code %d: %s%s", what, done.GetName(), e.GetCode(), e.GetMessage(), lostJobHint(e.GetMessage()))
	}
	return done
}

// lostJobHint points at the known bug behind a live job failed by its own
// server, so that a test it trips on under load is not blamed.
func lostJobHint(msg string) string {
	if strings.Contains(msg, "could not be recorded") {
		return " (a live job failed by its own server: the bug TestServerKeepsItsOwnLiveJobs shows)"
	}
	return ""
}

// create creates a cluster, waits until it is RUNNING and returns it.
func (s *server) create(t *testing.T, displayName string) *clv1.Cluster {
	t.Helper()
	ctx, cancel := rpcCtx()
	defer cancel()
	op, err := s.clusters.CreateCluster(ctx, &clv1.CreateClusterRequest{Cluster: spec(displayName)})
	done := s.succeed(t, "create "+displayName, op, err)
	c := s.cluster(t, metadata(t, done).GetCluster())
	if c.GetState() != clv1.Cluster_RUNNING {
		t.Fatalf("created cluster %s is %s, want RUNNING", c.GetName(), c.GetState())
	}
	return c
}

func (s *server) cluster(t *testing.T, name string) *clv1.Cluster {
	t.Helper()
	ctx, cancel := rpcCtx()
	defer cancel()
	c, err := s.clusters.GetCluster(ctx, &clv1.GetClusterRequest{Name: name})
	if err != nil {
		t.Fatalf("GetCluster %s: %v", name, err)
	}
	return c
}

func (s *server) start(t *testing.T, name string) *longrunningpb.Operation {
	t.Helper()
	ctx, cancel := rpcCtx()
	defer cancel()
	op, err := s.clusters.StartCluster(ctx, &clv1.StartClusterRequest{Name: name})
	return s.succeed(t, "start "+name, op, err)
}

// startFromAlert starts a cluster that recovery left in ALERT. The
// scanner's reconciliation may take an ALERT cluster whose machines all run
// back to RUNNING itself (RECOVERING) at the same time: then the start is
// refused (ABORTED, naming the scanner's recovery, or, once RUNNING,
// FAILED_PRECONDITION), and the cluster ends RUNNING all the same.
func (s *server) startFromAlert(t *testing.T, name string) {
	t.Helper()
	for attempt := 0; ; attempt++ {
		ctx, cancel := rpcCtx()
		op, err := s.clusters.StartCluster(ctx, &clv1.StartClusterRequest{Name: name})
		cancel()
		if err == nil {
			s.succeed(t, "start "+name, op, nil)
			return
		}
		code, info := refusal(err)
		if info.GetReason() == "OPERATION_IN_PROGRESS" {
			ctx, cancel := rpcCtx()
			holder, gerr := s.ops.GetOperation(ctx, &longrunningpb.GetOperationRequest{Name: info.GetMetadata()["operation"]})
			cancel()
			if gerr != nil || metadata(t, holder).GetVerb() != "recover" {
				t.Fatalf("start %s refused: %v; the holder is not the scanner's recovery (%v)", name, err, gerr)
			}
		} else if code != codes.Aborted && code != codes.FailedPrecondition {
			t.Fatalf("start %s: %v", name, err)
		}
		c, _ := s.waitCluster(t, name, "released", opTimeout, released)
		if c.GetState() == clv1.Cluster_RUNNING {
			t.Logf("start %s refused (%s): reconciliation brought it back to RUNNING first", name, info.GetReason())
			return
		}
		if attempt == 3 {
			t.Fatalf("start %s: %v, and the cluster is %s", name, err, c.GetState())
		}
	}
}

func (s *server) stop(t *testing.T, name string) *longrunningpb.Operation {
	t.Helper()
	ctx, cancel := rpcCtx()
	defer cancel()
	op, err := s.clusters.StopCluster(ctx, &clv1.StopClusterRequest{Name: name})
	return s.succeed(t, "stop "+name, op, err)
}

// waitCluster polls a cluster until ok accepts it and returns it with the
// time it was first seen so.
func (s *server) waitCluster(t *testing.T, name, what string, timeout time.Duration, ok func(*clv1.Cluster) bool) (*clv1.Cluster, time.Time) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last *clv1.Cluster
	for {
		ctx, cancel := rpcCtx()
		c, err := s.clusters.GetCluster(ctx, &clv1.GetClusterRequest{Name: name})
		cancel()
		seen := time.Now()
		if err == nil {
			last = c
			if ok(c) {
				return c, seen
			}
		}
		if seen.After(deadline) {
			t.Fatalf("cluster %s not %s within %s; last seen %s (current operation %q), last error %v",
				name, what, timeout, last.GetState(), last.GetCurrentOperation(), err)
		}
		time.Sleep(pollEvery)
	}
}

// operationStates are the states an operation holds a cluster in (SPEC §1).
var operationStates = map[clv1.Cluster_State]bool{
	clv1.Cluster_CREATED: true, clv1.Cluster_STARTING: true, clv1.Cluster_STOPPING: true,
	clv1.Cluster_SCALING: true, clv1.Cluster_SCALING_STOPPED_CLUSTER: true, clv1.Cluster_UPGRADING: true,
	clv1.Cluster_IMPORTING: true, clv1.Cluster_REMOVING_NODES: true, clv1.Cluster_RECOVERING: true,
	clv1.Cluster_DESTROYING: true,
}

// released: out of every operation state, and held by no operation.
func released(c *clv1.Cluster) bool {
	return !operationStates[c.GetState()] && c.GetCurrentOperation() == ""
}

// waitRecovered waits until the cluster is released and returns it with the
// time from since to the first observation.
func (s *server) waitRecovered(t *testing.T, name string, since time.Time, timeout time.Duration) (*clv1.Cluster, time.Duration) {
	t.Helper()
	c, seen := s.waitCluster(t, name, "recovered (out of its operation state, no current operation)", timeout, released)
	return c, seen.Sub(since)
}

// hold injects a HOLD fault on step (for one cluster, or every cluster when
// cluster is empty) and returns the fault's name.
func (s *server) hold(t *testing.T, step, cluster string) string {
	t.Helper()
	return s.inject(t, &clv1.Fault{Step: step, Mode: clv1.Fault_HOLD, Cluster: cluster})
}

func (s *server) inject(t *testing.T, f *clv1.Fault) string {
	t.Helper()
	ctx, cancel := rpcCtx()
	defer cancel()
	got, err := s.sim.InjectFault(ctx, &clv1.InjectFaultRequest{Fault: f})
	if err != nil {
		t.Fatalf("InjectFault %v: %v", f, err)
	}
	return got.GetName()
}

func (s *server) release(t *testing.T, fault string) {
	t.Helper()
	ctx, cancel := rpcCtx()
	defer cancel()
	if _, err := s.sim.ReleaseHeld(ctx, &clv1.ReleaseHeldRequest{Fault: fault}); err != nil {
		t.Fatalf("ReleaseHeld %s: %v", fault, err)
	}
}

// waitHeld polls until a step is held that match accepts.
func (s *server) waitHeld(t *testing.T, what string, match func(*clv1.HeldStep) bool) *clv1.HeldStep {
	t.Helper()
	deadline := time.Now().Add(opTimeout)
	for {
		ctx, cancel := rpcCtx()
		resp, err := s.sim.ListHeld(ctx, &clv1.ListHeldRequest{})
		cancel()
		if err != nil {
			t.Fatalf("ListHeld: %v", err)
		}
		for _, h := range resp.GetHeld() {
			if match(h) {
				return h
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no step held for %s within %s; held: %v", what, opTimeout, resp.GetHeld())
		}
		time.Sleep(pollEvery)
	}
}

// heldStep matches a held step by name (and by cluster when given).
func heldStep(step, cluster string) func(*clv1.HeldStep) bool {
	return func(h *clv1.HeldStep) bool {
		return h.GetStep() == step && (cluster == "" || h.GetCluster() == cluster)
	}
}

func (s *server) machines(t *testing.T, cluster string) []*clv1.Machine {
	t.Helper()
	ctx, cancel := rpcCtx()
	defer cancel()
	resp, err := s.sim.ListMachines(ctx, &clv1.ListMachinesRequest{Cluster: cluster})
	if err != nil {
		t.Fatalf("ListMachines %s: %v", cluster, err)
	}
	return resp.GetMachines()
}

func (s *server) machine(t *testing.T, name string) *clv1.Machine {
	t.Helper()
	for _, m := range s.machines(t, "") {
		if m.GetName() == name {
			return m
		}
	}
	return nil
}

func (s *server) rules(t *testing.T, cluster string) []*clv1.NetworkRule {
	t.Helper()
	ctx, cancel := rpcCtx()
	defer cancel()
	resp, err := s.sim.ListNetworkRules(ctx, &clv1.ListNetworkRulesRequest{Cluster: cluster})
	if err != nil {
		t.Fatalf("ListNetworkRules %s: %v", cluster, err)
	}
	return resp.GetRules()
}

// events returns a cluster's whole history, oldest first.
func (s *server) events(t *testing.T, cluster string) []*clv1.ClusterEvent {
	t.Helper()
	var out []*clv1.ClusterEvent
	token := ""
	for {
		ctx, cancel := rpcCtx()
		resp, err := s.clusters.ListClusterEvents(ctx, &clv1.ListClusterEventsRequest{Parent: cluster, PageSize: 1000, PageToken: token})
		cancel()
		if err != nil {
			t.Fatalf("ListClusterEvents %s: %v", cluster, err)
		}
		out = append(out, resp.GetEvents()...)
		if token = resp.GetNextPageToken(); token == "" {
			return out
		}
	}
}

// setPower powers a machine on or off out of band.
func (s *server) setPower(t *testing.T, machine string, p clv1.Node_Power) {
	t.Helper()
	ctx, cancel := rpcCtx()
	defer cancel()
	if _, err := s.sim.SetMachinePower(ctx, &clv1.SetMachinePowerRequest{Name: machine, Power: p}); err != nil {
		t.Fatalf("SetMachinePower %s %s: %v", machine, p, err)
	}
}

// describeEvents renders a history for failure messages.
func describeEvents(evs []*clv1.ClusterEvent) string {
	var b strings.Builder
	for _, e := range evs {
		fmt.Fprintf(&b, "\n  %s -%s-> %s op=%s server=%s: %s", e.GetFromState(), e.GetEvent(), e.GetToState(), e.GetOperation(), e.GetServer(), e.GetMessage())
	}
	return b.String()
}

// operationError requires op to be done with an error whose message contains want.
func operationError(t *testing.T, op *longrunningpb.Operation, want, reason string) {
	t.Helper()
	if !op.GetDone() {
		t.Fatalf("interrupted operation %s is not done: %v", op.GetName(), metadata(t, op))
	}
	e := op.GetError()
	if e == nil {
		t.Fatalf("interrupted operation %s succeeded; want it failed with %q", op.GetName(), want)
	}
	if !strings.Contains(e.GetMessage(), want) {
		t.Fatalf("interrupted operation %s failed with %q (code %d); want a message containing %q", op.GetName(), e.GetMessage(), e.GetCode(), want)
	}
	var got string
	for _, d := range status.FromProto(e).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			got = info.GetReason()
		}
	}
	if got != reason {
		t.Errorf("interrupted operation %s failed with ErrorInfo reason %q; want %q", op.GetName(), got, reason)
	}
}

// converged checks what an interrupted operation may leave behind (SPEC
// §5.3): as many machines of each role as the spec says (no unjoined extra),
// no ISO attached, and exactly the network rules the machines need (ssh:22
// on each, api:6443 on control nodes).
func (s *server) converged(t *testing.T, c *clv1.Cluster) []*clv1.Machine {
	t.Helper()
	return s.convergedMissing(t, c, 0)
}

// convergedMissing is converged for an ALERT cluster whose interrupted
// operation left it missingWorkers workers short of its spec (the next
// start provisions them).
func (s *server) convergedMissing(t *testing.T, c *clv1.Cluster, missingWorkers int32) []*clv1.Machine {
	t.Helper()
	ms := s.machines(t, c.GetName())
	count := map[clv1.Node_Role]int32{}
	want := map[string]bool{}
	for _, m := range ms {
		count[m.GetRole()]++
		if m.GetAttachedIso() != "" {
			t.Errorf("%s of %s still has ISO %q attached", m.GetName(), c.GetName(), m.GetAttachedIso())
		}
		want[m.GetName()+" ssh:22"] = true
		if m.GetRole() == clv1.Node_CONTROL {
			want[m.GetName()+" api:6443"] = true
		}
	}
	if workers := c.GetWorkerNodeCount() - missingWorkers; count[clv1.Node_CONTROL] != c.GetControlNodeCount() || count[clv1.Node_WORKER] != workers || len(ms) != int(c.GetControlNodeCount()+workers) {
		t.Errorf("%s has %d control and %d worker machines (%d in all); its spec says %d and %d, and %d workers may be missing until the next start: %v",
			c.GetName(), count[clv1.Node_CONTROL], count[clv1.Node_WORKER], len(ms), c.GetControlNodeCount(), c.GetWorkerNodeCount(), missingWorkers, ms)
	}
	got := map[string]bool{}
	for _, r := range s.rules(t, c.GetName()) {
		k := fmt.Sprintf("%s %s:%d", r.GetMachine(), r.GetKind(), r.GetPort())
		if got[k] {
			t.Errorf("%s: rule %s twice", c.GetName(), k)
		}
		got[k] = true
	}
	for k := range want {
		if !got[k] {
			t.Errorf("%s: rule %s missing", c.GetName(), k)
		}
	}
	for k := range got {
		if !want[k] {
			t.Errorf("%s: rule %s left over (machine gone or not the cluster's)", c.GetName(), k)
		}
	}
	return ms
}

// healthy checks a RUNNING cluster: converged, every machine running and
// joined, none cordoned.
func (s *server) healthy(t *testing.T, c *clv1.Cluster) []*clv1.Machine {
	t.Helper()
	if c.GetState() != clv1.Cluster_RUNNING || c.GetCurrentOperation() != "" {
		t.Errorf("%s is %s held by %q, want RUNNING and held by nothing", c.GetName(), c.GetState(), c.GetCurrentOperation())
	}
	ms := s.converged(t, c)
	for _, m := range ms {
		if m.GetPower() != clv1.Node_RUNNING || !m.GetJoined() || m.GetCordoned() {
			t.Errorf("%s of RUNNING %s: power %s, joined %t, cordoned %t; want running, joined, not cordoned",
				m.GetName(), c.GetName(), m.GetPower(), m.GetJoined(), m.GetCordoned())
		}
	}
	return ms
}

// refusal is the code and google.rpc.ErrorInfo of a refused request.
func refusal(err error) (codes.Code, *errdetails.ErrorInfo) {
	st := status.Convert(err)
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return st.Code(), info
		}
	}
	return st.Code(), nil
}

// A server whose gRPC port another server took after it was picked is not
// taken for serving because the other one answers there: waitServing
// reports the bind error, on which startServer tries other ports.
func TestWaitServingIsNotFooledByAnotherServerOnItsPort(t *testing.T) {
	t.Parallel()
	dsn := newDatabase(t)
	a := startServer(t, dsn, "e2e-port-a")
	args := []string{"--database", dsn, "--server-id", "e2e-port-b", "--sim-step-delay", "0"}
	b, err := spawnAt(t, "e2e-port-b", args, a.addr, freeAddr(t), filepath.Join(t.TempDir(), "b.log"))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.waitServing(t, startTimeout); !errors.Is(err, errBind) {
		t.Fatalf("waiting for a server whose gRPC port another server holds: %v; want the bind error", err)
	}
}
