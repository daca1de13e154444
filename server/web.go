package server

import (
	"bytes"
	"embed"
	"fmt"
	"io/fs"
	"net/http"
	"path"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc/codes"

	"github.com/clusterd/clusterd/service"
)

// webFiles is the web view: one page, a script and a style sheet, with no
// framework and nothing loaded from elsewhere (the server may have no
// internet, and a page that pulls code from a CDN runs whatever the CDN
// serves). The script reads the REST API with the viewer's credentials; the
// files themselves hold no data and are public, like /openapi.json.
//
//go:embed web
var webFiles embed.FS

// webPolicy keeps the page to its own origin: its script and style only, and
// calls to this server's API only.
const webPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// webRoutes serves GET / (the page) and GET /ui/{file} (its assets). The
// page routes itself after '#' (#/clusters/{id}), so the server has one
// page to serve. modified is the files' Last-Modified: they are embedded in
// the binary, so as new as the server that serves them.
func webRoutes(mux *runtime.ServeMux, modified time.Time) error {
	files, err := fs.Sub(webFiles, "web")
	if err != nil {
		return fmt.Errorf("web view: %w", err)
	}
	serve := func(w http.ResponseWriter, r *http.Request, name string) {
		body, err := fs.ReadFile(files, name)
		if err != nil {
			writeError(mux, w, r, 0, service.StatusWithReason(codes.NotFound,
				fmt.Sprintf("no web view file %q", service.Clip(name)), service.ReasonNotFound).Err())
			return
		}
		h := w.Header()
		h.Set("Content-Security-Policy", webPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		// The files change with the binary: revalidate each time (cheap).
		h.Set("Cache-Control", "no-cache")
		http.ServeContent(w, r, name, modified, bytes.NewReader(body))
	}
	if err := mux.HandlePath(http.MethodGet, "/", func(w http.ResponseWriter, r *http.Request, _ map[string]string) {
		serve(w, r, "index.html")
	}); err != nil {
		return fmt.Errorf("web view /: %w", err)
	}
	if err := mux.HandlePath(http.MethodGet, "/ui/{file}", func(w http.ResponseWriter, r *http.Request, p map[string]string) {
		serve(w, r, path.Base(p["file"]))
	}); err != nil {
		return fmt.Errorf("web view /ui: %w", err)
	}
	return nil
}
