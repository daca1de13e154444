// Package server wires clusterd together: the repository, the job runner,
// the gRPC services with one interceptor chain, health, reflection, and the
// REST gateway that is a client of the same gRPC server. It holds no
// business logic.
package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime"
	"sync"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	// ErrorInfo and BadRequest must be resolvable through reflection so that
	// grpcurl -format-error can print error details.
	_ "google.golang.org/genproto/googleapis/rpc/errdetails"

	"github.com/clusterd/clusterd/auth"
	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/infra/libvirt"
	"github.com/clusterd/clusterd/infra/sim"
	"github.com/clusterd/clusterd/lease"
	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/runner"
	"github.com/clusterd/clusterd/scanner"
	"github.com/clusterd/clusterd/service"
)

// Config is everything a clusterd process needs to run.
type Config struct {
	// Database is sqlite:<path> or mysql://user:pass@host:port/db.
	Database string
	// GRPCAddr and HTTPAddr are listen addresses; port 0 picks a free port.
	GRPCAddr string
	HTTPAddr string
	// ServerID identifies this process to its peers; required (the binary's
	// default is the host name and gRPC port). A second live process under
	// the same id is refused at start (see package lease).
	ServerID string
	// DatabaseWait is how long start-up waits for the database to answer
	// and to take the write that registers this server (default 60s),
	// logging each attempt.
	DatabaseWait time.Duration
	// Infra names the infrastructure driver: "sim" (the default) or
	// "libvirt" (see Libvirt).
	Infra string
	// Libvirt configures the libvirt driver (Infra "libvirt"); its Guard
	// is the server's store.
	Libvirt libvirt.Config
	// SimStepDelay is slept at every simulated step, so operations take
	// visible time (the binary's default is 100ms).
	SimStepDelay time.Duration
	// Catalog bounds the size of clusters, and its versions and offerings
	// seed an empty database catalog at start (default
	// service.DefaultCatalog()).
	Catalog *service.Catalog
	// DefaultQuota limits every account an admin set no quota for (zero:
	// unlimited).
	DefaultQuota repository.Limits
	// Deadlines bound each kind of operation (default 1h).
	Deadlines service.Deadlines
	// HeartbeatInterval, PeerTimeout, ScanInterval, ReconcileInterval and
	// JobRetention drive liveness and recovery (defaults 1s, 6s, 2s, 10s,
	// 7 days; see package scanner).
	HeartbeatInterval time.Duration
	PeerTimeout       time.Duration
	ScanInterval      time.Duration
	ReconcileInterval time.Duration
	JobRetention      time.Duration
	// OrphanMachineGrace is how old a machine of a destroyed or unknown
	// cluster must be before the scanner removes it, with the libvirt
	// driver (default scanner.DefaultOrphanMachineGrace; see
	// scanner.MachineCollector).
	OrphanMachineGrace time.Duration
	// Logger receives every log line (default slog.Default()).
	Logger *slog.Logger
	// HealthInterval is how often the database is pinged for health (default
	// 2s). Each ping may take up to PeerTimeout before health turns
	// NOT_SERVING: a slow answer is not an outage (see healthProbe).
	HealthInterval time.Duration
	// ShutdownTimeout bounds graceful shutdown before connections are cut (default 15s).
	ShutdownTimeout time.Duration
	// AuthTokens is the --auth-tokens file: one identity a line,
	// `sha256:<hex> <account> <user|admin>`.
	AuthTokens string
	// TLSCert and TLSKey serve gRPC and REST over TLS; TLSClientCA turns on
	// mutual TLS, where a verified client certificate is an identity. With
	// neither tokens nor client certificates the server runs in development
	// mode, which it allows on loopback addresses only.
	TLSCert     string
	TLSKey      string
	TLSClientCA string
	// Reload, when it delivers, makes the server read the token file and
	// the TLS key pair again (main sends SIGHUP here); connections stay up.
	Reload <-chan os.Signal
	// DebugAddr, when set, serves net/http/pprof there (see listenDebug).
	DebugAddr string
	// HealthAddr, when set, serves the gRPC health service alone there, in
	// plaintext (see listenHealth): for an orchestrator's gRPC probes,
	// which speak neither TLS nor tokens.
	HealthAddr string
	// OnOwnerLoss is what becomes of a running operation whose server stops
	// or dies (SPEC §5): OnOwnerLossResume (the default) hands it off on a
	// graceful stop and lets a live server adopt it and run it on;
	// OnOwnerLossFail fails it and recovers its cluster, as before adoption
	// existed. Every server sharing a database should use the same.
	OnOwnerLoss string
	// SecretsKeyFile is the --secrets-key-file: the keys that encrypt the
	// clusters' credentials at rest (package secrets documents the
	// format). Required with identities; a development-mode server without
	// one uses DevSecretsKeyPath.
	SecretsKeyFile string
	// MaxOperationAttempts bounds adoption: an operation that has run this
	// many times (on the server that accepted it and the ones that adopted
	// it) is failed when its server is lost again (default 3).
	MaxOperationAttempts int
	// WatchRetention is how long the change feed keeps its rows (default
	// scanner.DefaultChangeRetention): a watch resumed from an older token
	// is refused.
	WatchRetention time.Duration
	// MaxWatchesPerAccount caps the watches one account may have open on
	// this server (default service.DefaultMaxWatchesPerAccount).
	MaxWatchesPerAccount int
	// WatchBuffer is how many changes a watcher may fall behind before it
	// is ended (default service.DefaultWatchBuffer).
	WatchBuffer int
}

