package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/clusterd/clusterd/server"
)

// healthCheck asks the gRPC health service of a clusterd on this host and fails
// unless it answers SERVING. It is the image's HEALTHCHECK: an image built
// from scratch has no shell or probe binary, so the server binary probes
// itself. It reads the server's own flags' environment twins
// (CLUSTERD_GRPC_ADDR, CLUSTERD_TLS_CERT), so a container configured for the
// server through its environment is configured for its check (flags given
// to the server's command line are not seen); a wildcard listen address is
// asked on loopback.
//
// Over TLS the server's certificate is not verified: the check sends no
// credentials and only reads a status, and the certificate, issued for the
// service's public name, would not match the loopback address anyway.
func healthCheck(args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("clusterd health", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("grpc-addr", "127.0.0.1:9090", "gRPC address of the server to check")
	service := fs.String("service", "", `health service name: "" (ready: the database answers and the lease is held) or "`+server.LivenessService+`" (alive: serving, whatever the database does)`)
	tlsCert := fs.String("tls-cert", "", "the server serves TLS (any value: its certificate file, as the server's flag)")
	timeout := fs.Duration("timeout", 5*time.Second, "how long the check may take")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: clusterd health [flags]\n\nExit 0 when the server answers SERVING. --grpc-addr and --tls-cert take CLUSTERD_GRPC_ADDR and CLUSTERD_TLS_CERT when not given.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("health: unexpected arguments: %v", fs.Args())
	}
	if err := envTwins(fs, getenv, "grpc-addr", "tls-cert"); err != nil {
		return fmt.Errorf("health: %w", err)
	}
	target, err := probeAddr(*addr)
	if err != nil {
		return fmt.Errorf("health: --grpc-addr %q: %w", *addr, err)
	}
	creds := insecure.NewCredentials()
	if *tlsCert != "" {
		creds = credentials.NewTLS(&tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}) //nolint:gosec // see the doc comment
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(creds))
	if err != nil {
		return fmt.Errorf("health: %w", err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: *service}, grpc.WaitForReady(true))
	if err != nil {
		return fmt.Errorf("health: %s: %w", target, err)
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("health: %s: %s", target, resp.GetStatus())
	}
	fmt.Fprintln(stdout, resp.GetStatus())
	return nil
}

// probeAddr turns a listen address into one to dial: a wildcard or missing
// host is this host's loopback.
func probeAddr(listen string) (string, error) {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", err
	}
	if port == "" || port == "0" {
		return "", fmt.Errorf("no fixed port")
	}
	// Go's wildcard listeners, [::] too, take IPv4 as well, and 127.0.0.1
	// answers where IPv6 is off.
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port), nil
}
