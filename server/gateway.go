package server

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/grpc-ecosystem/grpc-gateway/v2/utilities"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/clusterd/clusterd/auth"
	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	opsgw "github.com/clusterd/clusterd/gen/gateway/longrunningpb"
	"github.com/clusterd/clusterd/gen/openapiv2"
	"github.com/clusterd/clusterd/service"
)

// maxRESTBody bounds a REST request body; the largest valid request (an
// AddNodes of a maximum-size cluster) is a few kilobytes.
const maxRESTBody = 64 << 10

// gateway builds the REST gateway as a gRPC client of this server, over an
// in-process connection, so REST requests go through the same interceptors
// (authentication included) as gRPC ones. It is strict where the gateway is
// lenient by default: unknown JSON fields and query parameters, trailing
// data and oversized bodies are refused, and every error it raises itself
// is a google.rpc.Status with an ErrorInfo like the server's own.
func (s *Server) gateway(ctx context.Context) error {
	conn, err := grpc.NewClient("passthrough:///clusterd-gateway",
		grpc.WithContextDialer(s.gatewayLis.dial),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("gateway connection: %w", err)
	}
	s.conn = conn
	queryFree, err := queryFreeRoutes()
	if err != nil {
		return err
	}
	var mux *runtime.ServeMux
	opts := []runtime.ServeMuxOption{
		runtime.WithHealthzEndpoint(healthpb.NewHealthClient(conn)),
		runtime.WithIncomingHeaderMatcher(forwardedHeader),
		runtime.WithOutgoingHeaderMatcher(answeredHeader),
		runtime.WithMarshalerOption(runtime.MIMEWildcard, &strictJSON{JSONPb: &runtime.JSONPb{
			MarshalOptions:   protojson.MarshalOptions{EmitUnpopulated: true},
			UnmarshalOptions: protojson.UnmarshalOptions{DiscardUnknown: false},
		}}),
		runtime.WithErrorHandler(s.gatewayError),
		runtime.WithRoutingErrorHandler(s.routingError),
		runtime.WithMiddlewares(func(next runtime.HandlerFunc) runtime.HandlerFunc {
			return func(w http.ResponseWriter, r *http.Request, params map[string]string) {
				if pattern, ok := runtime.HTTPPattern(r.Context()); ok && r.URL.RawQuery != "" && queryFree[routeKey(r.Method, pattern)] {
					writeError(mux, w, r, 0, &service.InvalidArgumentError{Violations: []service.FieldViolation{{
						Field: "query", Description: fmt.Sprintf("%s %s takes no query parameters (send fields in the JSON body)", r.Method, pattern)}}})
					return
				}
				next(w, r, params)
			}
		}),
		// GET /v1/operations lists; without this, operations/** would also
		// match it with zero segments and route it to GetOperation.
		runtime.WithStrictDeepWildcardMatching(),
	}
	// grpc-gateway keeps the query parser in a package variable (v2.33 has
	// no per-ServeMux one) that every mux of the process reads as it serves:
	// setting it again for each Server raced with another Server serving in
	// the same process (tests run many). strictQuery holds no state, so it
	// is set once, by a mux made only to apply the option, inside the Once:
	// every gateway is built, and serves, after that write.
	strictQueryOnce.Do(func() { runtime.NewServeMux(runtime.SetQueryParameterParser(strictQuery{})) })
	mux = runtime.NewServeMux(opts...)
	// The mux tries the routes registered last first: Operations goes
	// before ClusterLifecycle, or its GetOperation (/v1/{name=operations/*})
	// would take GET /v1/operations/{id}:watch as an operation named
	// "{id}:watch".
	if err := opsgw.RegisterOperationsHandler(ctx, mux, conn); err != nil {
		return fmt.Errorf("gateway Operations: %w", err)
	}
	if err := clv1.RegisterClusterLifecycleHandler(ctx, mux, conn); err != nil {
		return fmt.Errorf("gateway ClusterLifecycle: %w", err)
	}
	if err := clv1.RegisterCatalogHandler(ctx, mux, conn); err != nil {
		return fmt.Errorf("gateway Catalog: %w", err)
	}
	if err := clv1.RegisterQuotasHandler(ctx, mux, conn); err != nil {
		return fmt.Errorf("gateway Quotas: %w", err)
	}
	if err := clv1.RegisterSimulatorHandler(ctx, mux, conn); err != nil {
		return fmt.Errorf("gateway Simulator: %w", err)
	}
	if err := mux.HandlePath(http.MethodGet, "/openapi.json", func(w http.ResponseWriter, _ *http.Request, _ map[string]string) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(openapiv2.JSON)
	}); err != nil {
		return fmt.Errorf("gateway /openapi.json: %w", err)
	}
	if err := s.operatorRoutes(mux); err != nil {
		return err
	}
	s.http = &http.Server{Handler: requestIDs(guard(mux)), ReadHeaderTimeout: 10 * time.Second, TLSConfig: s.tlsConfig()}
	return nil
}

