// Package client is the Go client of clusterd: a connection with the
// ClusterLifecycle, Catalog, Quotas, Operations and Simulator stubs, and
// the helpers every caller otherwise writes again: follow an operation to its end with progress
// (Wait), retry a request that another operation refused (RetryAborted), and
// read the google.rpc.ErrorInfo and BadRequest of an error (Reason,
// FieldViolations). It imports only the generated API and gRPC, never the
// server's packages, so a program that uses it pulls in no database driver.
//
//	c, err := client.New("127.0.0.1:9090", client.WithAccount("team-a"))
//	op, err := c.Clusters.CreateCluster(ctx, &clv1.CreateClusterRequest{Cluster: spec})
//	op, err = c.Wait(ctx, op, func(md *clv1.OperationMetadata) { fmt.Println(md.GetStep()) })
//	cluster, err := client.ClusterOf(op)
package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
)

// AccountHeader is the metadata key that names the account of a request when
// the server runs without authentication (its development mode).
const AccountHeader = "x-clusterd-account"

// Client is a connection to one clusterd server. Its stubs are safe for
// concurrent use; Close releases the connection.
type Client struct {
	// Clusters is the ClusterLifecycle service: create, get, list, and the
	// mutations that return an Operation.
	Clusters clv1.ClusterLifecycleClient
	// Catalog is the Kubernetes versions and service offerings clusters
	// may use: every caller lists and gets them, admins create, update and
	// delete them.
	Catalog clv1.CatalogClient
	// Operations is google.longrunning.Operations: get, list, wait, cancel.
	Operations longrunningpb.OperationsClient
	// Simulator drives the simulated infrastructure (servers run with --infra=sim).
	Simulator clv1.SimulatorClient
	// Quotas reads an account's limits and usage; admins set them.
	Quotas clv1.QuotasClient

	conn *grpc.ClientConn
}

// options collects what the Options set.
type options struct {
	tls      *tls.Config
	token    string
	account  string
	dialOpts []grpc.DialOption
}

// Option configures New.
type Option func(*options)

// WithTLS connects over TLS with cfg (nil: the system roots and the
// address's host name). Without it the connection is plaintext, as a local
// development server expects.
func WithTLS(cfg *tls.Config) Option {
	return func(o *options) {
		if cfg == nil {
			cfg = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		o.tls = cfg
	}
}

// WithToken sends `authorization: Bearer <token>` with every call, for a
// server started with --auth-tokens. The token also travels over plaintext
// connections, which only a server on the same host should accept.
func WithToken(token string) Option {
	return func(o *options) { o.token = token }
}

// WithAccount names the account of every call (the x-clusterd-account
// metadata) for a server in development mode, which takes the account from
// the request instead of a token.
func WithAccount(account string) Option {
	return func(o *options) { o.account = account }
}

// WithDialOptions adds gRPC dial options (interceptors, keepalive, a
// custom dialer for tests) after the ones New derives from the other Options.
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *options) { o.dialOpts = append(o.dialOpts, opts...) }
}

// New connects to the clusterd server at addr (host:port). The connection is
// made lazily, on the first call, as grpc.NewClient does; New fails only for
// an unusable address or option.
func New(addr string, opts ...Option) (*Client, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	creds := insecure.NewCredentials()
	if o.tls != nil {
		creds = credentials.NewTLS(o.tls)
	}
	dial := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	if o.token != "" {
		dial = append(dial, grpc.WithPerRPCCredentials(bearer{token: o.token, secure: o.tls != nil}))
	}
	if o.account != "" {
		dial = append(dial,
			grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, callOpts ...grpc.CallOption) error {
				return invoker(metadata.AppendToOutgoingContext(ctx, AccountHeader, o.account), method, req, reply, cc, callOpts...)
			}),
			grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, callOpts ...grpc.CallOption) (grpc.ClientStream, error) {
				return streamer(metadata.AppendToOutgoingContext(ctx, AccountHeader, o.account), desc, cc, method, callOpts...)
			}))
	}
	dial = append(dial, o.dialOpts...)
	conn, err := grpc.NewClient(addr, dial...)
	if err != nil {
		return nil, fmt.Errorf("clusterd client for %s: %w", addr, err)
	}
	return &Client{
		Clusters:   clv1.NewClusterLifecycleClient(conn),
		Catalog:    clv1.NewCatalogClient(conn),
		Operations: longrunningpb.NewOperationsClient(conn),
		Simulator:  clv1.NewSimulatorClient(conn),
		Quotas:     clv1.NewQuotasClient(conn),
		conn:       conn,
	}, nil
}

// Close closes the connection; calls in flight fail.
func (c *Client) Close() error {
	if c == nil || c.conn == nil {
		return errors.New("clusterd client: not connected")
	}
	return c.conn.Close()
}

// Conn is the underlying connection, for stubs of other services (health,
// reflection) on the same server.
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

// bearer is the per-call credential of WithToken.
type bearer struct {
	token  string
	secure bool
}

// GetRequestMetadata adds the authorization header to a call.
func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

// RequireTransportSecurity is false on plaintext connections so a token can
// reach a development server on loopback; over TLS gRPC enforces it.
func (b bearer) RequireTransportSecurity() bool { return b.secure }
