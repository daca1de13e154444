package server

import (
	"context"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/clusterd/clusterd/auth"
	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
)

// verifiedClientHeader carries, from the REST gateway to the gRPC server
// only, the DER of the client certificate the HTTP listener verified. The
// server trusts it from the in-process gateway connection alone; the HTTP
// middleware deletes whatever a client sends under that name.
const verifiedClientHeader = "x-clusterd-verified-client"

// publicPrefixes are the services callers reach without credentials: load
// balancers and orchestrators probe health before they hold any, and
// reflection describes the API, which is as public as /openapi.json (and
// which grpcurl needs before it can call even the health check).
var publicPrefixes = []string{"/grpc.health.v1.Health/", "/grpc.reflection.v1.ServerReflection/", "/grpc.reflection.v1alpha.ServerReflection/"}

// adminPrefixes are the services, or methods, only admins may call: the
// Simulator changes machines and faults of every account, and the Catalog's
// writes change what every account's clusters may be made of (its reads are
// every caller's).
var adminPrefixes = []string{
	"/" + clv1.Simulator_ServiceDesc.ServiceName + "/",
	clv1.Catalog_CreateKubernetesVersion_FullMethodName,
	clv1.Catalog_UpdateKubernetesVersion_FullMethodName,
	clv1.Catalog_DeleteKubernetesVersion_FullMethodName,
	clv1.Catalog_CreateServiceOffering_FullMethodName,
	clv1.Catalog_UpdateServiceOffering_FullMethodName,
	clv1.Catalog_DeleteServiceOffering_FullMethodName,
}

// authenticate returns the identity of a call to method, or the error to
// answer it with; public methods need none. The call is registered among
// the open calls until done is called, so that a reload of the token file
// ends it if its credentials are revoked meanwhile.
func (s *Server) authenticate(ctx context.Context, method string) (_ context.Context, done func(), _ error) {
	for _, p := range publicPrefixes {
		if strings.HasPrefix(method, p) {
			return ctx, func() {}, nil
		}
	}
	creds, err := callCredentials(ctx)
	if err != nil {
		return nil, nil, err
	}
	id, err := s.auth.Authenticate(creds)
	if err != nil {
		return nil, nil, err
	}
	for _, p := range adminPrefixes {
		if strings.HasPrefix(method, p) && !id.IsAdmin() {
			return nil, nil, fmt.Errorf("%w: %s is for admins only", auth.ErrAdminOnly, strings.TrimSuffix(strings.TrimPrefix(p, "/"), "/"))
		}
	}
	ctx, done = s.calls.open(ctx, creds, id, s.stillAuthenticates)
	return auth.NewContext(ctx, id), done, nil
}

// callCredentials gathers what a call presents: the authorization and
// account headers, and a client certificate the TLS handshake verified
// (directly, or on the REST listener as forwarded by the gateway).
func callCredentials(ctx context.Context) (auth.Credentials, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	var c auth.Credentials
	authz := md.Get("authorization")
	if len(authz) > 1 {
		return c, fmt.Errorf("%w: more than one authorization header", auth.ErrBadCredentials)
	}
	if len(authz) == 1 {
		c.Authorization = authz[0]
	}
	if acct := md.Get(auth.AccountHeader); len(acct) > 0 {
		c.Account = acct[0]
	}
	p, _ := peer.FromContext(ctx)
	if p == nil {
		return c, nil
	}
	switch info := p.AuthInfo.(type) {
	case credentials.TLSInfo:
		if chains := info.State.VerifiedChains; len(chains) > 0 && len(chains[0]) > 0 {
			c.Certificate = chains[0][0]
		}
	case gatewayInfo:
		if v := md.Get(verifiedClientHeader); len(v) == 1 {
			der, err := base64.StdEncoding.DecodeString(v[0])
			if err != nil {
				return c, fmt.Errorf("forwarded client certificate: %w", err)
			}
			if c.Certificate, err = x509.ParseCertificate(der); err != nil {
				return c, fmt.Errorf("forwarded client certificate: %w", err)
			}
		}
	}
	return c, nil
}

// unaryAuth authenticates every unary call before the handler runs, then
// refuses a request the codec could not decode: an unauthenticated caller
// learns nothing about what it sent.
func (s *Server) unaryAuth() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		undecodable := s.codec.take(req)
		ctx, done, err := s.authenticate(ctx, info.FullMethod)
		if err != nil {
			return nil, err
		}
		defer done()
		if undecodable != nil {
			return nil, undecodable
		}
		resp, err := handler(ctx, req)
		if err != nil {
			if cause := revoked(ctx); cause != nil {
				return nil, cause
			}
			return nil, err
		}
		return resp, nil
	}
}

// streamAuth is unaryAuth for streams (reflection, health watches).
func (s *Server) streamAuth() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx, done, err := s.authenticate(ss.Context(), info.FullMethod)
		if err != nil {
			return err
		}
		defer done()
		if err := handler(srv, &authStream{ServerStream: ss, ctx: ctx, codec: s.codec}); err != nil {
			if cause := revoked(ctx); cause != nil {
				return cause
			}
			return err
		}
		return nil
	}
}

// authStream is a stream whose handler sees the authenticated context and
// whose undecodable messages are refused like unary requests.
type authStream struct {
	grpc.ServerStream
	ctx   context.Context
	codec *requestCodec
}

// Context returns the context carrying the caller's identity.
func (a *authStream) Context() context.Context { return a.ctx }

// RecvMsg receives a message, refusing one the codec could not decode.
func (a *authStream) RecvMsg(m any) error {
	if err := a.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return a.codec.take(m)
}
