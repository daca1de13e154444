package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
)

// listenHealth binds HealthAddr, if set. The port serves the gRPC health
// service and nothing else, in plaintext and without identities:
// Kubernetes' gRPC probes can do neither TLS nor tokens, and the health
// service is public on the API port too (it tells a status, nothing of any
// account). Any address is allowed, development mode or not.
func (s *Server) listenHealth() error {
	if s.cfg.HealthAddr == "" {
		return nil
	}
	l, err := net.Listen("tcp", s.cfg.HealthAddr)
	if err != nil {
		return fmt.Errorf("listen for --health-addr on %s: %w", s.cfg.HealthAddr, err)
	}
	s.healthLis = l
	return nil
}

// HealthAddr is the address the health port serves on, "" without
// --health-addr.
func (s *Server) HealthAddr() string {
	if s.healthLis == nil {
		return ""
	}
	return s.healthLis.Addr().String()
}

// serveHealth serves the health service's Check on the health port until
// done is closed, which Run does when the shutdown has ended: its statuses
// are the API port's (one health.Server), so an orchestrator sees the
// shutdown's NOT_SERVING there for as long as the shutdown lasts, not a
// refused connection. The port is open to anyone, so it serves no more than
// a probe needs: Check only (a Watch would hold a stream per caller), few
// streams per connection, and idle connections closed.
func (s *Server) serveHealth(done <-chan struct{}) {
	if s.healthLis == nil {
		return
	}
	srv := grpc.NewServer(
		grpc.MaxRecvMsgSize(4<<10),
		grpc.MaxConcurrentStreams(4),
		grpc.ConnectionTimeout(5*time.Second),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: time.Minute, MaxConnectionAge: 10 * time.Minute, MaxConnectionAgeGrace: 5 * time.Second}),
	)
	healthpb.RegisterHealthServer(srv, checkOnly{s.health})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(s.healthLis) }()
	s.log.Info("health served", "health", s.HealthAddr())
	select {
	case <-done:
		srv.Stop()
		<-served
	case err := <-served:
		if err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			s.log.Error("health port stopped", "error", err)
		}
	}
}

// checkOnly is the health service with Check alone (Watch and List answer
// UNIMPLEMENTED).
type checkOnly struct {
	checker interface {
		Check(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error)
	}
}

func (c checkOnly) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	return c.checker.Check(ctx, req)
}

func (checkOnly) List(context.Context, *healthpb.HealthListRequest) (*healthpb.HealthListResponse, error) {
	return nil, status.Error(codes.Unimplemented, "the health port answers Check only")
}

func (checkOnly) Watch(*healthpb.HealthCheckRequest, healthpb.Health_WatchServer) error {
	return status.Error(codes.Unimplemented, "the health port answers Check only")
}
