package server

import (
	"context"
	"errors"
	"fmt"
	"net"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
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

// serveHealth serves the health service on the health port until ctx ends.
// Its statuses are the API port's (one health.Server): the shutdown's
// NOT_SERVING shows here at the same moment.
func (s *Server) serveHealth(ctx context.Context) {
	if s.healthLis == nil {
		return
	}
	srv := grpc.NewServer(grpc.MaxRecvMsgSize(4<<10), grpc.MaxConcurrentStreams(16))
	healthpb.RegisterHealthServer(srv, s.health)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(s.healthLis) }()
	s.log.Info("health served", "health", s.HealthAddr())
	select {
	case <-ctx.Done():
		srv.Stop()
		<-done
	case err := <-done:
		if err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			s.log.Error("health port stopped", "error", err)
		}
	}
}