// What becomes of an operation whose server stops or dies (Config.OnOwnerLoss).
const (
	OnOwnerLossResume = "resume"
	OnOwnerLossFail   = "fail"
)

// Server is a running clusterd process; tests use it to learn bound addresses.
type Server struct {
	cfg    Config
	log    *slog.Logger
	auth   *auth.Authenticator
	calls  *openCalls
	certs  *certificates
	codec  *requestCodec
	store  *repository.Store
	lease  *lease.Lease
	self   repository.Server
	runner *runner.Runner
	sim    *sim.Simulator
	// infra is what operations drive: the simulator, or the libvirt driver
	// (libvirt, closed at shutdown).
	infra    infra.Infrastructure
	libvirt  *libvirt.Driver
	clusters *service.Clusters
	quotas   *service.Quotas
	ops      *service.Operations
	hub      *service.Hub
	scanner  *scanner.Scanner
	health   *health.Server
	grpc     *grpc.Server
	http     *http.Server
	conn     *grpc.ClientConn
	grpcLis  net.Listener
	httpLis  net.Listener
	// gatewayLis is the in-process listener the REST gateway calls through.
	gatewayLis gatewayListener
	metrics    *metrics
	debugLis   net.Listener
	healthLis  net.Listener
	// bg is what Serve started besides the listeners (nil before Serve).
	bg *background
}

// Run starts clusterd and blocks until ctx is cancelled (SIGTERM in main),
// then stops gracefully (see shutdown): no new work, open waits answered,
// running jobs stopped and their ends recorded, connections drained, every
// goroutine joined, and only then the database closed.
func Run(ctx context.Context, cfg Config) error {
	s, err := New(ctx, cfg)
	if err != nil {
		return err
	}
	return s.Serve(ctx)
}

