package server

import (
	"fmt"
	"mime"
	"net/http"
	"strings"

	"google.golang.org/grpc/codes"

	"github.com/clusterd/clusterd/auth"
	"github.com/clusterd/clusterd/service"
)

// maxRESTHeader bounds a REST request's line and headers together: the
// largest valid ones (a 4 KiB bearer token and a few short headers) take a
// few kilobytes. guard refuses more with a google.rpc.Status (431). net/http
// has its own, far higher, limit (http.DefaultMaxHeaderBytes, 1 MiB): a
// request beyond it never reaches a handler and gets net/http's plain-text
// 431 instead.
const maxRESTHeader = 64 << 10

// checkRequest refuses, before anything else reads it, a REST request that
// no route should see, with the HTTP status to answer (the error's own when
// 0): headers over maxRESTHeader (431), an encoded colon in the path (404),
// a path, query or header that is not UTF-8 (400), and a header forwarded
// to the gRPC server that gRPC metadata cannot carry (400; the gateway
// would drop it silently, so that a non-ASCII x-clusterd-account made a
// development-mode caller act for `default` and an admin see every account).
func checkRequest(r *http.Request) (int, error) {
	if n := headerSize(r); n > maxRESTHeader {
		return http.StatusRequestHeaderFieldsTooLarge, service.StatusWithReason(codes.ResourceExhausted,
			fmt.Sprintf("the request line and headers take %d bytes, more than %d", n, maxRESTHeader), service.ReasonRequestTooLarge).Err()
	}
	if err := checkEncodedColon(r); err != nil {
		return 0, err
	}
	if err := checkUTF8(r); err != nil {
		return http.StatusBadRequest, err
	}
	for k, vs := range r.Header {
		name := strings.ToLower(k)
		if _, forwarded := forwardedHeader(name); !forwarded && name != "authorization" {
			continue
		}
		for _, v := range vs {
			if !printableASCII(v) {
				return http.StatusBadRequest, &auth.HeaderError{Header: name, Detail: "must be printable ASCII (like gRPC metadata)"}
			}
		}
	}
	return 0, nil
}

// headerSize is about what the request's line and headers took on the wire
// (HTTP/1.1 spelling).
func headerSize(r *http.Request) int {
	n := len(r.Method) + len(r.RequestURI) + len(r.Proto) + 4 + len("Host: \r\n") + len(r.Host)
	for k, vs := range r.Header {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return n
}

// checkEncodedColon refuses a path with an encoded colon (%3A). The gateway
// matches on the decoded path, so `POST /v1/clusters/<id>%3Astop` ran the
// stop; but REST clients, proxies and URL templates escape a colon that is
// data, not syntax, so an encoded colon belongs to the path segment and
// never introduces a custom method. No name clusterd gives contains a
// colon, so such a path names nothing: NOT_FOUND, saying how to write the
// method.
func checkEncodedColon(r *http.Request) error {
	escaped := r.URL.EscapedPath()
	if !strings.Contains(strings.ToLower(escaped), "%3a") {
		return nil
	}
	return service.StatusWithReason(codes.NotFound, fmt.Sprintf("no REST route for %s %s: an encoded colon (%%3A) is part of a path segment, "+
		"never the start of a custom method; write the method with a plain colon (…/clusters/{id}:stop)", service.Clip(r.Method), service.Clip(escaped)),
		service.ReasonNotFound).Err()
}

// checkMediaType refuses a non-empty body that is not declared as JSON
// (415). A body sent as a form or as text is not what its sender meant to
// send as JSON: `curl -d` says application/x-www-form-urlencoded unless told
// otherwise. A body without a Content-Type is taken as JSON.
func checkMediaType(r *http.Request, body []byte) error {
	ct := r.Header.Get("Content-Type")
	if len(body) == 0 || ct == "" {
		return nil
	}
	if mt, _, err := mime.ParseMediaType(ct); err == nil && mt == "application/json" {
		return nil
	}
	return service.StatusWithReason(codes.InvalidArgument, fmt.Sprintf("the request body must be JSON (Content-Type: application/json), not %s",
		service.Clip(ct)), service.ReasonUnsupportedMediaType).Err()
}

// printableASCII reports whether s holds only the characters gRPC metadata
// values may (space to tilde).
func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}
