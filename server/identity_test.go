package server

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/clusterd/clusterd/auth"
	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/repository/repotest"
	"github.com/clusterd/clusterd/service"
)

// pki is a throwaway CA with a server certificate for 127.0.0.1 and client
// certificates, written as PEM files.
type pki struct {
	dir    string
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	serial int64
	pool   *x509.CertPool
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "clusterd test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	p := &pki{dir: t.TempDir(), caKey: key, serial: 1}
	if p.ca, err = x509.ParseCertificate(der); err != nil {
		t.Fatal(err)
	}
	p.pool = x509.NewCertPool()
	p.pool.AddCert(p.ca)
	p.write(t, "ca.pem", "CERTIFICATE", der)
	return p
}

func (p *pki) write(t *testing.T, name, kind string, der []byte) string {
	t.Helper()
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// issue signs a certificate; it returns the PEM paths and the key pair.
func (p *pki) issue(t *testing.T, name string, subject pkix.Name, server bool) (string, string, tls.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p.serial++
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(p.serial), Subject: subject,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPath := p.write(t, name+".pem", "CERTIFICATE", der)
	keyPath := p.write(t, name+"-key.pem", "EC PRIVATE KEY", keyDER)
	pair, err := tls.LoadX509KeyPair(certPath, keyPath)
	if err != nil {
		t.Fatal(err)
	}
	return certPath, keyPath, pair
}

// tlsClient dials the server over TLS, with a client certificate if given.
func tlsClient(t *testing.T, p *pki, addr string, cert *tls.Certificate) *grpc.ClientConn {
	t.Helper()
	cfg := &tls.Config{RootCAs: p.pool, MinVersion: tls.VersionTLS12}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func httpsClient(p *pki, cert *tls.Certificate) *http.Client {
	cfg := &tls.Config{RootCAs: p.pool, MinVersion: tls.VersionTLS12}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}, Timeout: 30 * time.Second}
}

func codeOf(t *testing.T, err error) (codes.Code, string) {
	t.Helper()
	if err == nil {
		return codes.OK, ""
	}
	code, reason, _ := errorInfo(t, err)
	return code, reason
}

