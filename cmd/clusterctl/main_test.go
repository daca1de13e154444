package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/clusterd/clusterd/client"
	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/repository/repotest"
	"github.com/clusterd/clusterd/server"
)

// runMainEnv makes the test binary run clusterctl's main instead of the
// tests, so a test can start it as a child process in a pseudo-terminal.
const runMainEnv = "CLUSTERCTL_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

func tctx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// serve starts a real clusterd on SQLite and free ports, stopped at the end
// of the test, and returns its gRPC address.
func serve(t *testing.T, mutate ...func(*server.Config)) string {
	t.Helper()
	b := repotest.Backends(t)[0]
	cfg := server.Config{
		Database: b.NewDSN(t), GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", ServerID: "ctl-test",
		Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
		ScanInterval: time.Hour, ReconcileInterval: time.Hour,
	}
	for _, m := range mutate {
		m(&cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := server.New(ctx, cfg)
	if err != nil {
		cancel()
		t.Fatalf("server.New: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("server: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("server did not stop within 30s")
		}
	})
	return srv.GRPCAddr()
}

// result is one clusterctl run.
type result struct {
	code           int
	stdout, stderr string
}

// ctl runs clusterctl in-process with the environment env (its only one).
func ctl(t *testing.T, env map[string]string, args ...string) result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(tctx(t), args, func(k string) string { return env[k] }, strings.NewReader(""), &stdout, &stderr)
	return result{code, stdout.String(), stderr.String()}
}

