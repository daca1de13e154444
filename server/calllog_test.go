package server

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A unary call's "finished call" line: none for a successful call on a
// server at INFO, one at DEBUG; a refusal at its level with the status and
// the error; the fields and their names as README's Logs section shows
// them, the request's deadline when it has one.
func TestUnaryCallLog(t *testing.T) {
	info := &grpc.UnaryServerInfo{FullMethod: "/clusterlifecycle.v1.ClusterLifecycle/GetCluster"}
	call := func(level slog.Level, ctx context.Context, err error) []map[string]any {
		t.Helper()
		var buf bytes.Buffer
		log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: level}))
		resp, got := unaryCallLog(log)(ctx, "req", info, func(context.Context, any) (any, error) {
			if err != nil {
				return nil, err
			}
			return "resp", nil
		})
		if got != err || (err == nil && resp != "resp") {
			t.Fatalf("interceptor returned %v, %v; want the handler's answer", resp, got)
		}
		var lines []map[string]any
		for _, raw := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
			if raw == "" {
				continue
			}
			var line map[string]any
			if err := json.Unmarshal([]byte(raw), &line); err != nil {
				t.Fatalf("log line %q: %v", raw, err)
			}
			lines = append(lines, line)
		}
		return lines
	}
	ctx := context.Background()
	if lines := call(slog.LevelInfo, ctx, nil); len(lines) != 0 {
		t.Errorf("a successful call at INFO logged %v; want nothing", lines)
	}
	lines := call(slog.LevelDebug, ctx, nil)
	want := map[string]any{"level": "DEBUG", "msg": "finished call", "protocol": "grpc", "grpc.component": "server",
		"grpc.service": "clusterlifecycle.v1.ClusterLifecycle", "grpc.method": "GetCluster", "grpc.method_type": "unary", "grpc.code": "OK"}
	if len(lines) != 1 {
		t.Fatalf("a successful call at DEBUG logged %d lines; want 1", len(lines))
	}
	for k, v := range want {
		if lines[0][k] != v {
			t.Errorf("successful call: %s = %v; want %v (line %v)", k, lines[0][k], v, lines[0])
		}
	}
	for _, k := range []string{"grpc.start_time", "grpc.time_ms"} {
		if _, ok := lines[0][k]; !ok {
			t.Errorf("successful call: no %s in %v", k, lines[0])
		}
	}
	if _, ok := lines[0]["grpc.request.deadline"]; ok {
		t.Errorf("a call without a deadline logged one: %v", lines[0])
	}

	dctx, cancel := context.WithTimeout(ctx, time.Hour)
	defer cancel()
	lines = call(slog.LevelInfo, dctx, status.Error(codes.NotFound, "clusters/x not found"))
	if len(lines) != 1 || lines[0]["level"] != "INFO" || lines[0]["grpc.code"] != "NotFound" ||
		lines[0]["grpc.error"] != "rpc error: code = NotFound desc = clusters/x not found" || lines[0]["grpc.request.deadline"] == nil {
		t.Errorf("NOT_FOUND at INFO logged %v; want one INFO line with the code, the error and the deadline", lines)
	}
	lines = call(slog.LevelInfo, ctx, status.Error(codes.Aborted, "another operation is in progress"))
	if len(lines) != 1 || lines[0]["level"] != "WARN" || lines[0]["grpc.code"] != "Aborted" {
		t.Errorf("ABORTED logged %v; want one WARN line", lines)
	}
}