// TestIdentity_MutualTLS serves gRPC and REST over TLS with client
// certificates as the only identities: a certificate's CN is its account,
// OU=clusterd-admin makes an admin; no certificate is UNAUTHENTICATED, health
// needs none; and no header, whether sent to the gRPC port or to REST,
// stands in for a certificate.
func TestIdentity_MutualTLS(t *testing.T) {
	b := repotest.Backends(t)[0]
	p := newPKI(t)
	certFile, keyFile, _ := p.issue(t, "server", pkix.Name{CommonName: "clusterd"}, true)
	_, _, teamA := p.issue(t, "team-a", pkix.Name{CommonName: "team-a", OrganizationalUnit: []string{"eng"}}, false)
	_, _, teamB := p.issue(t, "team-b", pkix.Name{CommonName: "team-b"}, false)
	_, _, ops := p.issue(t, "ops", pkix.Name{CommonName: "ops", OrganizationalUnit: []string{auth.AdminOU}}, false)
	h := start(t, b, func(c *Config) {
		c.TLSCert, c.TLSKey, c.TLSClientCA = certFile, keyFile, filepath.Join(p.dir, "ca.pem")
	})
	ctx := tctx(t)

	asA := clv1.NewClusterLifecycleClient(tlsClient(t, p, h.srv.GRPCAddr(), &teamA))
	op, err := asA.CreateCluster(ctx, &clv1.CreateClusterRequest{Cluster: fxCluster("tls", 1)})
	if err != nil {
		t.Fatalf("create with team-a's certificate: %v", err)
	}
	c, err := asA.GetCluster(ctx, &clv1.GetClusterRequest{Name: fxMetadata(t, op).GetCluster()})
	if err != nil || c.GetAccount() != "team-a" {
		t.Fatalf("team-a's cluster = %v, %v; want account team-a", c, err)
	}
	asB := clv1.NewClusterLifecycleClient(tlsClient(t, p, h.srv.GRPCAddr(), &teamB))
	if code, reason := codeOf(t, get(asB, ctx, c.GetName())); code != codes.NotFound || reason != service.ReasonNotFound {
		t.Errorf("team-b reads team-a's cluster: %v %s; want NOT_FOUND", code, reason)
	}
	asOps := tlsClient(t, p, h.srv.GRPCAddr(), &ops)
	if err := get(clv1.NewClusterLifecycleClient(asOps), ctx, c.GetName()); err != nil {
		t.Errorf("admin certificate reads team-a's cluster: %v", err)
	}
	if _, err := clv1.NewSimulatorClient(asOps).ListHeld(ctx, &clv1.ListHeldRequest{}); err != nil {
		t.Errorf("admin certificate calls the Simulator: %v", err)
	}
	if _, err := clv1.NewSimulatorClient(tlsClient(t, p, h.srv.GRPCAddr(), &teamA)).ListHeld(ctx, &clv1.ListHeldRequest{}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("user certificate calls the Simulator: %v; want PERMISSION_DENIED", err)
	}

	anon := tlsClient(t, p, h.srv.GRPCAddr(), nil)
	if code, reason := codeOf(t, get(clv1.NewClusterLifecycleClient(anon), ctx, c.GetName())); code != codes.Unauthenticated || reason != service.ReasonCredentialsMissing {
		t.Errorf("no certificate: %v %s; want UNAUTHENTICATED CREDENTIALS_MISSING", code, reason)
	}
	waitServing(ctx, t, anon, "")
	if resp, err := healthpb.NewHealthClient(anon).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health without credentials: %v, %v; want SERVING", resp, err)
	}
	// The header the gateway uses to forward a verified certificate means
	// nothing when a client sends it to the gRPC port.
	forged := metadata.AppendToOutgoingContext(ctx, verifiedClientHeader, base64.StdEncoding.EncodeToString(ops.Leaf.Raw), auth.AccountHeader, "team-a")
	if code, _ := codeOf(t, get(clv1.NewClusterLifecycleClient(anon), forged, c.GetName())); code != codes.Unauthenticated {
		t.Errorf("forged forwarded certificate over gRPC: %v; want UNAUTHENTICATED", code)
	}
	// A plaintext client cannot talk to the TLS port at all.
	plain, err := grpc.NewClient(h.srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if err := get(clv1.NewClusterLifecycleClient(plain), ctx, c.GetName()); status.Code(err) != codes.Unavailable {
		t.Errorf("plaintext call to a TLS server: %v; want UNAVAILABLE", err)
	}

	// REST over TLS: the certificate is the identity, forged headers are not.
	url := "https://" + h.srv.HTTPAddr() + "/v1/" + c.GetName()
	for _, tc := range []struct {
		name    string
		cert    *tls.Certificate
		headers map[string]string
		want    int
	}{
		{"team-a's certificate", &teamA, nil, http.StatusOK},
		{"team-b's certificate", &teamB, nil, http.StatusNotFound},
		{"admin certificate", &ops, nil, http.StatusOK},
		{"no certificate", nil, nil, http.StatusUnauthorized},
		{"forged forwarded certificate", nil, map[string]string{"X-Clusterd-Verified-Client": base64.StdEncoding.EncodeToString(ops.Leaf.Raw)}, http.StatusUnauthorized},
		{"forged through Grpc-Metadata", nil, map[string]string{"Grpc-Metadata-X-Clusterd-Verified-Client": base64.StdEncoding.EncodeToString(ops.Leaf.Raw)}, http.StatusUnauthorized},
		{"team-b forges it too", &teamB, map[string]string{"X-Clusterd-Verified-Client": base64.StdEncoding.EncodeToString(teamA.Leaf.Raw)}, http.StatusNotFound},
	} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		for k, v := range tc.headers {
			req.Header.Set(k, v)
		}
		resp, err := httpsClient(p, tc.cert).Do(req)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("REST %s: %d %s; want %d", tc.name, resp.StatusCode, body, tc.want)
		}
	}
	waitServing(ctx, t, anon, "")
	resp, err := httpsClient(p, nil).Get("https://" + h.srv.HTTPAddr() + "/healthz")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("REST /healthz without credentials: %v, %v; want 200", resp, err)
	}
	if resp != nil {
		resp.Body.Close()
	}
}

