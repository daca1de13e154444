package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync/atomic"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
)

// certificates serves the TLS certificate of --tls-cert/--tls-key to both
// listeners and loads it again on SIGHUP, so a renewed certificate takes
// effect without a restart or a dropped connection.
type certificates struct {
	certFile, keyFile string
	current           atomic.Pointer[tls.Certificate]
	clientCAs         *x509.CertPool
}

// newCertificates loads the key pair and, if caFile is set, the client CA
// bundle that turns on mutual TLS. It returns nil when TLS is not
// configured.
func newCertificates(certFile, keyFile, caFile string) (*certificates, error) {
	switch {
	case certFile == "" && keyFile == "" && caFile == "":
		return nil, nil
	case certFile == "" || keyFile == "":
		return nil, errors.New("config: --tls-cert and --tls-key go together")
	}
	c := &certificates{certFile: certFile, keyFile: keyFile}
	if err := c.reload(); err != nil {
		return nil, err
	}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("config: --tls-client-ca: %w", err)
		}
		c.clientCAs = x509.NewCertPool()
		if !c.clientCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("config: --tls-client-ca %s holds no PEM certificate", caFile)
		}
	}
	return c, nil
}

// reload reads the key pair again; on error the current one stays.
func (c *certificates) reload() error {
	pair, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err != nil {
		return fmt.Errorf("config: TLS key pair %s, %s: %w", c.certFile, c.keyFile, err)
	}
	c.current.Store(&pair)
	return nil
}

// config is the TLS configuration of both listeners. A client certificate is
// verified when one is presented but not required at the handshake: health
// probes come without one, and a caller with neither certificate nor token
// gets a proper UNAUTHENTICATED instead of a broken handshake.
func (c *certificates) config() *tls.Config {
	cfg := &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return c.current.Load(), nil },
	}
	if c.clientCAs != nil {
		cfg.ClientCAs = c.clientCAs
		cfg.ClientAuth = tls.VerifyClientCertIfGiven
	}
	return cfg
}

// gatewayListener is the in-process listener the REST gateway reaches the
// gRPC server through. Its connections are marked, so the server knows that
// a call came from the gateway (which authenticated the HTTP request's TLS
// client certificate) and from nowhere else.
type gatewayListener struct {
	*bufconn.Listener
}

func newGatewayListener() gatewayListener {
	return gatewayListener{bufconn.Listen(1 << 20)}
}

// Accept marks each connection as the gateway's.
func (l gatewayListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return gatewayConn{c}, nil
}

// dial connects the gateway's gRPC client to the listener.
func (l gatewayListener) dial(ctx context.Context, _ string) (net.Conn, error) {
	return l.DialContext(ctx)
}

type gatewayConn struct{ net.Conn }

// gatewayInfo is the AuthInfo of calls from the in-process gateway.
type gatewayInfo struct{ credentials.CommonAuthInfo }

// AuthType names the in-process gateway.
func (gatewayInfo) AuthType() string { return "clusterd-gateway" }

// transportCredentials are the gRPC server's: TLS (or none) on the network
// listener, and no handshake on the in-process gateway connection, which
// nobody outside the process can reach.
type transportCredentials struct {
	credentials.TransportCredentials
}

func newTransportCredentials(certs *certificates) credentials.TransportCredentials {
	if certs == nil {
		return transportCredentials{insecure.NewCredentials()}
	}
	return transportCredentials{credentials.NewTLS(certs.config())}
}

// ServerHandshake skips the handshake for the gateway's connections.
func (t transportCredentials) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	if _, ok := conn.(gatewayConn); ok {
		return conn, gatewayInfo{credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}}, nil
	}
	return t.TransportCredentials.ServerHandshake(conn)
}

// Clone keeps the gateway exception.
func (t transportCredentials) Clone() credentials.TransportCredentials {
	return transportCredentials{t.TransportCredentials.Clone()}
}

// loopbackOnly refuses to serve in development mode (no identities) on any
// address but loopback: there the account header is trusted, so anyone who
// can connect can act as any account.
func loopbackOnly(listeners ...net.Listener) error {
	var exposed []string
	for _, l := range listeners {
		a, ok := l.Addr().(*net.TCPAddr)
		if !ok || !a.IP.IsLoopback() {
			exposed = append(exposed, l.Addr().String())
		}
	}
	if len(exposed) == 0 {
		return nil
	}
	return fmt.Errorf("config: refusing to serve without identities on %s (not a loopback address): "+
		"configure --auth-tokens FILE (lines `sha256:<hex of the token's SHA-256> <account> <user|admin>`) "+
		"and/or --tls-cert, --tls-key and --tls-client-ca for client certificates; "+
		"or listen on 127.0.0.1 for development mode", strings.Join(exposed, " and "))
}