// New opens the database (running migrations), registers this server and
// binds both listeners, so that when it returns the addresses are known and
// every failure of configuration has been reported.
func New(ctx context.Context, cfg Config) (*Server, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: requestLogger(cfg.Logger), codec: newRequestCodec(), calls: newOpenCalls(), gatewayLis: newGatewayListener(), metrics: newMetrics()}
	var err error
	if s.certs, err = newCertificates(cfg.TLSCert, cfg.TLSKey, cfg.TLSClientCA); err != nil {
		return nil, err
	}
	if s.auth, err = auth.New(auth.Config{TokensFile: cfg.AuthTokens, ClientCertificates: s.certs != nil && s.certs.clientCAs != nil}); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	keyring, err := loadSecrets(cfg, s.auth.DevMode())
	if err != nil {
		return nil, err
	}
	// The flags' versions and offerings fill an empty catalog only; once
	// it holds entries, admins manage it through the Catalog service.
	catalog := service.DefaultCatalog()
	if cfg.Catalog != nil {
		catalog = *cfg.Catalog
	}
	versions, offerings := catalog.Seed()
	wait := newStartupWait(cfg)
	s.store, err = openDatabase(ctx, cfg, wait, func(ctx context.Context, store *repository.Store) error {
		// The simulator's own tables, beside clusterd's (sim.Migrate).
		if err := sim.Migrate(ctx, store); err != nil {
			return err
		}
		return store.SeedCatalog(ctx, versions, offerings)
	})
	if err != nil {
		return nil, err
	}
	cleanup := func() { _ = s.store.Close() }
	if keyring == nil {
		if keyring, err = devSecrets(cfg, s.log); err != nil {
			cleanup()
			return nil, err
		}
	}
	if s.grpcLis, err = net.Listen("tcp", cfg.GRPCAddr); err != nil {
		cleanup()
		return nil, fmt.Errorf("listen for gRPC on %s: %w", cfg.GRPCAddr, err)
	}
	if s.httpLis, err = net.Listen("tcp", cfg.HTTPAddr); err != nil {
		_ = s.grpcLis.Close()
		cleanup()
		return nil, fmt.Errorf("listen for HTTP on %s: %w", cfg.HTTPAddr, err)
	}
	if s.auth.DevMode() {
		if err := loopbackOnly(s.grpcLis, s.httpLis); err != nil {
			_ = s.grpcLis.Close()
			_ = s.httpLis.Close()
			cleanup()
			return nil, err
		}
	}
	// The lease comes first: nothing that acts exists before this process
	// holds its server id, and everything that acts is handed the lease.
	s.lease = lease.New(lease.Config{
		Store: s.store, ServerID: cfg.ServerID, HeartbeatInterval: cfg.HeartbeatInterval,
		PeerTimeout: cfg.PeerTimeout, Logger: s.log,
	})
	if s.self, err = acquireLease(ctx, s.lease, wait); err != nil {
		_ = s.grpcLis.Close()
		_ = s.httpLis.Close()
		cleanup()
		return nil, err
	}

	resume := cfg.OnOwnerLoss == OnOwnerLossResume
	// A cancel served by a peer reaches this server's step in flight within
	// a heartbeat interval; one served here, at once (Operations.local).
	s.runner = runner.New(runner.Config{Store: s.store, Logger: s.log, OnDone: s.metrics.jobDone(func(j repository.Job) { s.ops.Notify(j) }),
		Lease: s.lease, HandOff: resume, Encode: service.EncodeJobError, WatchCancels: cfg.HeartbeatInterval})
	s.ops = service.NewOperations(s.store, s.runner)
	s.sim = sim.New(s.store, sim.Config{StepDelay: cfg.SimStepDelay, Logger: s.log})
	s.infra = s.sim
	if cfg.Infra == "libvirt" {
		lc := cfg.Libvirt
		// The driver fences on the store and takes free machines in it
		// (its own table, which New migrates).
		lc.Guard, lc.Takes, lc.Logger = libvirtGuard(s.store), s.store, s.log
		if s.libvirt, err = libvirt.New(ctx, lc); err != nil {
			_ = s.grpcLis.Close()
			_ = s.httpLis.Close()
			_ = s.lease.Release(ctx)
			cleanup()
			return nil, err
		}
		s.infra = s.libvirt
		closeStore := cleanup
		cleanup = func() { _ = s.libvirt.Close(); closeStore() }
	}
	s.hub = service.NewHub(service.HubConfig{Store: s.store, Infra: s.infra, Buffer: cfg.WatchBuffer,
		MaxPerAccount: cfg.MaxWatchesPerAccount, Logger: s.log})
	s.clusters = service.NewClusters(service.ClustersConfig{
		Store: s.metrics.repairStore(s.store), Runner: s.runner, Infra: s.infra, Catalog: cfg.Catalog,
		ServerID: cfg.ServerID, Incarnation: s.self.Incarnation, Deadlines: cfg.Deadlines, Logger: s.log,
		Lease: s.lease, HandOff: resume, Secrets: keyring, DefaultQuota: cfg.DefaultQuota, Hub: s.hub,
	})
	s.quotas = service.NewQuotas(s.store, s.clusters)
	var adopter scanner.Adopter
	if resume {
		adopter = s.clusters
	}
	var collector scanner.MachineCollector
	if s.libvirt != nil {
		collector = s.libvirt
	}
	s.scanner = scanner.New(scanner.Config{
		Store: s.store, Recoverer: s.metrics.recoverer(s.clusters), Infra: s.infra, Self: s.self, Lease: s.lease, Running: s.runner.Running,
		Encode: service.EncodeJobError, Adopter: adopter, MaxAttempts: int32(cfg.MaxOperationAttempts),
		PeerTimeout: cfg.PeerTimeout, ScanInterval: cfg.ScanInterval,
		ReconcileInterval: cfg.ReconcileInterval, JobRetention: cfg.JobRetention, ChangeRetention: cfg.WatchRetention, Logger: s.log,
		Collector: collector, OrphanMachineGrace: cfg.OrphanMachineGrace,
	})

	s.grpc = grpc.NewServer(append(s.interceptors(),
		grpc.Creds(newTransportCredentials(s.certs)),
		grpc.ForceServerCodecV2(s.codec),
		grpc.MaxRecvMsgSize(maxGRPCMessage),
		grpc.NumStreamWorkers(streamWorkers()))...)
	clv1.RegisterClusterLifecycleServer(s.grpc, s.clusters)
	clv1.RegisterCatalogServer(s.grpc, service.NewCatalogService(s.store, s.clusters))
	clv1.RegisterQuotasServer(s.grpc, s.quotas)
	longrunningpb.RegisterOperationsServer(s.grpc, s.ops)
	if s.libvirt == nil {
		clv1.RegisterSimulatorServer(s.grpc, service.NewSimulator(s.sim))
	}
	s.health = health.NewServer()
	healthpb.RegisterHealthServer(s.grpc, s.health)
	s.setHealth(healthpb.HealthCheckResponse_SERVING) // the database answered and the lease is held
	s.health.SetServingStatus(LivenessService, healthpb.HealthCheckResponse_SERVING)
	reflection.Register(s.grpc)
	s.metrics.grpc.InitializeMetrics(s.grpc)
	s.metrics.watch(s.store, s.scanner, s.quotas, s.log)

	// Past this point a failure closes the listeners, gives the server id
	// back and closes the store.
	for _, step := range []func() error{func() error { return s.gateway(ctx) }, s.listenDebug, s.listenHealth} {
		if err := step(); err != nil {
			for _, l := range []net.Listener{s.grpcLis, s.httpLis, s.debugLis, s.healthLis} {
				if l != nil {
					_ = l.Close()
				}
			}
			_ = s.lease.Release(ctx)
			cleanup()
			return nil, err
		}
	}
	s.log.Info("clusterd ready", "server_id", cfg.ServerID, "incarnation", s.self.Incarnation, "on_owner_loss", cfg.OnOwnerLoss,
		"database", string(s.store.Backend()), "grpc", s.GRPCAddr(), "http", s.HTTPAddr(), "infra", cfg.Infra,
		"identities", s.identities(), "tls", s.certs != nil)
	return s, nil
}