// forwardedHeader passes on to the gRPC server only the headers clusterd
// reads (authorization always passes): no Grpc-Metadata-* smuggling of
// metadata the server trusts from the gateway.
func forwardedHeader(key string) (string, bool) {
	switch strings.ToLower(key) {
	case auth.AccountHeader:
		return auth.AccountHeader, true
	case verifiedClientHeader:
		return verifiedClientHeader, true
	case RequestIDHeader:
		return RequestIDHeader, true
	}
	return "", false
}

// answeredHeader passes the gRPC server's response headers on as the
// gateway does by default (Grpc-Metadata-<key>), except the request id,
// which requestIDs already answers as X-Request-Id.
func answeredHeader(key string) (string, bool) {
	if strings.EqualFold(key, RequestIDHeader) {
		return "", false
	}
	return runtime.MetadataHeaderPrefix + key, true
}

// guard refuses cross-site browser requests that change anything, and
// checks what the gateway would otherwise pass on blindly (see
// checkRequest: header size, encoded colons, UTF-8, headers gRPC metadata
// cannot carry), a body within maxRESTBody (413 beyond) and declared as
// JSON (415 otherwise), and the client certificate the TLS listener
// verified, forwarded under verifiedClientHeader in place of anything the
// client sent there.
func guard(mux *runtime.ServeMux) http.Handler {
	// A state-changing request a browser sent from another site is refused
	// (Sec-Fetch-Site, or an Origin other than the request's host): a page
	// elsewhere could otherwise make a browser stop or start clusters
	// through a server in development mode (no credentials) or with client
	// certificates (which browsers attach by themselves). Clients that are
	// not browsers send neither header; the web view is same-origin.
	crossOrigin := http.NewCrossOriginProtection()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := crossOrigin.Check(r); err != nil {
			writeError(mux, w, r, http.StatusForbidden, service.StatusWithReason(codes.PermissionDenied,
				fmt.Sprintf("%s %s came from another site (%v); call the API from its own origin or from a program", service.Clip(r.Method), service.Clip(r.URL.Path), err),
				service.ReasonCrossOrigin).Err())
			return
		}
		if code, err := checkRequest(r); err != nil {
			writeError(mux, w, r, code, err)
			return
		}
		r.Header.Del(verifiedClientHeader)
		if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 && len(r.TLS.VerifiedChains[0]) > 0 {
			r.Header.Set(verifiedClientHeader, base64.StdEncoding.EncodeToString(r.TLS.VerifiedChains[0][0].Raw))
		}
		if r.Body != nil && r.Body != http.NoBody {
			body, err := io.ReadAll(io.LimitReader(r.Body, maxRESTBody+1))
			if r.ContentLength > maxRESTBody || len(body) > maxRESTBody {
				writeError(mux, w, r, http.StatusRequestEntityTooLarge, service.StatusWithReason(codes.ResourceExhausted,
					fmt.Sprintf("the request body is larger than %d bytes", maxRESTBody), service.ReasonRequestTooLarge).Err())
				return
			}
			if err != nil {
				writeError(mux, w, r, http.StatusBadRequest, &service.InvalidArgumentError{Violations: []service.FieldViolation{{
					Field: "body", Description: fmt.Sprintf("cannot be read: %v", err)}}})
				return
			}
			if err := checkMediaType(r, body); err != nil {
				writeError(mux, w, r, http.StatusUnsupportedMediaType, err)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		mux.ServeHTTP(w, r)
	})
}

// checkUTF8 refuses a request whose path, query or headers are not UTF-8
// (or whose query does not parse), naming the part.
func checkUTF8(r *http.Request) error {
	bad := func(field, what string) error {
		return &service.InvalidArgumentError{Violations: []service.FieldViolation{{Field: field, Description: what}}}
	}
	if !utf8.ValidString(r.URL.Path) {
		return bad("path", "is not valid UTF-8")
	}
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return bad("query", "cannot be parsed: "+service.Clip(err.Error()))
	}
	for k, vs := range q {
		if !utf8.ValidString(k) {
			return bad("query", "has a parameter name that is not valid UTF-8")
		}
		for _, v := range vs {
			if !utf8.ValidString(v) {
				return bad(k, "is not valid UTF-8")
			}
		}
	}
	for k, vs := range r.Header {
		for _, v := range vs {
			if !utf8.ValidString(v) {
				return bad(strings.ToLower(k), "is not valid UTF-8")
			}
		}
	}
	return nil
}

