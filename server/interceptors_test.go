package server

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/clusterd/clusterd/auth"
	"github.com/clusterd/clusterd/service"
)

// panickingService panics in every method it implements.
type panickingService struct {
	testgrpc.UnimplementedTestServiceServer
}

func (panickingService) EmptyCall(context.Context, *testgrpc.Empty) (*testgrpc.Empty, error) {
	panic("handler bug")
}

// chainServer serves the server's interceptor chain, with the parts of a
// Server it uses, around a service that panics and the health service, on a
// loopback port; it returns a connection to it and the server's log.
func chainServer(t *testing.T, a *auth.Authenticator) (*grpc.ClientConn, *lockedBuffer) {
	t.Helper()
	logs := &lockedBuffer{}
	s := &Server{log: requestLogger(slog.New(slog.NewTextHandler(logs, nil))), metrics: newMetrics(), codec: newRequestCodec(), calls: newOpenCalls(), auth: a}
	srv := grpc.NewServer(s.interceptors()...)
	testgrpc.RegisterTestServiceServer(srv, panickingService{})
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	t.Cleanup(func() {
		srv.Stop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn, logs
}

// wantInternal checks that err is the INTERNAL status every clusterd error
// is: "internal error", with an ErrorInfo of reason INTERNAL, and nothing
// of the panic.
func wantInternal(t *testing.T, what string, err error) {
	t.Helper()
	st := status.Convert(err)
	var reason string
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			reason = info.GetReason()
		}
	}
	if st.Code() != codes.Internal || st.Message() != "internal error" || reason != service.ReasonInternal {
		t.Errorf("%s: %v %q (reason %q); want INTERNAL \"internal error\" (reason %s)", what, st.Code(), st.Message(), reason, service.ReasonInternal)
	}
}

// A panic in the interceptor chain itself, outside the handler (here in
// authentication: an Authenticator that is nil), is recovered by the
// outermost interceptor: unary and streaming calls get INTERNAL, the panic
// and its stack are logged, and the server serves on.
func TestPanicInTheChainIsRecovered(t *testing.T) {
	conn, logs := chainServer(t, nil)
	ctx := tctx(t)
	calls := testgrpc.NewTestServiceClient(conn)
	_, err := calls.EmptyCall(ctx, &testgrpc.Empty{})
	wantInternal(t, "unary call whose authentication panics", err)

	stream, err := calls.FullDuplexCall(ctx)
	if err == nil {
		_, err = stream.Recv()
	}
	wantInternal(t, "streaming call whose authentication panics", err)

	if resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health check after the panics: %v, %v; want SERVING", resp.GetStatus(), err)
	}
	log := logs.String()
	if n := strings.Count(log, "panic in the interceptor chain"); n != 2 {
		t.Errorf("%d panics logged; want 2 (unary, stream):\n%s", n, log)
	}
	if !strings.Contains(log, "nil pointer dereference") || !strings.Contains(log, "server.(*Server).authenticate") {
		t.Errorf("the log does not say what panicked where (the panic and its stack):\n%s", log)
	}
}

// A handler's panic is recovered innermost: the chain maps it like any
// error (INTERNAL with its ErrorInfo) and logs the call's end, with the
// request's id, besides the panic.
func TestPanicInAHandlerIsAnError(t *testing.T) {
	a, err := auth.New(auth.Config{}) // development mode: the account header is the identity
	if err != nil {
		t.Fatal(err)
	}
	conn, logs := chainServer(t, a)
	ctx := metadata.AppendToOutgoingContext(tctx(t), auth.AccountHeader, "team-a", RequestIDHeader, "panic-test-1")
	_, err = testgrpc.NewTestServiceClient(conn).EmptyCall(ctx, &testgrpc.Empty{})
	wantInternal(t, "unary call whose handler panics", err)
	// The call's end may be logged just after its answer left: wait for it.
	var panicked, finished string
	for deadline := time.Now().Add(time.Minute); (panicked == "" || finished == "") && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		for _, line := range strings.Split(logs.String(), "\n") {
			switch {
			case strings.Contains(line, `msg="panic in handler"`):
				panicked = line
			case strings.Contains(line, `msg="finished call"`):
				finished = line
			}
		}
	}
	if !strings.Contains(panicked, `panic="handler bug"`) || !strings.Contains(panicked, "request_id=panic-test-1") {
		t.Errorf("the panic's log line %q; want the panic and the request id", panicked)
	}
	if !strings.Contains(finished, "grpc.code=Internal") || !strings.Contains(finished, "request_id=panic-test-1") {
		t.Errorf("the call's log line %q; want its end logged INTERNAL with the request id", finished)
	}
}