// maxGRPCMessage bounds a gRPC request; the largest valid one is a few
// kilobytes.
const maxGRPCMessage = 256 << 10

// identities says, for the log, which identities the server accepts.
func (s *Server) identities() string {
	switch {
	case s.auth.DevMode():
		return "development mode (x-clusterd-account header, loopback only)"
	case s.cfg.AuthTokens != "" && s.certs != nil && s.certs.clientCAs != nil:
		return "bearer tokens and client certificates"
	case s.cfg.AuthTokens != "":
		return "bearer tokens"
	}
	return "client certificates"
}

// tlsConfig is the HTTP listener's TLS configuration, nil without TLS.
func (s *Server) tlsConfig() *tls.Config {
	if s.certs == nil {
		return nil
	}
	return s.certs.config()
}

// reload reads the token file and the TLS key pair again; what fails to
// load (a token file without identities included) leaves the previous one in
// force. A token table that loads ends the open calls whose credentials it
// no longer holds.
func (s *Server) reload() {
	if n, err := s.auth.Reload(); err != nil {
		s.log.Error("reload: auth tokens kept as they were", "error", err)
	} else if s.cfg.AuthTokens != "" {
		s.log.Info("reload: auth tokens loaded", "identities", n, "revoked_calls", s.calls.revoke(s.stillAuthenticates))
	}
	if s.certs != nil {
		if err := s.certs.reload(); err != nil {
			s.log.Error("reload: TLS key pair kept as it was", "error", err)
		} else {
			s.log.Info("reload: TLS key pair loaded", "cert", s.cfg.TLSCert)
		}
	}
}