func get(c clv1.ClusterLifecycleClient, ctx context.Context, name string) error {
	_, err := c.GetCluster(ctx, &clv1.GetClusterRequest{Name: name})
	return err
}

// TestIdentity_DevelopmentModeIsLoopbackOnly: without identities the server
// refuses a listener that is not loopback, saying how to configure them;
// with a token file it serves there.
func TestIdentity_DevelopmentModeIsLoopbackOnly(t *testing.T) {
	b := repotest.Backends(t)[0]
	for _, tc := range []struct{ grpcAddr, httpAddr string }{
		{"0.0.0.0:0", "127.0.0.1:0"},
		{"127.0.0.1:0", "[::]:0"},
	} {
		cfg := Config{Database: b.NewDSN(t), GRPCAddr: tc.grpcAddr, HTTPAddr: tc.httpAddr, ServerID: "dev",
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
		s, err := New(context.Background(), cfg)
		if err == nil {
			_ = s.grpcLis.Close()
			t.Fatalf("development mode on %s / %s started", tc.grpcAddr, tc.httpAddr)
		}
		for _, want := range []string{"refusing to serve without identities", "not a loopback address", "--auth-tokens", "--tls-client-ca"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not say %q", err, want)
			}
		}
	}
	h := start(t, b, withTokens(t), func(c *Config) { c.GRPCAddr, c.HTTPAddr = "0.0.0.0:0", "0.0.0.0:0" })
	if _, err := h.clients.clusters.ListClusters(tctx(t), &clv1.ListClustersRequest{}); err != nil {
		t.Errorf("with tokens on 0.0.0.0: %v", err)
	}
}

// TestIdentity_AdminActsForAnAccount: an admin sees every account, and with
// the account header acts for one: it creates there and sees only it. A
// user's header changes nothing.
func TestIdentity_AdminActsForAnAccount(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b, withTokens(t))
		ctx := tctx(t)
		create := func(ctx context.Context, name string) *clv1.Cluster {
			op, err := h.clients.clusters.CreateCluster(ctx, &clv1.CreateClusterRequest{Cluster: fxCluster(name, 1)})
			done := fxDone(t, h, op, err)
			c := &clv1.Cluster{}
			if err := done.GetResponse().UnmarshalTo(c); err != nil {
				t.Fatal(err)
			}
			return c
		}
		forB := metadata.AppendToOutgoingContext(ctx, auth.AccountHeader, "team-b")
		inB := create(forB, "made-for-b")
		own := create(ctx, "admins-own")
		userA := create(bearerContext(metadata.AppendToOutgoingContext(ctx, auth.AccountHeader, "team-b"), tokenA), "user-header")
		for _, tc := range []struct{ got, want string }{{inB.GetAccount(), "team-b"}, {own.GetAccount(), "ops"}, {userA.GetAccount(), "team-a"}} {
			if tc.got != tc.want {
				t.Errorf("cluster account %q; want %q", tc.got, tc.want)
			}
		}
		list := func(ctx context.Context) []string {
			resp, err := h.clients.clusters.ListClusters(ctx, &clv1.ListClustersRequest{})
			if err != nil {
				t.Fatal(err)
			}
			var out []string
			for _, c := range resp.GetClusters() {
				out = append(out, c.GetAccount())
			}
			return out
		}
		if got := strings.Join(list(ctx), ","); got != "team-b,ops,team-a" {
			t.Errorf("admin lists accounts %s; want every one", got)
		}
		if got := strings.Join(list(forB), ","); got != "team-b" {
			t.Errorf("admin acting for team-b lists accounts %s; want team-b only", got)
		}
		if err := get(h.clients.clusters, forB, userA.GetName()); status.Code(err) != codes.NotFound {
			t.Errorf("admin acting for team-b reads team-a's cluster: %v; want NOT_FOUND", err)
		}
		bad := metadata.AppendToOutgoingContext(ctx, auth.AccountHeader, "Team_B")
		if _, err := h.clients.clusters.ListClusters(bad, &clv1.ListClustersRequest{}); status.Code(err) != codes.InvalidArgument {
			t.Errorf("admin naming an invalid account: %v; want INVALID_ARGUMENT", err)
		}
	})
}

