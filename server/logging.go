package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strings"

	"github.com/google/uuid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// RequestIDHeader is the header (gRPC metadata and HTTP) that carries a
// request's id: the server answers every call with it, takes the caller's
// own when it is well-formed (so a client can correlate its logs with
// ours), and makes one up otherwise. Every log line of the request carries
// it as request_id.
const RequestIDHeader = "x-request-id"

// requestIDPattern is a well-formed request id: UUIDs, ULIDs, trace ids and
// the like. Nothing else reaches the logs (no spaces, no line breaks, no
// unbounded length).
var requestIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$`)

// requestID returns the one well-formed id among sent, or a new one.
func requestID(sent []string) string {
	if len(sent) == 1 && requestIDPattern.MatchString(sent[0]) {
		return sent[0]
	}
	return uuid.Must(uuid.NewV7()).String()
}

// requestInfo is what every log line of a request says about it.
type requestInfo struct {
	// ID is the request id (RequestIDHeader).
	ID string
	// Client is the caller's address: the TCP peer of a gRPC call, or for a
	// REST call the HTTP client's address, which only the in-process gateway
	// may tell the gRPC server (see clientAddress).
	Client string
}

type requestInfoKey struct{}

// withRequestInfo gives a call its request id (sent back in the response
// header) and its client's address, for the logs.
func withRequestInfo(ctx context.Context) context.Context {
	md, _ := metadata.FromIncomingContext(ctx)
	info := requestInfo{ID: requestID(md.Get(RequestIDHeader)), Client: clientAddress(ctx, md)}
	_ = grpc.SetHeader(ctx, metadata.Pairs(RequestIDHeader, info.ID))
	return context.WithValue(ctx, requestInfoKey{}, info)
}

// clientAddress is the TCP peer of a gRPC call. A REST call reaches the
// gRPC server from the in-process gateway, which appends the HTTP client's
// address as the last x-forwarded-for entry (grpc-gateway's
// AnnotateContext); earlier entries are whatever the client sent, and a
// direct gRPC caller's x-forwarded-for is not believed at all.
func clientAddress(ctx context.Context, md metadata.MD) string {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return ""
	}
	if _, gw := p.AuthInfo.(gatewayInfo); gw {
		if fwd := md.Get("x-forwarded-for"); len(fwd) > 0 {
			hops := strings.Split(fwd[len(fwd)-1], ",")
			return strings.TrimSpace(hops[len(hops)-1])
		}
		return "gateway"
	}
	return p.Addr.String()
}

// unaryRequestInfo and streamRequestInfo run first in the chain, so that
// every later interceptor and the handler log with the request's id.
func unaryRequestInfo() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		return handler(withRequestInfo(ctx), req)
	}
}

func streamRequestInfo() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		return handler(srv, &contextStream{ServerStream: ss, ctx: withRequestInfo(ss.Context())})
	}
}

// contextStream is a stream whose handler sees another context.
type contextStream struct {
	grpc.ServerStream
	ctx context.Context
}

// Context returns the stream's context with the request's information.
func (c *contextStream) Context() context.Context { return c.ctx }

// requestIDs gives every HTTP request its request id before anything else
// (the gateway's own refusals included): the client's X-Request-Id when it
// is well-formed, a new one otherwise. It is answered in X-Request-Id and
// forwarded to the gRPC server, which logs and answers the same id.
func requestIDs(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := requestID(r.Header.Values(RequestIDHeader))
		r.Header.Set(RequestIDHeader, id)
		w.Header().Set(RequestIDHeader, id)
		next.ServeHTTP(w, r)
	})
}

// requestLogger returns log with every record made with a request's context
// carrying the request's id and client address.
func requestLogger(log *slog.Logger) *slog.Logger {
	return slog.New(requestHandler{log.Handler()})
}

// requestHandler adds requestInfo to records logged with a request context.
type requestHandler struct{ slog.Handler }

// Handle adds request_id and client when ctx is a request's.
func (h requestHandler) Handle(ctx context.Context, r slog.Record) error {
	if info, ok := ctx.Value(requestInfoKey{}).(requestInfo); ok {
		r.AddAttrs(slog.String("request_id", info.ID), slog.String("client", info.Client))
	}
	return h.Handler.Handle(ctx, r)
}

// WithAttrs keeps the request attributes on derived loggers.
func (h requestHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return requestHandler{h.Handler.WithAttrs(attrs)}
}

// WithGroup keeps the request attributes on derived loggers.
func (h requestHandler) WithGroup(name string) slog.Handler {
	return requestHandler{h.Handler.WithGroup(name)}
}

// NewLogHandler is the handler of clusterd's logs: "text" (logfmt-like
// key=value, for people) or "json" (one object a line, for collectors).
func NewLogHandler(w io.Writer, format string, level slog.Leveler) (slog.Handler, error) {
	opts := &slog.HandlerOptions{Level: level}
	switch format {
	case "", "text":
		return slog.NewTextHandler(w, opts), nil
	case "json":
		return slog.NewJSONHandler(w, opts), nil
	}
	return nil, fmt.Errorf("log format %q: want text or json", format)
}
