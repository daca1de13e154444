package client_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"net"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/clusterd/clusterd/client"
	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/server"
	"github.com/clusterd/clusterd/service"
)

// TestImportGraph keeps the package light: a program that imports it must
// not pull in GORM, a database driver or the server's own packages.
func TestImportGraph(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/clusterd/clusterd/client").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list -deps printed %d packages; want the real graph:\n%s", len(deps), out)
	}
	banned := []string{"gorm.io/", "github.com/go-sql-driver/", "github.com/glebarez/", "github.com/libtnb/", "modernc.org/", "database/sql",
		"github.com/clusterd/clusterd/repository", "github.com/clusterd/clusterd/service", "github.com/clusterd/clusterd/server",
		"github.com/clusterd/clusterd/runner", "github.com/clusterd/clusterd/scanner", "github.com/clusterd/clusterd/infra"}
	for _, d := range deps {
		for _, b := range banned {
			if strings.HasPrefix(d, b) {
				t.Errorf("client depends on %s", d)
			}
		}
	}
}

// TestReasonsMatchTheServer keeps the reason constants a client switches on
// equal to the ones the server sends.
func TestReasonsMatchTheServer(t *testing.T) {
	for got, want := range map[string]string{
		client.ReasonOperationInProgress:    service.ReasonOperationInProgress,
		client.ReasonConcurrentModification: service.ReasonConcurrentModification,
		client.ReasonEtagMismatch:           service.ReasonEtagMismatch,
		client.ReasonInvalidStateTransition: service.ReasonInvalidStateTransition,
		client.ReasonInvalidArgument:        service.ReasonInvalidArgument,
		client.ReasonNotFound:               service.ReasonNotFound,
		client.ReasonKubeconfigUnavailable:  service.ReasonKubeconfigUnavailable,
		client.ReasonAlreadyExists:          service.ReasonAlreadyExists,
		client.ReasonDatabaseUnavailable:    service.ReasonDatabaseUnavailable,
		client.ReasonServerUnavailable:      service.ReasonServerUnavailable,
		client.ReasonShuttingDown:           service.ReasonShuttingDown,
		client.ReasonNotImplemented:         service.ReasonNotImplemented,
		client.ReasonInternal:               service.ReasonInternal,
		client.Domain:                       service.Domain,
	} {
		if got != want {
			t.Errorf("client says %q, server %q", got, want)
		}
	}
}

// TestCodeName spells every gRPC code as google.rpc.Code does, which is
// where Go's codes.Canceled (CANCELED) and google.rpc's CANCELLED differ.
func TestCodeName(t *testing.T) {
	want := []string{"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
		"PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED",
		"INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"}
	for c, name := range want {
		if got := client.CodeName(codes.Code(c)); got != name {
			t.Errorf("CodeName(%v) = %q; want %q", codes.Code(c), got, name)
		}
	}
	if got := client.CodeName(codes.Code(99)); got != "CODE_99" {
		t.Errorf("CodeName(99) = %q; want CODE_99", got)
	}
}