// writeError answers through the gateway's error handler, with httpStatus
// when it is not the one the status code maps to.
func writeError(mux *runtime.ServeMux, w http.ResponseWriter, r *http.Request, httpStatus int, err error) {
	_, out := runtime.MarshalerForRequest(mux, r)
	if httpStatus != 0 {
		err = &runtime.HTTPStatusError{HTTPStatus: httpStatus, Err: err}
	}
	runtime.HTTPError(r.Context(), mux, out, w, r, err)
}

// gatewayError is the one error handler of the REST gateway: errors from the
// gRPC server already carry their ErrorInfo; the gateway's own (bad JSON, an
// unknown query parameter) get one through the same mapping. The gRPC
// server's interceptors log the calls that reached it; the gateway logs its
// own refusals here, so that no refused request goes unrecorded.
func (s *Server) gatewayError(ctx context.Context, mux *runtime.ServeMux, m runtime.Marshaler, w http.ResponseWriter, r *http.Request, err error) {
	var custom *runtime.HTTPStatusError
	httpStatus := 0
	if errors.As(err, &custom) {
		httpStatus, err = custom.HTTPStatus, custom.Err
	}
	st := service.Status(err)
	if !reachedServer(ctx) {
		status := httpStatus
		if status == 0 {
			status = runtime.HTTPStatusFromCode(st.Code())
		}
		client := r.RemoteAddr
		if host, _, splitErr := net.SplitHostPort(client); splitErr == nil {
			client = host
		}
		level := slog.Level(logging.DefaultServerCodeToLevel(st.Code()))
		if st.Code() == codes.Unimplemented {
			level = slog.LevelInfo // a method the path does not take: the client's mistake
		}
		s.log.Log(ctx, level, "request refused by the REST gateway",
			"request_id", r.Header.Get(RequestIDHeader), "client", client,
			"http.method", service.Clip(r.Method), "http.path", service.Clip(r.URL.Path), "http.status", status,
			"grpc.code", st.Code().String(), "error", st.Message())
	}
	err = st.Err()
	if httpStatus != 0 {
		err = &runtime.HTTPStatusError{HTTPStatus: httpStatus, Err: err}
	}
	if st.Code() == codes.Unauthenticated {
		w = challenge{w}
	}
	runtime.DefaultHTTPErrorHandler(ctx, mux, errorJSON(m), w, r, err)
}

// errorJSON is the marshaler of an error body: the Status's code, message
// and details as the gateway's own marshaler writes them (empty strings,
// lists and maps included), except that a detail's unset message fields are
// left out rather than written as null: a BadRequest field violation has no
// "localizedMessage": null. A marshaler other than the gateway's JSON one is
// kept as it is.
func errorJSON(m runtime.Marshaler) runtime.Marshaler {
	j, ok := m.(*strictJSON)
	if !ok {
		return m
	}
	opts := j.MarshalOptions
	opts.EmitUnpopulated, opts.EmitDefaultValues = false, true
	return &runtime.JSONPb{MarshalOptions: opts, UnmarshalOptions: j.UnmarshalOptions}
}

// reachedServer says whether a REST call reached the gRPC server (which
// answers every call it sees with a request id header) before it failed.
func reachedServer(ctx context.Context) bool {
	md, ok := runtime.ServerMetadataFromContext(ctx)
	return ok && len(md.HeaderMD.Get(RequestIDHeader)) > 0
}

// challenge sets a proper RFC 6750 challenge on 401 answers (the gateway
// would put the error message there).
type challenge struct{ http.ResponseWriter }

// WriteHeader replaces the WWW-Authenticate header before it is sent.
func (c challenge) WriteHeader(code int) {
	c.Header().Set("WWW-Authenticate", `Bearer realm="clusterd"`)
	c.ResponseWriter.WriteHeader(code)
}

