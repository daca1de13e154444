// Command clusterd runs the cluster lifecycle service. It only turns flags
// (each with a CLUSTERD_* environment twin) into a server.Config and calls
// server.Run; SIGINT or SIGTERM stops it gracefully.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/clusterd/clusterd/infra/libvirt"
	"github.com/clusterd/clusterd/lease"
	"github.com/clusterd/clusterd/scanner"
	"github.com/clusterd/clusterd/server"
	"github.com/clusterd/clusterd/service"
	"github.com/clusterd/clusterd/version"
)

func main() {
	if err := run(os.Args[1:], os.Getenv, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		if errors.Is(err, errVersion) {
			fmt.Println(version.Get().String("clusterd"))
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "clusterd:", err)
		os.Exit(1)
	}
}

func run(args []string, getenv func(string) string, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "rotate-secrets" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		return rotateSecrets(ctx, args[1:], getenv, os.Stdout, stderr)
	}
	if len(args) > 0 && args[0] == "health" {
		return healthCheck(args[1:], getenv, os.Stdout, stderr)
	}
	cfg, _, err := parse(args, getenv, stderr)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	reload := make(chan os.Signal, 1)
	signal.Notify(reload, syscall.SIGHUP)
	defer signal.Stop(reload)
	cfg.Reload = reload
	return server.Run(ctx, cfg)
}