// serve starts a real clusterd on SQLite and returns a client of it.
func serve(t *testing.T, opts ...client.Option) *client.Client {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := server.New(ctx, server.Config{
		Database: "sqlite:" + t.TempDir() + "/clusterd.db", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		ServerID: "client-test", SimStepDelay: 5 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), ScanInterval: time.Hour, ReconcileInterval: time.Hour,
	})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("server: %v", err)
		}
	})
	c, err := client.New(srv.GRPCAddr(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func tctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func spec(name string) *clv1.Cluster {
	return &clv1.Cluster{DisplayName: name, KubernetesVersion: "1.30.2", WorkerNodeCount: 2, ServiceOffering: "medium"}
}

func TestWaitReportsProgressToTheEnd(t *testing.T) {
	c := serve(t, client.WithAccount("team-a"))
	ctx := tctx(t)
	op, err := c.Clusters.CreateCluster(ctx, &clv1.CreateClusterRequest{Cluster: spec("web")})
	if err != nil {
		t.Fatal(err)
	}
	var seen []*clv1.OperationMetadata
	done, err := c.Wait(ctx, op, func(md *clv1.OperationMetadata) { seen = append(seen, md) }, client.PollEvery(10*time.Millisecond))
	if err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if len(seen) < 3 {
		t.Fatalf("progress reported %d times; want the start, steps and the end", len(seen))
	}
	for i := 1; i < len(seen); i++ {
		if seen[i].GetStepsDone() < seen[i-1].GetStepsDone() {
			t.Errorf("progress went back: %d then %d", seen[i-1].GetStepsDone(), seen[i].GetStepsDone())
		}
	}
	last := seen[len(seen)-1]
	if last.GetEndTime() == nil || last.GetStepsDone() != last.GetStepsTotal() || last.GetVerb() != "create" {
		t.Errorf("last progress = %v; want the ended create with every step done", last)
	}
	cl, err := client.ClusterOf(done)
	if err != nil || cl.GetState() != clv1.Cluster_RUNNING || cl.GetAccount() != "team-a" {
		t.Errorf("ClusterOf = %v, %v; want RUNNING in account team-a", cl, err)
	}
	if _, err := client.ClusterOf(op); err == nil {
		t.Error("ClusterOf a running operation succeeded")
	}
}

func TestWaitReturnsTheOperationsError(t *testing.T) {
	c := serve(t)
	ctx := tctx(t)
	if _, err := c.Simulator.InjectFault(ctx, &clv1.InjectFaultRequest{Fault: &clv1.Fault{Step: "provision_machine", Mode: clv1.Fault_FAIL}}); err != nil {
		t.Fatal(err)
	}
	op, err := c.Clusters.CreateCluster(ctx, &clv1.CreateClusterRequest{Cluster: spec("doomed")})
	if err != nil {
		t.Fatal(err)
	}
	done, err := c.Wait(ctx, op, nil)
	var opErr *client.OperationError
	if !errors.As(err, &opErr) || opErr.Name != op.GetName() || client.Code(err) == codes.OK || !done.GetDone() {
		t.Fatalf("Wait on a failing create = %v, %v; want the done operation and an *OperationError", done, err)
	}
	if info := client.ErrorInfo(err); info.GetReason() != "STEP_FAILED" || info.GetMetadata()["step"] != "provision_machine" {
		t.Errorf("the failed create's ErrorInfo = %v; want STEP_FAILED at provision_machine", info)
	}
	if _, err := client.ClusterOf(done); !errors.As(err, &opErr) {
		t.Errorf("ClusterOf a failed operation = %v; want its *OperationError", err)
	}
}

func TestRetryAbortedWaitsForTheHolder(t *testing.T) {
	c := serve(t)
	ctx := tctx(t)
	fault, err := c.Simulator.InjectFault(ctx, &clv1.InjectFaultRequest{Fault: &clv1.Fault{Step: "join_node", Mode: clv1.Fault_HOLD, Count: 1}})
	if err != nil {
		t.Fatal(err)
	}
	create, err := c.Clusters.CreateCluster(ctx, &clv1.CreateClusterRequest{Cluster: spec("busy")})
	if err != nil {
		t.Fatal(err)
	}
	md, _ := client.MetadataOf(create)
	heldFor(t, c, create.GetName())

	stop := func(ctx context.Context) (*longrunningpb.Operation, error) {
		return c.Clusters.StopCluster(ctx, &clv1.StopClusterRequest{Name: md.GetCluster()})
	}
	_, err = stop(ctx)
	if client.Code(err) != codes.Aborted || client.Reason(err) != client.ReasonOperationInProgress || !client.Retryable(err) {
		t.Fatalf("stop while held = %v; want a retryable ABORTED OPERATION_IN_PROGRESS", err)
	}
	if info := client.ErrorInfo(err); info.GetMetadata()["operation"] != create.GetName() || info.GetDomain() != client.Domain {
		t.Errorf("ErrorInfo = %v; want the holder %s in domain %s", info, create.GetName(), client.Domain)
	}

	// Without retries a refusal is returned at once.
	if _, err := client.RetryAborted(ctx, client.Backoff{Attempts: 1}, stop); client.Reason(err) != client.ReasonOperationInProgress {
		t.Errorf("one attempt = %v; want the refusal", err)
	}

	var attempts atomic.Int32
	refused := make(chan struct{})
	var once sync.Once
	type result struct {
		op  *longrunningpb.Operation
		err error
	}
	got := make(chan result, 1)
	go func() {
		op, err := client.RetryAborted(ctx, client.Backoff{Initial: 5 * time.Millisecond, Max: 20 * time.Millisecond},
			func(ctx context.Context) (*longrunningpb.Operation, error) {
				op, err := stop(ctx)
				if attempts.Add(1) >= 2 {
					once.Do(func() { close(refused) })
				}
				return op, err
			})
		got <- result{op, err}
	}()
	select {
	case <-refused:
	case <-ctx.Done():
		t.Fatal("RetryAborted did not try twice")
	}
	if _, err := c.Simulator.ReleaseHeld(ctx, &clv1.ReleaseHeldRequest{Fault: fault.GetName()}); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("RetryAborted = %v after %d attempts; want the stop accepted once the create ended", r.err, attempts.Load())
	}
	stopped, err := c.Wait(ctx, r.op, nil)
	if cl, cerr := client.ClusterOf(stopped); err != nil || cerr != nil || cl.GetState() != clv1.Cluster_STOPPED {
		t.Errorf("retried stop = %v, %v, %v; want STOPPED", cl, err, cerr)
	}
}

// heldFor waits until a step of operation is held by the simulator.
func heldFor(t *testing.T, c *client.Client, operation string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		held, err := c.Simulator.ListHeld(tctx(t), &clv1.ListHeldRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range held.GetHeld() {
			if h.GetOperation() == operation {
				return
			}
		}
	}
	t.Fatalf("no step of %s held", operation)
}

func TestFieldViolations(t *testing.T) {
	c := serve(t)
	_, err := c.Clusters.CreateCluster(tctx(t), &clv1.CreateClusterRequest{Cluster: spec("Not_A_Label")})
	v := client.FieldViolations(err)
	if client.Code(err) != codes.InvalidArgument || client.Reason(err) != client.ReasonInvalidArgument || len(v) != 1 || v[0].GetField() != "cluster.display_name" {
		t.Errorf("invalid display name = %v, violations %v; want INVALID_ARGUMENT on cluster.display_name", err, v)
	}
	if client.FieldViolations(nil) != nil || client.Reason(nil) != "" || client.Reason(errors.New("plain")) != "" {
		t.Error("helpers found details in an error without a status")
	}
}

// recorder is a gRPC server that answers every call UNIMPLEMENTED and hands
// over the metadata it received.
func recorder(t *testing.T, opts ...grpc.ServerOption) (string, <-chan metadata.MD) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	seen := make(chan metadata.MD, 1)
	srv := grpc.NewServer(append(opts, grpc.UnknownServiceHandler(func(_ any, stream grpc.ServerStream) error {
		md, _ := metadata.FromIncomingContext(stream.Context())
		seen <- md
		return status.Error(codes.Unimplemented, "recorder")
	}))...)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String(), seen
}