// ok runs clusterctl and fails the test unless it exits 0.
func ok(t *testing.T, env map[string]string, args ...string) result {
	t.Helper()
	r := ctl(t, env, args...)
	if r.code != 0 {
		t.Fatalf("clusterctl %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r
}

// refused runs clusterctl and checks it exits with code, saying want on stderr.
func refused(t *testing.T, env map[string]string, code int, want string, args ...string) result {
	t.Helper()
	r := ctl(t, env, args...)
	if r.code != code || !strings.Contains(r.stderr, want) {
		t.Errorf("clusterctl %s: exit %d, stderr %q; want exit %d saying %q", strings.Join(args, " "), r.code, r.stderr, code, want)
	}
	return r
}

func clusterJSON(t *testing.T, out string) *clv1.Cluster {
	t.Helper()
	c := &clv1.Cluster{}
	if err := protojson.Unmarshal([]byte(out), c); err != nil {
		t.Fatalf("output is not a Cluster in JSON: %v\n%s", err, out)
	}
	return c
}

var operationPattern = regexp.MustCompile(`operations/[0-9a-f-]{36}`)

// sim is an admin client of the test server for the simulator: holds,
// releases and machines, which clusterctl does not drive.
func sim(t *testing.T, addr string) *client.Client {
	t.Helper()
	c, err := client.New(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// hold makes the next join_node of any cluster wait until released.
func hold(t *testing.T, c *client.Client) {
	t.Helper()
	if _, err := c.Simulator.InjectFault(tctx(t), &clv1.InjectFaultRequest{Fault: &clv1.Fault{Step: "join_node", Mode: clv1.Fault_HOLD}}); err != nil {
		t.Fatal(err)
	}
}

// waitHeld waits (bounded) until a step is held, so the operation is
// surely in progress.
func waitHeld(t *testing.T, c *client.Client) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := c.Simulator.ListHeld(tctx(t), &clv1.ListHeldRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.GetHeld()) > 0 {
			return
		}
		time.Sleep(10 * time.Millisecond) // sampling the simulator, not synchronising
	}
	t.Fatal("no step was held within 30s")
}

func release(t *testing.T, c *client.Client) {
	t.Helper()
	if _, err := c.Simulator.ClearFaults(tctx(t), &clv1.ClearFaultsRequest{}); err != nil {
		t.Fatal(err)
	}
}

// TestEveryCommandAgainstARealServer drives one cluster through every
// ClusterLifecycle and Operations command, as a person at a terminal would,
// checking what each prints and how it exits.
func TestEveryCommandAgainstARealServer(t *testing.T) {
	addr := serve(t)
	env := map[string]string{"CLUSTERCTL_SERVER": addr}
	s := sim(t, addr)

	// create --wait: progress as plain lines on stderr (not a terminal),
	// the cluster on stdout.
	r := ok(t, env, "create", "demo", "--kubernetes-version", "1.30.2", "--workers", "2", "--offering", "medium", "--wait")
	if !regexp.MustCompile(`(?m)^State:\s+RUNNING$`).MatchString(r.stdout) || !strings.Contains(r.stdout, "NODE") {
		t.Errorf("create --wait printed:\n%s", r.stdout)
	}
	if !regexp.MustCompile(`(?m)^operations/\S+ create: \w+ \(\d+/\d+ steps, \d+s\)$`).MatchString(r.stderr) ||
		!regexp.MustCompile(`(?m)^operations/\S+ create: succeeded after \d+s$`).MatchString(r.stderr) || strings.Contains(r.stderr, "\r") {
		t.Errorf("create --wait progress (not a terminal) = %q; want plain lines ending in succeeded", r.stderr)
	}

	c := clusterJSON(t, ok(t, env, "get", "demo", "-o", "json").stdout)
	if c.GetState() != clv1.Cluster_RUNNING || len(c.GetNodes()) != 3 || c.GetDisplayName() != "demo" {
		t.Errorf("get -o json = %v", c)
	}
	id := strings.TrimPrefix(c.GetName(), "clusters/")
	for _, ref := range []string{c.GetName(), id} {
		if got := clusterJSON(t, ok(t, env, "get", ref, "-o", "json").stdout); got.GetName() != c.GetName() {
			t.Errorf("get %s = %s", ref, got.GetName())
		}
	}
	if r := ok(t, env, "list"); !regexp.MustCompile(`(?m)^demo\s+clusters/\S+\s+default\s+RUNNING\s+1\.30\.2\s+1\+2\s+-\s+\d+s$`).MatchString(r.stdout) {
		t.Errorf("list =\n%s", r.stdout)
	}
	if r := ok(t, env, "list", "--filter", "state = STOPPED"); strings.TrimSpace(r.stdout) != "No clusters." {
		t.Errorf("list of STOPPED = %q", r.stdout)
	}

	// Refusals: one line with the reason, exit 1 (TestErrorsInTheCommandLinesWords has more).
	refused(t, env, 1, "clusterctl: invalid argument: NAME: must be a DNS label", "create", "Not_A_Label", "--kubernetes-version", "1.30.2", "--offering", "medium")
	refused(t, env, 1, "(NOT_FOUND)", "get", "nosuch")
	refused(t, env, 1, "not found", "get", "clusters/0192f0c1-7a3e-7000-8000-000000000000")

	// A scale held at join_node: a second operation is refused, the running
	// one is listed and shown, then followed to its end once released.
	hold(t, s)
	r = ok(t, env, "scale", "demo", "--workers", "3")
	scaleOp := operationPattern.FindString(r.stdout)
	if scaleOp == "" || !strings.Contains(r.stdout, "scale") || !strings.Contains(r.stdout, "running") {
		t.Fatalf("scale without --wait printed:\n%s", r.stdout)
	}
	waitHeld(t, s)
	refused(t, env, 1, "clusterctl: another operation is in progress on demo: "+scaleOp+"; please retry once it has finished (OPERATION_IN_PROGRESS)\n", "stop", "demo")
	if r := ok(t, env, "operations", "list", "--running"); !strings.Contains(r.stdout, scaleOp) || strings.Count(r.stdout, "operations/") != 1 {
		t.Errorf("operations list --running =\n%s\nwant only %s", r.stdout, scaleOp)
	}
	if r := ok(t, env, "operations", "get", scaleOp); !regexp.MustCompile(`scale\s+clusters/\S+\s+running\s+join_node\s+\d+/\d+`).MatchString(r.stdout) {
		t.Errorf("operations get of the held scale =\n%s", r.stdout)
	}
	release(t, s)
	if c := clusterJSON(t, ok(t, env, "operations", "wait", scaleOp, "-o", "json").stdout); c.GetWorkerNodeCount() != 3 || c.GetState() != clv1.Cluster_RUNNING {
		t.Errorf("after the scale: %v", c)
	}

	// Cancel: held again and cancelled, never released: the held step ends
	// at once. cancel --wait exits 0 since the cancel took effect, printing
	// the operation with its error; wait exits 1, since the operation failed.
	hold(t, s)
	scaleOp = operationPattern.FindString(ok(t, env, "scale", "demo", "--workers", "4").stdout)
	waitHeld(t, s)
	r = ok(t, env, "operations", "cancel", scaleOp, "--wait", "-o", "json")
	var cancelled longrunningpb.Operation
	if err := protojson.Unmarshal([]byte(r.stdout), &cancelled); err != nil {
		t.Fatalf("operations cancel --wait -o json printed %q: %v", r.stdout, err)
	}
	if cancelled.GetName() != scaleOp || !cancelled.GetDone() || cancelled.GetError().GetCode() != int32(codes.Canceled) {
		t.Errorf("operations cancel --wait -o json = %v; want %s done with error CANCELLED", &cancelled, scaleOp)
	}
	if held, err := s.Simulator.ListHeld(tctx(t), &clv1.ListHeldRequest{}); err != nil || len(held.GetHeld()) != 0 {
		t.Errorf("held after the cancel: %v, %v; want none (the cancel ended the held step)", held.GetHeld(), err)
	}
	release(t, s)
	if r := ok(t, env, "operations", "cancel", scaleOp, "--wait"); !regexp.MustCompile(`(?m)^Error: operation cancelled$`).MatchString(r.stdout) {
		t.Errorf("operations cancel --wait of the cancelled operation =\n%s\nwant it with its error", r.stdout)
	}
	refused(t, env, 1, "clusterctl: "+scaleOp+": operation cancelled\n", "operations", "wait", scaleOp)
	if r := ok(t, env, "operations", "list", "--cluster", "demo", "--filter", "verb = scale"); strings.Count(r.stdout, "operations/") != 2 || !strings.Contains(r.stdout, "cancelled") {
		t.Errorf("operations list of demo's scales =\n%s", r.stdout)
	}

	// The cancelled scale left the cluster ALERT; a start brings it back.
	if c := clusterJSON(t, ok(t, env, "get", "demo", "-o", "json").stdout); c.GetState() != clv1.Cluster_ALERT {
		t.Errorf("after the cancelled scale: %v; want ALERT", c.GetState())
	}
	ok(t, env, "start", "demo", "--wait")

	// Upgrade, add and remove a node, stop, start: each followed.
	if c := clusterJSON(t, ok(t, env, "upgrade", "demo", "1.30.5", "--wait", "-o", "json").stdout); c.GetKubernetesVersion() != "1.30.5" {
		t.Errorf("after upgrade: %v", c)
	}
	m, err := s.Simulator.CreateMachine(tctx(t), &clv1.CreateMachineRequest{Role: clv1.Node_EXTERNAL})
	if err != nil {
		t.Fatal(err)
	}
	before := len(clusterJSON(t, ok(t, env, "get", "demo", "-o", "json").stdout).GetNodes())
	if c := clusterJSON(t, ok(t, env, "add-nodes", "demo", strings.TrimPrefix(m.GetName(), "machines/"), "--wait", "-o", "json").stdout); len(c.GetNodes()) != before+1 {
		t.Errorf("after add-nodes: %d nodes; want %d", len(c.GetNodes()), before+1)
	}
	if c := clusterJSON(t, ok(t, env, "remove-nodes", "demo", m.GetName(), "-w", "-o", "json").stdout); len(c.GetNodes()) != before {
		t.Errorf("after remove-nodes: %d nodes; want %d", len(c.GetNodes()), before)
	}
	if c := clusterJSON(t, ok(t, env, "stop", "demo", "--wait", "-o", "json").stdout); c.GetState() != clv1.Cluster_STOPPED {
		t.Errorf("after stop: %v", c.GetState())
	}
	etag := clusterJSON(t, ok(t, env, "get", "demo", "-o", "json").stdout).GetEtag()
	refused(t, env, 1, "(ETAG_MISMATCH)", "start", "demo", "--etag", "0")
	ok(t, env, "start", "demo", "--etag", etag, "--wait")

	r = ok(t, env, "events", "demo")
	for _, want := range []string{"CLUSTER_CREATED", "SCALE_UP_REQUESTED", "UPGRADE_REQUESTED", "ADD_NODE_REQUESTED", "STOP_REQUESTED", "OPERATION_SUCCEEDED"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("events lack %s:\n%s", want, r.stdout)
		}
	}

	r = ok(t, env, "delete", "demo", "--wait")
	if !strings.Contains(r.stdout, "delete") || !strings.Contains(r.stdout, "succeeded") {
		t.Errorf("delete --wait =\n%s", r.stdout)
	}
	refused(t, env, 1, "NOT_FOUND", "get", "demo")
	if r := ok(t, env, "list", "--filter", "state = DESTROYED", "-o", "json"); !strings.Contains(r.stdout, `"state": "DESTROYED"`) {
		t.Errorf("list of DESTROYED -o json =\n%s", r.stdout)
	}
}

// TestAFailedStepIsShownWhole: an operation that fails at a step shows the
// step and the infrastructure's whole error (not a 40-byte clip of it), in
// --wait, operations get and events; a scale's provision_machine is a step
// like any other (it ended INTERNAL "internal error").
func TestAFailedStepIsShownWhole(t *testing.T) {
	addr := serve(t)
	env := map[string]string{"CLUSTERCTL_SERVER": addr}
	s := sim(t, addr)
	ok(t, env, "create", "rest", "--kubernetes-version", "1.30.2", "--workers", "1", "--offering", "medium", "--wait")
	for _, tt := range []struct {
		step string
		args []string
	}{
		{"upgrade_node", []string{"upgrade", "rest", "1.30.5", "--wait"}},
		{"provision_machine", []string{"scale", "rest", "--workers", "3", "--wait"}},
	} {
		f, err := s.Simulator.InjectFault(tctx(t), &clv1.InjectFaultRequest{Fault: &clv1.Fault{Step: tt.step, Mode: clv1.Fault_FAIL, Count: 1}})
		if err != nil {
			t.Fatal(err)
		}
		cause := fmt.Sprintf("%s: injected failure (fault %s)", tt.step, strings.TrimPrefix(f.GetName(), "faults/"))
		want := fmt.Sprintf("step %s failed: %s (STEP_FAILED)\n", tt.step, cause)
		r := ctl(t, env, tt.args...)
		op := operationPattern.FindString(r.stderr)
		if r.code != 1 || op == "" || !strings.HasSuffix(r.stderr, "clusterctl: "+op+" failed: "+want) {
			t.Errorf("clusterctl %s: exit %d, stderr %q; want exit 1 ending %q", strings.Join(tt.args, " "), r.code, r.stderr, op+" failed: "+want)
		}
		if r := ok(t, env, "operations", "get", op); !strings.HasSuffix(r.stdout, "\nError: "+want) {
			t.Errorf("operations get %s =\n%s\nwant it to end Error: %s", op, r.stdout, want)
		}
		if r := ok(t, env, "events", "rest"); !strings.Contains(r.stdout, "operation failed: "+cause) {
			t.Errorf("events =\n%s\nwant the failure of %s saying %q", r.stdout, op, cause)
		}
		// The cluster says why it is ALERT, and what to do.
		r = ok(t, env, "get", "rest")
		if !regexp.MustCompile(`(?m)^State:\s+ALERT$`).MatchString(r.stdout) ||
			!regexp.MustCompile(`(?m)^Why:\s+operation failed: `+regexp.QuoteMeta(cause)+`.* \(since .* ago\)\)$`).MatchString(r.stdout) ||
			!regexp.MustCompile(`(?m)^Next step:\s+clusterd brings it back to RUNNING by itself .*; you can start, .* or delete it\.$`).MatchString(r.stdout) {
			t.Errorf("get rest after the failed %s =\n%s\nwant State ALERT, Why naming %q, and a Next step", tt.step, r.stdout, cause)
		}
	}
}

// TestCommandLine: usage mistakes exit 2, the environment twins work and a
// flag wins over its twin, --version, shell completion.
func TestCommandLine(t *testing.T) {
	addr := serve(t)
	ok(t, map[string]string{"CLUSTERCTL_SERVER": addr}, "create", "web", "--kubernetes-version", "1.30.2", "--offering", "medium", "--wait")

	refused(t, nil, 2, "accepts 1 arg", "get")
	refused(t, nil, 2, "unknown flag: --colour", "list", "--colour")
	refused(t, nil, 2, "want one of table, wide, json, yaml, name, jsonpath=TEMPLATE", "list", "-o", "xml")
	refused(t, map[string]string{"CLUSTERCTL_OUTPUT": "xml"}, 2, "want one of table", "list")
	refused(t, nil, 2, "-o jsonpath: unclosed {", "list", "-o", "jsonpath={.items")
	refused(t, nil, 2, "name a subcommand", "operations")

	// The twin sets what the command line does not; the command line wins.
	if r := ok(t, map[string]string{"CLUSTERCTL_SERVER": addr, "CLUSTERCTL_OUTPUT": "json"}, "list"); !strings.Contains(r.stdout, `"displayName": "web"`) {
		t.Errorf("CLUSTERCTL_OUTPUT=json list =\n%s", r.stdout)
	}
	if r := ok(t, map[string]string{"CLUSTERCTL_SERVER": "127.0.0.1:1"}, "--server", addr, "list"); !strings.Contains(r.stdout, "web") {
		t.Errorf("--server over a wrong CLUSTERCTL_SERVER: %q", r.stdout)
	}
	// A URL names the server too; TLS to a plaintext server says so.
	ok(t, map[string]string{"CLUSTERCTL_SERVER": "grpc://" + addr}, "list")
	refused(t, map[string]string{"CLUSTERCTL_SERVER": "https://" + addr}, 1, "does not speak TLS", "list")
	r := refused(t, map[string]string{"CLUSTERCTL_SERVER": "127.0.0.1:1"}, 1, "cannot reach clusterd at 127.0.0.1:1", "list", "--timeout", "5s")
	if !strings.Contains(r.stderr, "CLUSTERCTL_SERVER") {
		t.Errorf("an unreachable server: %q; want a hint about --server", r.stderr)
	}
	// The account of development mode (an admin's --account).
	env := map[string]string{"CLUSTERCTL_SERVER": addr, "CLUSTERCTL_ACCOUNT": "team-a"}
	if r := ok(t, env, "list"); strings.TrimSpace(r.stdout) != "No clusters." {
		t.Errorf("list as team-a =\n%s\nwant none (web is default's)", r.stdout)
	}

	if r := ok(t, nil, "--version"); !regexp.MustCompile(`^clusterctl \S+ \(commit \S+, go1\.\S+\)\n$`).MatchString(r.stdout) {
		t.Errorf("--version = %q", r.stdout)
	}
	if r := ok(t, nil, "completion", "bash"); !strings.Contains(r.stdout, "__start_clusterctl") {
		t.Error("completion bash is not a bash completion script")
	}
	if r := ok(t, nil, "completion", "zsh"); !strings.HasPrefix(r.stdout, "#compdef clusterctl") {
		t.Error("completion zsh is not a zsh completion script")
	}
	// What the shell asks when completing `clusterctl get <TAB>`.
	if r := ok(t, map[string]string{"CLUSTERCTL_SERVER": addr}, "__complete", "get", ""); !strings.Contains(r.stdout, "web\tRUNNING") {
		t.Errorf("completion of a cluster = %q; want web", r.stdout)
	}
	if r := ok(t, nil, "__complete", "list", "-o", ""); !strings.Contains(r.stdout, "json") {
		t.Errorf("completion of -o = %q", r.stdout)
	}
}

// TestTokensAndTLS: a server with tokens and TLS; clusterctl reaches it
// with --tls-ca and --token (or their twins), and reports refusals.
func TestTokensAndTLS(t *testing.T) {
	dir := t.TempDir()
	caFile, certFile, keyFile := writeTLS(t, dir)
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte(tokenLine("admin-token", "ops", "admin")+tokenLine("team-a-token", "team-a", "user")), 0o600); err != nil {
		t.Fatal(err)
	}
	secretsKey := filepath.Join(dir, "secrets.key")
	if err := os.WriteFile(secretsKey, []byte("k1 AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := serve(t, func(c *server.Config) {
		c.AuthTokens, c.TLSCert, c.TLSKey, c.SecretsKeyFile = tokens, certFile, keyFile, secretsKey
	})

	env := map[string]string{"CLUSTERCTL_SERVER": addr, "CLUSTERCTL_TLS_CA": caFile}
	refused(t, env, 1, "(CREDENTIALS_MISSING)", "list")
	refused(t, env, 1, "(CREDENTIALS_INVALID)", "list", "--token", "guess")
	// An admin creates a cluster for team-a; team-a's user sees it.
	ok(t, env, "--token", "admin-token", "--account", "team-a", "create", "a1", "--kubernetes-version", "1.30.2", "--offering", "medium", "--wait")
	env["CLUSTERCTL_TOKEN"] = "team-a-token"
	if r := ok(t, env, "list"); !regexp.MustCompile(`(?m)^a1\s+clusters/\S+\s+team-a\s+RUNNING`).MatchString(r.stdout) {
		t.Errorf("team-a's list =\n%s", r.stdout)
	}
	refused(t, env, 2, "--tls-cert and --tls-key go together", "list", "--tls-cert", certFile)
	refused(t, env, 1, "UNAVAILABLE", "list", "--tls-server-name", "not-the-server.example")
	delete(env, "CLUSTERCTL_TLS_CA")
	refused(t, env, 1, "UNAVAILABLE", "list", "--tls")         // the system's CAs do not know the test CA
	refused(t, env, 1, "is it serving TLS? add --tls", "list") // plaintext to a TLS server
	// An https:// --server is TLS without --tls.
	ok(t, map[string]string{"CLUSTERCTL_TLS_CA": caFile, "CLUSTERCTL_TOKEN": "team-a-token"}, "--server", "https://"+addr, "list")
	refused(t, map[string]string{"CLUSTERCTL_TOKEN": "team-a-token"}, 1, "is it serving TLS? add --tls", "--server", "http://"+addr, "list")
}

