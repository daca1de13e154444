package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/clusterd/clusterd/client"
	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
)

// defaultTimeout bounds each request (not a --wait).
const defaultTimeout = 30 * time.Second

// durationFlag is --timeout: a positive duration.
type durationFlag struct{ d time.Duration }

// String shows the default in --help.
func (f *durationFlag) String() string { return f.d.String() }

// Type names the value in --help.
func (f *durationFlag) Type() string { return "duration" }

// Set parses a Go duration ("30s", "2m").
func (f *durationFlag) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return fmt.Errorf("want a positive duration such as 30s")
	}
	f.d = d
	return nil
}

// connect opens the client once per run, from the global flags.
func (a *app) connect() (*client.Client, error) {
	if a.client != nil {
		return a.client, nil
	}
	var opts []client.Option
	addr, _, err := serverAddress(a.server)
	if err != nil {
		return nil, usageError{err}
	}
	secure := a.secure()
	if secure {
		cfg, err := a.tlsConfig()
		if err != nil {
			return nil, usageError{err}
		}
		opts = append(opts, client.WithTLS(cfg))
	}
	if a.token == "" && a.tokenFile != "" {
		data, err := os.ReadFile(a.tokenFile)
		if err != nil {
			return nil, usageError{fmt.Errorf("--token-file: %w", err)}
		}
		if a.token = strings.TrimSpace(string(data)); a.token == "" {
			return nil, usageError{fmt.Errorf("--token-file %s is empty", a.tokenFile)}
		}
	}
	if a.token != "" {
		if !secure && !loopback(addr) {
			fmt.Fprintf(a.stderr, "clusterctl: warning: sending the token to %s without TLS\n", a.server)
		}
		opts = append(opts, client.WithToken(a.token))
	}
	if a.account != "" {
		opts = append(opts, client.WithAccount(a.account))
	}
	c, err := client.New(addr, opts...)
	if err != nil {
		return nil, usageError{err}
	}
	a.client = c
	return c, nil
}

// secure reports whether this run connects over TLS: --tls, any other
// --tls-* flag, or an https:// (grpcs://) --server.
func (a *app) secure() bool {
	_, scheme, _ := serverAddress(a.server)
	return a.useTLS || a.tlsCA != "" || a.tlsCert != "" || a.tlsKey != "" || a.tlsServerName != "" ||
		scheme == "https" || scheme == "grpcs"
}

// serverAddress reads --server: host:port, or a URL whose scheme says the
// transport (https:// and grpcs:// are TLS; http:// and grpc:// plaintext)
// and whose port defaults to the scheme's (443, 80; clusterd's 9090 for
// grpc:// and grpcs://). It returns the host:port to dial and the scheme
// ("" for host:port).
func serverAddress(server string) (addr, scheme string, err error) {
	if !strings.Contains(server, "://") {
		return server, "", nil
	}
	u, err := url.Parse(server)
	if err != nil {
		return "", "", fmt.Errorf("--server %q: %w", server, err)
	}
	scheme = strings.ToLower(u.Scheme)
	ports := map[string]string{"https": "443", "http": "80", "grpc": "9090", "grpcs": "9090"}
	port, ok := ports[scheme]
	if !ok {
		return "", "", fmt.Errorf("--server %q: want host:port or an http://, https://, grpc:// or grpcs:// URL", server)
	}
	if u.Hostname() == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		return "", "", fmt.Errorf("--server %q: want scheme://host[:port], without a path", server)
	}
	if u.Port() != "" {
		port = u.Port()
	}
	return net.JoinHostPort(u.Hostname(), port), scheme, nil
}

// tlsConfig builds the TLS configuration of the --tls-* flags.
func (a *app) tlsConfig() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: a.tlsServerName}
	if a.tlsCA != "" {
		pem, err := os.ReadFile(a.tlsCA)
		if err != nil {
			return nil, fmt.Errorf("--tls-ca: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--tls-ca %s holds no PEM certificate", a.tlsCA)
		}
	}
	switch {
	case a.tlsCert != "" && a.tlsKey != "":
		pair, err := tls.LoadX509KeyPair(a.tlsCert, a.tlsKey)
		if err != nil {
			return nil, fmt.Errorf("--tls-cert, --tls-key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	case a.tlsCert != "" || a.tlsKey != "":
		return nil, errors.New("--tls-cert and --tls-key go together")
	}
	return cfg, nil
}

// loopback reports whether addr's host is a loopback address or localhost.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// call bounds one request by --timeout.
func (a *app) call(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, a.timeout.d)
}

// listAll reads every page of a list, each call under its own timeout,
// until the last page or until it holds limit items (0: no limit).
func listAll[T any](ctx context.Context, a *app, limit int, page func(ctx context.Context, token string) ([]T, string, error)) ([]T, error) {
	var all []T
	token := ""
	for {
		callCtx, cancel := a.call(ctx)
		items, next, err := page(callCtx, token)
		cancel()
		if err != nil {
			return nil, err
		}
		all = append(all, items...)
		if token = next; token == "" || (limit > 0 && len(all) >= limit) {
			break
		}
	}
	if limit > 0 && len(all) > limit {
		all = all[:limit]
	}
	return all, nil
}

// dnsLabel is a display name (clusterd's rule for them).
var dnsLabel = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// clusterName turns a CLUSTER argument into clusters/{uuid}: a resource
// name or a bare uuid as is, a display name by looking it up (in the
// caller's account, or every account an admin sees: then it must be unique).
func (a *app) clusterName(ctx context.Context, arg string) (string, error) {
	if strings.HasPrefix(arg, "clusters/") {
		return arg, nil
	}
	if _, err := uuid.Parse(arg); err == nil {
		return "clusters/" + arg, nil
	}
	if !dnsLabel.MatchString(arg) {
		return "", usageError{fmt.Errorf("%q is neither clusters/{uuid}, a uuid, nor a display name", arg)}
	}
	c, err := a.connect()
	if err != nil {
		return "", err
	}
	ctx, cancel := a.call(ctx)
	defer cancel()
	resp, err := c.Clusters.ListClusters(ctx, &clv1.ListClustersRequest{Filter: `display_name = "` + arg + `"`, PageSize: 10})
	if err != nil {
		return "", fmt.Errorf("look up cluster %q: %w", arg, err)
	}
	switch cs := resp.GetClusters(); len(cs) {
	case 0:
		return "", notFoundError(fmt.Sprintf("no cluster named %q", arg))
	case 1:
		if a.named == nil {
			a.named = map[string]string{}
		}
		a.named[cs[0].GetName()] = arg
		return cs[0].GetName(), nil
	default:
		var names []string
		for _, c := range cs {
			names = append(names, c.GetName()+" (account "+c.GetAccount()+")")
		}
		return "", usageError{fmt.Errorf("%d clusters are named %q: %s; name one by id or pass --account", len(cs), arg, strings.Join(names, ", "))}
	}
}

// operationName turns an OPERATION argument into operations/{id}.
func operationName(arg string) string {
	if strings.HasPrefix(arg, "operations/") {
		return arg
	}
	return "operations/" + arg
}

// machineNames turns MACHINE arguments into machines/{id}.
func machineNames(args []string) []string {
	out := make([]string, len(args))
	for i, m := range args {
		if !strings.HasPrefix(m, "machines/") {
			m = "machines/" + m
		}
		out[i] = m
	}
	return out
}