// parse reads flags; a flag not given on the command line takes its
// CLUSTERD_* environment twin (--grpc-addr <- CLUSTERD_GRPC_ADDR), then its default.
func parse(args []string, getenv func(string) string, stderr io.Writer) (server.Config, slog.Level, error) {
	host, _ := os.Hostname()
	if host == "" {
		host = "clusterd"
	}
	var cfg server.Config
	var level slog.Level
	fs := flag.NewFlagSet("clusterd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.Database, "database", "sqlite:clusterd.db", "database: sqlite:<path> or mysql://user:pass@host:port/db")
	fs.StringVar(&cfg.GRPCAddr, "grpc-addr", "127.0.0.1:9090", "gRPC listen address")
	fs.StringVar(&cfg.HTTPAddr, "http-addr", "127.0.0.1:8080", "REST gateway listen address (also /healthz and /openapi.json)")
	fs.StringVar(&cfg.ServerID, "server-id", "", "this server's id among its peers; unique per live process (default: host name and gRPC port, e.g. "+host+":9090)")
	fs.DurationVar(&cfg.DatabaseWait, "database-wait", 60*time.Second, "how long start-up waits for the database to answer and to take the write that registers this server")
	fs.StringVar(&cfg.Infra, "infra", "sim", "infrastructure driver: sim, or libvirt (real VMs; see --libvirt-*)")
	fs.StringVar(&cfg.Libvirt.URI, "libvirt-uri", "qemu:///system", "libvirt connection of --infra libvirt (test+unix:///default: libvirt's test driver)")
	fs.StringVar(&cfg.Libvirt.PoolDir, "libvirt-pool-dir", "/var/lib/clusterd/libvirt", "folder of the libvirt storage pool: machines' state volumes, agent sockets, cached ISOs")
	fs.StringVar(&cfg.Libvirt.Pool, "libvirt-pool", "clusterd", "name of the libvirt storage pool (a dir pool on --libvirt-pool-dir, created when missing)")
	fs.StringVar(&cfg.Libvirt.Kernel, "node-kernel", "", "kernel of the node image, booted directly (make node-image)")
	fs.StringVar(&cfg.Libvirt.Initrd, "node-initrd", "", "initramfs of the node image, with the node agent (make node-image)")
	fs.Func("libvirt-offerings", "VM size of each service offering, name:cpus:memoryMiB,... (default: every offering 1 vCPU, 128-256 MiB)", func(v string) error {
		offers, err := libvirt.ParseOfferings(v)
		cfg.Libvirt.Offerings = offers
		return err
	})
	fs.DurationVar(&cfg.SimStepDelay, "sim-step-delay", 100*time.Millisecond, "time every simulated infrastructure step takes")
	catalog := service.DefaultCatalog()
	cfg.Catalog = &catalog
	fs.Func("kubernetes-versions", "Kubernetes versions that seed an empty catalog at start, comma-separated; once the database holds versions, admins manage them through the API (default "+strings.Join(catalog.Versions, ",")+")", func(v string) error {
		vs, err := service.ParseVersions(v)
		catalog.Versions = vs
		return err
	})
	fs.Func("service-offerings", "service offerings that seed an empty catalog at start, as name:vCPUs:memoryMB, comma-separated; once the database holds offerings, admins manage them through the API (default small:1:1024,medium:2:2048,large:4:8192,xlarge:8:16384)", func(v string) error {
		os, err := service.ParseOfferings(v)
		catalog.Offerings = os
		return err
	})
	fs.Func("default-quota", "limits of every account an admin set no quota for, e.g. clusters=10,nodes=100,cpus=400,memory_mb=819200; a limit not named is unlimited (default: unlimited)", func(v string) error {
		l, err := service.ParseQuota(v)
		cfg.DefaultQuota = l
		return err
	})
	fs.Func("max-cluster-size", "the most nodes (control + workers) a cluster may have (default 50)", func(v string) error {
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil || n < 2 {
			return fmt.Errorf("want an integer of at least 2")
		}
		catalog.MaxClusterSize = int32(n)
		return nil
	})
	cfg.Deadlines = service.Deadlines{Default: time.Hour}
	fs.Func("operation-deadline", "how long an operation may run: a duration, optionally with per-kind overrides (e.g. 1h,create=30m,upgrade=2h; default 1h)", func(v string) error {
		d, err := service.ParseDeadlines(v)
		cfg.Deadlines = d
		return err
	})
	fs.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", 0, "how long graceful shutdown may take (default 15s)")
	fs.DurationVar(&cfg.HeartbeatInterval, "heartbeat-interval", lease.DefaultHeartbeatInterval, "how often this server tells its peers it is alive (and looks for cancels of its operations sent through a peer)")
	fs.DurationVar(&cfg.PeerTimeout, "peer-timeout", lease.DefaultPeerTimeout, "a server whose heartbeat is older than this is dead: its running operations are adopted by a live server (failed, and their clusters recovered, with --on-owner-loss=fail or past --max-operation-attempts)")
	fs.DurationVar(&cfg.ScanInterval, "scan-interval", scanner.DefaultScanInterval, "how often liveness and orphan recovery run")
	fs.DurationVar(&cfg.ReconcileInterval, "reconcile-interval", 10*time.Second, "how often resting clusters are reconciled against the infrastructure")
	fs.DurationVar(&cfg.OrphanMachineGrace, "orphan-machine-grace", scanner.DefaultOrphanMachineGrace, "with --infra libvirt, a domain of a destroyed or unknown cluster (in this server's storage pool) older than this is removed")
	fs.DurationVar(&cfg.JobRetention, "job-retention", 7*24*time.Hour, "finished operations, and the simulator's log of infrastructure calls, are purged after this")
	fs.DurationVar(&cfg.WatchRetention, "watch-retention", scanner.DefaultChangeRetention, "the change feed watches read keeps its rows this long; a watch resumed from an older token is refused (WATCH_EXPIRED)")
	fs.IntVar(&cfg.MaxWatchesPerAccount, "max-watches-per-account", service.DefaultMaxWatchesPerAccount, "how many WatchClusters and WatchOperation streams one account may have open on this server (RESOURCE_EXHAUSTED, WATCH_LIMIT, past it)")
	fs.StringVar(&cfg.OnOwnerLoss, "on-owner-loss", server.OnOwnerLossResume, "what becomes of a running operation whose server stops or dies: resume (handed off on a graceful stop, adopted by a live server and run on from its last step) or fail (failed, its cluster recovered)")
	fs.IntVar(&cfg.MaxOperationAttempts, "max-operation-attempts", 3, "with --on-owner-loss=resume, an operation that has run this many times fails when its server is lost again")
	fs.TextVar(&level, "log-level", slog.LevelInfo, "log level: DEBUG, INFO, WARN or ERROR")
	logFormat := fs.String("log-format", "text", "log format: text (key=value) or json (one object a line)")
	fs.StringVar(&cfg.HealthAddr, "health-addr", "", "also serve the gRPC health service alone on this address, in plaintext and without identities (for Kubernetes' gRPC probes, which speak neither TLS nor tokens; off by default)")
	fs.StringVar(&cfg.DebugAddr, "debug-addr", "", "serve net/http/pprof on this address (off by default; loopback only unless identities are configured, and then for admins only)")
	showVersion := fs.Bool("version", false, "print the version, commit and Go version, and exit")
	fs.StringVar(&cfg.AuthTokens, "auth-tokens", "", "file of identities, one a line: sha256:<hex of the token's SHA-256> <account> <user|admin> (re-read on SIGHUP)")
	fs.StringVar(&cfg.TLSCert, "tls-cert", "", "PEM certificate: serve gRPC and REST over TLS (re-read on SIGHUP)")
	fs.StringVar(&cfg.TLSKey, "tls-key", "", "PEM private key of --tls-cert")
	fs.StringVar(&cfg.SecretsKeyFile, "secrets-key-file", "", "file of the keys that encrypt the clusters' CA and admin keys in the database, mode 0600: lines `<key id> <base64 of 32 bytes>`, the first one current (required with identities; development mode makes <sqlite file>.secrets-key)")
	fs.StringVar(&cfg.TLSClientCA, "tls-client-ca", "", "PEM CA bundle: verify client certificates (mutual TLS); a certificate's CN is its account, OU=clusterd-admin makes it an admin")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: clusterd [flags]\n       clusterd rotate-secrets --secrets-key-file F --database D\n       clusterd health [--grpc-addr A] [--service liveness]\n\nEvery flag can also be set as CLUSTERD_<FLAG> (e.g. CLUSTERD_GRPC_ADDR).")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return cfg, level, err
	}
	if fs.NArg() > 0 {
		return cfg, level, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if *showVersion {
		return cfg, level, errVersion
	}
	if err := envTwins(fs, getenv); err != nil {
		return cfg, level, err
	}
	if cfg.ServerID == "" {
		cfg.ServerID = defaultServerID(host, cfg.GRPCAddr)
	}
	handler, err := server.NewLogHandler(stderr, *logFormat, level)
	if err != nil {
		return cfg, level, fmt.Errorf("--log-format: %w", err)
	}
	cfg.Logger = slog.New(handler)
	return cfg, level, nil
}

// defaultServerID is the host name and the gRPC port: unique per live
// process on a host, since no two can listen on one port, and the same
// across restarts, so a restarted process takes its own id over at once.
// Without a fixed port, the process id stands in for it.
func defaultServerID(host, grpcAddr string) string {
	if _, port, err := net.SplitHostPort(grpcAddr); err == nil && port != "" && port != "0" {
		return host + ":" + port
	}
	return fmt.Sprintf("%s:pid%d", host, os.Getpid())
}

// envTwins sets each flag of fs that the command line did not give from
// its environment twin, when that is set (only the named flags, when names
// are given; never --version, which has no twin). A value the flag refuses
// is an error naming the variable.
func envTwins(fs *flag.FlagSet, getenv func(string) string, names ...string) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if err != nil || given[f.Name] || f.Name == "version" || len(names) > 0 && !slices.Contains(names, f.Name) {
			return
		}
		env := envName(f.Name)
		if v := getenv(env); v != "" {
			if e := f.Value.Set(v); e != nil {
				err = fmt.Errorf("%s=%q: %w", env, v, e)
			}
		}
	})
	return err
}

// envName is a flag's environment twin: --grpc-addr <- CLUSTERD_GRPC_ADDR.
func envName(flag string) string {
	return "CLUSTERD_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// errVersion asks main to print the version (--version) instead of serving.
var errVersion = errors.New("version requested")
