package server

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// background is the goroutines Serve starts besides the listeners: the
// heartbeat, the scanner, the health watcher, the watch hub and, with the libvirt driver,
// the watcher of its domain events. Each is stopped on its own, in the
// order shutdown needs, and joined before the database closes.
type background struct {
	stopLease, stopScanner, stopHealth, stopEvents, stopHub context.CancelFunc
	leaseDone, scannerDone, healthDone, eventsDone, hubDone chan struct{}
}

func (s *Server) startBackground() {
	b := &background{leaseDone: make(chan struct{}), scannerDone: make(chan struct{}), healthDone: make(chan struct{}),
		hubDone: make(chan struct{})}
	start := func(done chan struct{}, run func(context.Context)) context.CancelFunc {
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			defer close(done)
			run(ctx)
		}()
		return cancel
	}
	b.stopLease = start(b.leaseDone, s.lease.Run)
	b.stopScanner = start(b.scannerDone, s.scanner.Run)
	b.stopHealth = start(b.healthDone, s.watchHealth)
	b.stopHub = start(b.hubDone, s.hub.Run)
	b.eventsDone = make(chan struct{})
	if s.libvirt != nil {
		b.stopEvents = start(b.eventsDone, s.watchDomains)
	} else {
		b.stopEvents = func() {}
		close(b.eventsDone)
	}
	s.bg = b
}

// shutdown stops clusterd within ShutdownTimeout, in this order:
//
//  1. Stop admitting: health reports NOT_SERVING, mutations are refused
//     (SHUTTING_DOWN, so clients retry elsewhere), every open or new
//     WaitOperation answers at once with the operation as it stands, and
//     the watch hub stops: every watch ends UNAVAILABLE (SHUTTING_DOWN),
//     for its client to resume on another server.
//  2. The watcher of libvirt's domain events stops, then the scanner (it
//     would claim recoveries).
//  3. Jobs stop at their next step: their contexts are cancelled, steps held
//     by the simulator return, and each is handed off (IN_PROGRESS, its
//     cluster still held, for a live server to adopt at once; with
//     OnOwnerLoss fail, it records its end instead: FAILED, "server
//     shutting down", its cluster released to the failure state) before
//     the runner returns.
//  4. Connections drain: by now every RPC is short.
//  5. The heartbeat stops and the server id is given up, so peers adopt (or
//     fail) at once whatever job could not record its hand-off or its end,
//     and a restart need not wait for the id.
//  6. The database closes: every goroutine that could use it has ended.
func (s *Server) shutdown() error {
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancel()
	s.log.Info("clusterd shutting down", "budget", s.cfg.ShutdownTimeout, "jobs", len(s.runner.Running()))
	bg := s.bg
	var errs []error

	if bg != nil {
		bg.stopHealth()
		<-bg.healthDone
	}
	s.health.Shutdown()
	s.clusters.Drain()
	s.ops.Drain()
	if bg != nil {
		bg.stopHub()
		<-bg.hubDone
	}

	if bg != nil {
		bg.stopEvents()
		<-bg.eventsDone
		bg.stopScanner()
		<-bg.scannerDone
	}

	// The jobs' contexts first, so that a held step let go by StopHolding
	// is seen as the shutdown's interruption, not as the step's failure.
	s.runner.Interrupt()
	s.sim.StopHolding()
	if err := s.runner.Shutdown(ctx); err != nil {
		errs = append(errs, fmt.Errorf("stop jobs: %w", err))
		// Past the budget: give up on the ends still being written (the
		// jobs stay IN_PROGRESS; peers or the next incarnation fail them)
		// and join the jobs, which now return at once.
		s.runner.Abort()
		grace, cancelGrace := context.WithTimeout(context.Background(), 5*time.Second)
		if err := s.runner.Shutdown(grace); err != nil {
			errs = append(errs, fmt.Errorf("jobs still running after the budget: %w", err))
		}
		cancelGrace()
	}

	if err := s.http.Shutdown(ctx); err != nil {
		errs = append(errs, fmt.Errorf("HTTP shutdown: %w", err))
	}
	stopped := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-ctx.Done():
		s.grpc.Stop()
		<-stopped
		errs = append(errs, errors.New("gRPC connections cut at the end of the shutdown budget"))
	}

	if bg != nil {
		bg.stopLease()
		<-bg.leaseDone
	}
	release, cancelRelease := context.WithTimeout(context.Background(), 2*time.Second)
	if err := s.lease.Release(release); err != nil {
		// Peers take the id for dead after the peer timeout instead.
		s.log.Warn("could not record that this server stopped", "error", err)
	}
	cancelRelease()

	_ = s.conn.Close()
	if s.libvirt != nil {
		if err := s.libvirt.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := s.store.Close(); err != nil {
		errs = append(errs, fmt.Errorf("close database: %w", err))
	}
	s.log.Info("clusterd stopped", "took", time.Since(began).Round(time.Millisecond), "errors", len(errs))
	return errors.Join(errs...)
}