// TestIdentity_ReloadTokens: a reload (SIGHUP in clusterd) swaps the token
// file without dropping connections; a broken file keeps the old table.
func TestIdentity_ReloadTokens(t *testing.T) {
	b := repotest.Backends(t)[0]
	// Unbuffered: a send returns once the server took the signal, so the
	// second send below returns only after the first reload is done.
	reload := make(chan os.Signal)
	tokens := withTokens(t)
	var path string
	logs := &lockedBuffer{}
	h := start(t, b, tokens, func(c *Config) {
		path, c.Reload, c.Logger = c.AuthTokens, reload, slog.New(slog.NewTextHandler(logs, nil))
	})
	ops := longrunningpb.NewOperationsClient(bareConn(t, h))
	call := func(token string) codes.Code {
		_, err := ops.ListOperations(bearerContext(tctx(t), token), &longrunningpb.ListOperationsRequest{})
		return status.Code(err)
	}
	if got := call(tokenA); got != codes.OK {
		t.Fatalf("before reload: %v", got)
	}
	if err := os.WriteFile(path, []byte(tokenLine("fresh-token", "team-a", "user")+tokenLine(tokenAdmin, "ops", "admin")), 0o600); err != nil {
		t.Fatal(err)
	}
	reload <- syscall.SIGHUP
	waitFor(t, func() bool { return call("fresh-token") == codes.OK })
	if got := call(tokenA); got != codes.Unauthenticated {
		t.Errorf("a token removed from the file: %v; want UNAUTHENTICATED", got)
	}
	// A malformed file, and an empty one (which would lock every caller
	// out), are refused alike, and the log says why.
	kept := 0
	for name, file := range map[string]string{"malformed": "not a token line\n", "empty": "", "comments only": "# all revoked\n"} {
		if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
			t.Fatal(err)
		}
		reload <- syscall.SIGHUP
		reload <- syscall.SIGHUP
		// The second send returns as its reload begins: the file is written
		// again only once both reloads have read it and logged.
		kept += 2
		waitFor(t, func() bool { return strings.Count(logs.String(), "reload: auth tokens kept as they were") >= kept })
		if got := call("fresh-token"); got != codes.OK {
			t.Errorf("after the %s file was reloaded: %v; want the previous table in force", name, got)
		}
	}
	// This send returns once the last reload above is done (and logged);
	// the reload it asks for reads a good file, so whether it is logged
	// before the count or after, it adds no line counted below.
	if err := os.WriteFile(path, []byte(tokenLine("fresh-token", "team-a", "user")+tokenLine(tokenAdmin, "ops", "admin")), 0o600); err != nil {
		t.Fatal(err)
	}
	reload <- syscall.SIGHUP
	if got := strings.Count(logs.String(), "reload: auth tokens kept as they were"); got != 6 {
		t.Errorf("%d log lines say a reload kept the table; want 6 (3 files, 2 reloads each)", got)
	}
	if got := strings.Count(logs.String(), "holds no identity"); got != 4 {
		t.Errorf("%d log lines say the file holds no identity; want 4 (2 files, 2 reloads each)", got)
	}
}

// waitFor polls cond (a state the test cannot be notified of) for up to a
// minute.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatal("condition not reached within a minute")
}

// TestIdentity_PublicServices: with identities configured, health and
// reflection (what grpcurl needs before any call) answer without
// credentials; nothing else does.
func TestIdentity_PublicServices(t *testing.T) {
	h := start(t, repotest.Backends(t)[0], withTokens(t))
	conn := bareConn(t, h)
	ctx := tctx(t)
	waitServing(ctx, t, conn, "")
	if resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health without credentials: %v, %v", resp, err)
	}
	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	if resp, err := stream.Recv(); err != nil || len(resp.GetListServicesResponse().GetService()) == 0 {
		t.Errorf("reflection without credentials: %v, %v", resp, err)
	}
	if err := get(clv1.NewClusterLifecycleClient(conn), ctx, "clusters/0192f0c1-7a3e-7000-8000-000000000000"); status.Code(err) != codes.Unauthenticated {
		t.Errorf("GetCluster without credentials: %v; want UNAUTHENTICATED", err)
	}
}