// tokenLine is a line of the server's --auth-tokens file.
func tokenLine(token, account, role string) string {
	sum := sha256.Sum256([]byte(token))
	return fmt.Sprintf("sha256:%s %s %s\n", hex.EncodeToString(sum[:]), account, role)
}

// writeTLS writes a test CA and a server certificate for 127.0.0.1 signed
// by it, and returns the CA, certificate and key files.
func writeTLS(t *testing.T, dir string) (ca, cert, key string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "clusterctl test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign, IsCA: true, BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "clusterd"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(srvKey)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, kind string, der []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	return write("ca.pem", "CERTIFICATE", caDER), write("server.pem", "CERTIFICATE", srvDER), write("server-key.pem", "EC PRIVATE KEY", keyDER)
}

// TestKubeconfig: clusterctl kubeconfig prints the cluster's kubeconfig,
// writes it 0600 with -f (even over a looser file), and each read is in the
// cluster's events.
func TestKubeconfig(t *testing.T) {
	addr := serve(t)
	env := map[string]string{"CLUSTERCTL_SERVER": addr}
	ok(t, env, "create", "kc", "--kubernetes-version", "1.30.2", "--offering", "medium", "--wait")
	r := ok(t, env, "kubeconfig", "kc")
	for _, want := range []string{"apiVersion: v1", "kind: Config", "certificate-authority-data:", "client-key-data:", "current-context: kubernetes-admin@kc"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("kubeconfig output lacks %q:\n%s", want, r.stdout)
		}
	}
	file := filepath.Join(t.TempDir(), "kc.kubeconfig")
	if err := os.WriteFile(file, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	ok(t, env, "kubeconfig", "kc", "-f", file)
	info, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode().Perm() != 0o600 {
		t.Errorf("kubeconfig file mode %04o; want 0600", info.Mode().Perm())
	}
	if data, _ := os.ReadFile(file); !strings.Contains(string(data), "client-certificate-data:") {
		t.Errorf("kubeconfig file holds %q", data)
	}
	if r := ok(t, env, "events", "kc"); strings.Count(r.stdout, "KUBECONFIG_READ") != 2 {
		t.Errorf("events after two reads:\n%s", r.stdout)
	}
}