// routingError answers a path no route matches (404) or a method the path
// does not take (405) with a google.rpc.Status like every other error.
func (s *Server) routingError(ctx context.Context, mux *runtime.ServeMux, m runtime.Marshaler, w http.ResponseWriter, r *http.Request, httpStatus int) {
	path := service.Clip(r.URL.Path)
	var err error
	switch httpStatus {
	case http.StatusMethodNotAllowed:
		err = &runtime.HTTPStatusError{HTTPStatus: httpStatus, Err: service.StatusWithReason(codes.Unimplemented,
			fmt.Sprintf("%s is not allowed on %s", r.Method, path), service.ReasonMethodNotAllowed).Err()}
	case http.StatusNotFound:
		err = service.StatusWithReason(codes.NotFound, fmt.Sprintf("no REST route for %s %s", r.Method, path), service.ReasonNotFound).Err()
	default:
		err = &runtime.HTTPStatusError{HTTPStatus: httpStatus, Err: service.StatusWithReason(codes.InvalidArgument,
			fmt.Sprintf("%s %s: %s", r.Method, path, http.StatusText(httpStatus)), service.ReasonInvalidArgument).Err()}
	}
	s.gatewayError(ctx, mux, m, w, r, err)
}

// strictJSON is the gateway's JSON marshaler, refusing data after the JSON
// value of a body: `{"etag": "3"} {"etag": "4"}` is not one request.
type strictJSON struct {
	*runtime.JSONPb
}

// NewDecoder reads one JSON value and insists that nothing follows it.
func (m *strictJSON) NewDecoder(r io.Reader) runtime.Decoder {
	return runtime.DecoderFunc(func(v any) error {
		dec := json.NewDecoder(r)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return err // io.EOF for an empty body, which the gateway accepts
		}
		if _, err := dec.Token(); !errors.Is(err, io.EOF) {
			return errors.New("the body has data after its JSON value")
		}
		return m.JSONPb.Unmarshal(raw, v)
	})
}

// strictQueryOnce installs strictQuery as the process's query parser (see
// gateway).
var strictQueryOnce sync.Once

// strictQuery refuses query parameters that name no field of the request,
// or a field the path or body already sets: a typo such as `etagg=3` must
// not silently turn a conditional request into an unconditional one.
type strictQuery struct{}

// Parse checks every key, then populates like the gateway's default parser.
func (strictQuery) Parse(msg proto.Message, values url.Values, filter *utilities.DoubleArray) error {
	for key := range values {
		path, ok := queryFieldPath(msg.ProtoReflect().Descriptor(), key)
		if !ok {
			return fmt.Errorf("unknown query parameter %q", service.Clip(key))
		}
		if filter.HasCommonPrefix(path) {
			return fmt.Errorf("query parameter %q sets a field that the path or body sets", service.Clip(key))
		}
	}
	return (&runtime.DefaultQueryParser{}).Parse(msg, values, filter)
}

// queryFieldPath resolves a query key (proto or JSON field names, dotted
// through singular messages) to proto field names.
func queryFieldPath(md protoreflect.MessageDescriptor, key string) ([]string, bool) {
	var path []string
	for _, name := range strings.Split(key, ".") {
		if md == nil {
			return nil, false
		}
		fd := md.Fields().ByTextName(name)
		if fd == nil {
			fd = md.Fields().ByJSONName(name)
		}
		if fd == nil {
			return nil, false
		}
		path = append(path, string(fd.Name()))
		md = nil
		if fd.Message() != nil && !fd.IsList() && !fd.IsMap() {
			md = fd.Message()
		}
	}
	return path, len(path) > 0
}

// queryFreeRoutes lists the REST routes that take no query parameter, from
// the OpenAPI document (generated from the same HTTP bindings as the
// gateway), as routeKey spells them. The gateway ignores a query on a route
// whose body is the whole request; the server refuses it instead.
func queryFreeRoutes() (map[string]bool, error) {
	var doc struct {
		Paths map[string]map[string]struct {
			Parameters []struct {
				In string `json:"in"`
			} `json:"parameters"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(openapiv2.JSON, &doc); err != nil {
		return nil, fmt.Errorf("gateway routes: the OpenAPI document: %w", err)
	}
	routes := map[string]bool{}
	for path, methods := range doc.Paths {
		for method, op := range methods {
			query := false
			for _, p := range op.Parameters {
				query = query || p.In == "query"
			}
			if !query {
				routes[strings.ToUpper(method)+" "+templateVar.ReplaceAllString(path, "*")] = true
			}
		}
	}
	return routes, nil
}

// templateVar is a path variable of an OpenAPI path ({cluster}); boundVar
// one of a gateway pattern ({name=clusters/*}), whose template is kept.
var (
	templateVar = regexp.MustCompile(`\{[^}=]*\}`)
	boundVar    = regexp.MustCompile(`\{[^}=]*=([^}]*)\}`)
)

// routeKey spells a matched route as queryFreeRoutes does:
// "POST /v1/clusters/*:stop".
func routeKey(method string, p runtime.Pattern) string {
	return method + " " + boundVar.ReplaceAllString(p.String(), "$1")
}