// GRPCAddr is the address the gRPC server listens on.
func (s *Server) GRPCAddr() string { return s.grpcLis.Addr().String() }

// HTTPAddr is the address the REST gateway listens on.
func (s *Server) HTTPAddr() string { return s.httpLis.Addr().String() }

// Serve runs until ctx is cancelled or a listener fails, then shuts down
// (see shutdown) and returns once every goroutine it started has ended and
// the database is closed.
func (s *Server) Serve(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s.startBackground()
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	wg.Add(6)
	go func() {
		defer wg.Done()
		if err := s.grpc.Serve(s.grpcLis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			errs <- fmt.Errorf("gRPC server: %w", err)
		}
	}()
	go func() {
		defer wg.Done()
		if err := s.grpc.Serve(s.gatewayLis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			errs <- fmt.Errorf("gRPC server for the gateway: %w", err)
		}
	}()
	go func() {
		defer wg.Done()
		serve := s.http.Serve
		if s.certs != nil {
			serve = func(l net.Listener) error { return s.http.ServeTLS(l, "", "") }
		}
		if err := serve(s.httpLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errs <- fmt.Errorf("HTTP server: %w", err)
		}
	}()
	go func() {
		defer wg.Done()
		for {
			select {
			case <-ctx.Done():
				return
			case <-s.cfg.Reload:
				s.reload()
			}
		}
	}()
	go func() {
		defer wg.Done()
		s.serveDebug(ctx)
	}()
	healthDone := make(chan struct{})
	go func() {
		defer wg.Done()
		s.serveHealth(healthDone)
	}()

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errs:
	}
	cancel()
	shutdownErr := s.shutdown()
	close(healthDone) // the health port answers NOT_SERVING until the shutdown ends
	wg.Wait()
	return errors.Join(serveErr, shutdownErr)
}

// watchHealth keeps the health service's statuses in step with the
// database and the lease (see healthProbe); the health service, the REST
// gateway's /healthz and every registered service share one status.
func (s *Server) watchHealth(ctx context.Context) {
	healthProbe{
		interval: s.cfg.HealthInterval,
		timeout:  s.cfg.PeerTimeout,
		ping:     s.store.Ping,
		lease:    s.lease.Check,
		set:      s.setHealth,
		log:      s.log,
	}.run(ctx)
}

// LivenessService is the health service name an orchestrator's liveness
// probe asks for. It answers SERVING from the moment the server serves until
// it shuts down, whatever the database does: a server rides out a database
// outage (its operations wait and go on), so restarting it for one would only
// add a restart to the outage. Readiness asks for "" (or a service's name),
// which turns NOT_SERVING while the database is unavailable and takes the
// replica out of rotation.
const LivenessService = "liveness"

// setHealth sets the status of the whole server and of each service it
// registers: clients ask for either.
func (s *Server) setHealth(st healthpb.HealthCheckResponse_ServingStatus) {
	for _, name := range []string{"", clv1.ClusterLifecycle_ServiceDesc.ServiceName, longrunningpb.Operations_ServiceDesc.ServiceName, clv1.Simulator_ServiceDesc.ServiceName, clv1.Quotas_ServiceDesc.ServiceName} {
		s.health.SetServingStatus(name, st)
	}
}

