package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"

	"github.com/clusterd/clusterd/auth"
	"github.com/clusterd/clusterd/service"
)

// operatorRoutes adds to the HTTP port what operators use beside the API:
// GET /metrics (admins only, see requireAdmin) and the web view (GET / and
// its assets under /ui/, public files whose data comes from the REST API
// with the viewer's own credentials). They are gateway routes like the
// API's, so the gateway's guard (UTF-8, body size) and its 404/405 answers
// apply to them too.
func (s *Server) operatorRoutes(mux *runtime.ServeMux) error {
	if err := mux.HandlePath(http.MethodGet, "/metrics", s.metricsHandler(mux)); err != nil {
		return fmt.Errorf("gateway /metrics: %w", err)
	}
	return webRoutes(mux, time.Now())
}

// requireAdmin authenticates a plain HTTP request (one that does not go
// through the gRPC server) as the interceptor would a call, and refuses
// anyone but an admin. In development mode everyone is an admin, which the
// server allows on loopback listeners only.
func (s *Server) requireAdmin(r *http.Request) error {
	var c auth.Credentials
	switch vs := r.Header.Values("Authorization"); len(vs) {
	case 0:
	case 1:
		c.Authorization = vs[0]
	default:
		return fmt.Errorf("%w: more than one authorization header", auth.ErrBadCredentials)
	}
	if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 && len(r.TLS.VerifiedChains[0]) > 0 {
		c.Certificate = r.TLS.VerifiedChains[0][0]
	}
	id, err := s.auth.Authenticate(c)
	if err != nil {
		return err
	}
	if !id.IsAdmin() {
		return fmt.Errorf("%w: %s is for admins only", auth.ErrAdminOnly, r.URL.Path)
	}
	return nil
}

// listenDebug binds --debug-addr, if set. Profiles show the process's
// memory, so the listener follows development mode's rule: without
// identities it must be a loopback address; with them, every request needs
// admin credentials (and TLS when the server has a certificate).
func (s *Server) listenDebug() error {
	if s.cfg.DebugAddr == "" {
		return nil
	}
	l, err := net.Listen("tcp", s.cfg.DebugAddr)
	if err != nil {
		return fmt.Errorf("listen for --debug-addr on %s: %w", s.cfg.DebugAddr, err)
	}
	if s.auth.DevMode() {
		if err := loopbackOnly(l); err != nil {
			_ = l.Close()
			return err
		}
	}
	s.debugLis = l
	return nil
}

// DebugAddr is the address pprof is served on, "" without --debug-addr.
func (s *Server) DebugAddr() string {
	if s.debugLis == nil {
		return ""
	}
	return s.debugLis.Addr().String()
}

// serveDebug serves net/http/pprof under /debug/pprof/ until ctx ends.
func (s *Server) serveDebug(ctx context.Context) {
	if s.debugLis == nil {
		return
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if err := s.requireAdmin(r); err != nil {
				st := service.Status(err)
				code := runtime.HTTPStatusFromCode(st.Code())
				if code == http.StatusUnauthorized {
					w.Header().Set("WWW-Authenticate", `Bearer realm="clusterd"`)
				}
				http.Error(w, st.Message(), code)
				return
			}
			mux.ServeHTTP(w, r)
		}),
		ReadHeaderTimeout: 10 * time.Second,
		TLSConfig:         s.tlsConfig(),
	}
	done := make(chan error, 1)
	go func() {
		if s.certs != nil {
			done <- srv.ServeTLS(s.debugLis, "", "")
		} else {
			done <- srv.Serve(s.debugLis)
		}
	}()
	s.log.Info("pprof served", "debug", s.DebugAddr())
	select {
	case <-ctx.Done():
		// Profiles can take 30s; the debug port waits for nobody.
		_ = srv.Close()
		<-done
	case err := <-done:
		if !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("debug server stopped", "error", err)
		}
	}
}