// TestCredentials checks what WithToken and WithAccount put on the wire.
func TestCredentials(t *testing.T) {
	addr, seen := recorder(t)
	c, err := client.New(addr, client.WithToken("s3cret"), client.WithAccount("team-a"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.Clusters.GetCluster(tctx(t), &clv1.GetClusterRequest{Name: "clusters/x"})
	if client.Code(err) != codes.Unimplemented {
		t.Fatalf("call = %v; want the recorder's UNIMPLEMENTED", err)
	}
	md := <-seen
	if got := md.Get("authorization"); len(got) != 1 || got[0] != "Bearer s3cret" {
		t.Errorf("authorization = %v; want [Bearer s3cret]", got)
	}
	if got := md.Get(client.AccountHeader); len(got) != 1 || got[0] != "team-a" {
		t.Errorf("%s = %v; want [team-a]", client.AccountHeader, got)
	}
}

// TestTLS connects over TLS to a server whose certificate the caller trusts,
// with a token, and refuses one it does not trust.
func TestTLS(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "clusterd test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	serverTLS := &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}, MinVersion: tls.VersionTLS12}
	addr, seen := recorder(t, grpc.Creds(credentials.NewTLS(serverTLS)))

	roots := x509.NewCertPool()
	roots.AddCert(cert)
	c, err := client.New(addr, client.WithTLS(&tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}), client.WithToken("s3cret"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.Clusters.GetCluster(tctx(t), &clv1.GetClusterRequest{Name: "clusters/x"})
	if client.Code(err) != codes.Unimplemented {
		t.Fatalf("call over TLS = %v; want the recorder's UNIMPLEMENTED", err)
	}
	if got := (<-seen).Get("authorization"); len(got) != 1 || got[0] != "Bearer s3cret" {
		t.Errorf("authorization over TLS = %v", got)
	}

	untrusting, err := client.New(addr, client.WithTLS(nil))
	if err != nil {
		t.Fatal(err)
	}
	defer untrusting.Close()
	if _, err := untrusting.Clusters.GetCluster(tctx(t), &clv1.GetClusterRequest{Name: "clusters/x"}); client.Code(err) != codes.Unavailable {
		t.Errorf("call to an untrusted certificate = %v; want UNAVAILABLE (handshake refused)", err)
	}
}