// healthProbe decides the server's health: NOT_SERVING while the database
// refuses or fails a ping, or does not answer one within timeout, or this
// server does not hold its lease (its heartbeat lapsed, or another process
// took its server id); SERVING otherwise.
//
// A gRPC client doing health checking, or a load balancer, takes a server
// out of rotation the moment it reports NOT_SERVING, so NOT_SERVING must
// mean the server cannot do its work, not that it is slow. A ping is
// therefore given the peer timeout to answer (the time after which peers
// take this server for dead, and its lease lapses anyway), not the polling
// interval: on a busy machine, or behind SQLite's single writer connection
// busy with an operation's step, a ping can take longer than the interval
// and still answer. A ping that fails, or a lease that is lost, turns the
// server NOT_SERVING at once; there is no count of failures to wait for.
type healthProbe struct {
	interval time.Duration // between pings
	timeout  time.Duration // for one ping to answer
	ping     func(context.Context) error
	lease    func() error
	set      func(healthpb.HealthCheckResponse_ServingStatus)
	log      *slog.Logger
}

// run probes at once and then every interval until ctx is done, calling set
// on each change (New set SERVING: it had just pinged the database and
// acquired the lease).
func (p healthProbe) run(ctx context.Context) {
	t := time.NewTicker(p.interval)
	defer t.Stop()
	last := healthpb.HealthCheckResponse_SERVING
	for {
		pingCtx, cancel := context.WithTimeout(ctx, p.timeout)
		err := p.ping(pingCtx)
		cancel()
		if err == nil {
			err = p.lease()
		}
		st := healthpb.HealthCheckResponse_SERVING
		if err != nil {
			st = healthpb.HealthCheckResponse_NOT_SERVING
		}
		if ctx.Err() != nil {
			return
		}
		if st != last {
			if err != nil {
				p.log.Warn("NOT_SERVING", "error", err)
			} else {
				p.log.Info("database answering and lease held again: SERVING")
			}
			p.set(st)
			last = st
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (c *Config) defaults() error {
	if c.Database == "" {
		return errors.New("config: database is required")
	}
	if c.Infra == "" {
		c.Infra = "sim"
	}
	if c.Infra != "sim" && c.Infra != "libvirt" {
		return fmt.Errorf("config: unknown infrastructure %q (supported: sim, libvirt)", c.Infra)
	}
	if c.ServerID == "" {
		return errors.New("config: server id is required")
	}
	if c.DatabaseWait <= 0 {
		c.DatabaseWait = 60 * time.Second
	}
	if c.HeartbeatInterval <= 0 {
		c.HeartbeatInterval = lease.DefaultHeartbeatInterval
	}
	if c.PeerTimeout <= 0 {
		c.PeerTimeout = lease.DefaultPeerTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.HealthInterval <= 0 {
		c.HealthInterval = 2 * time.Second
	}
	if c.ShutdownTimeout <= 0 {
		c.ShutdownTimeout = 15 * time.Second
	}
	switch c.OnOwnerLoss {
	case "":
		c.OnOwnerLoss = OnOwnerLossResume
	case OnOwnerLossResume, OnOwnerLossFail:
	default:
		return fmt.Errorf("config: on-owner-loss %q is not %s or %s", c.OnOwnerLoss, OnOwnerLossResume, OnOwnerLossFail)
	}
	if c.MaxOperationAttempts <= 0 {
		c.MaxOperationAttempts = scanner.DefaultMaxAttempts
	}
	return nil
}

// streamWorkers is how many goroutines serve calls, each call after
// another (grpc.NumStreamWorkers); a call that finds them all busy gets a
// goroutine of its own, as without workers. A worker keeps the stack its
// calls grew, where a goroutine per call grew one afresh through the SQL
// driver's deep frames every time: stack growth was a tenth of clusterd's
// CPU in a GetCluster through the front door on SQLite.
func streamWorkers() uint32 {
	return uint32(4 * runtime.GOMAXPROCS(0))
}
