package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestVersionFlag(t *testing.T) {
	if _, _, err := parse([]string{"--version"}, func(string) string { return "" }, io.Discard); !errors.Is(err, errVersion) {
		t.Errorf("--version: %v; want the version printed instead of serving", err)
	}
	// An environment that happens to set CLUSTERD_VERSION does not turn the
	// server into a version printer (nor refuse to start).
	env := map[string]string{"CLUSTERD_VERSION": "1.2"}
	if _, _, err := parse(nil, func(k string) string { return env[k] }, io.Discard); err != nil {
		t.Errorf("CLUSTERD_VERSION=1.2: %v; want it ignored", err)
	}
}

func TestLogFormat(t *testing.T) {
	var out strings.Builder
	cfg, _, err := parse([]string{"--log-format", "json"}, func(string) string { return "" }, &out)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Logger.InfoContext(context.Background(), "hello", "cluster", "clusters/x")
	var line map[string]any
	if err := json.Unmarshal([]byte(out.String()), &line); err != nil || line["msg"] != "hello" || line["cluster"] != "clusters/x" {
		t.Errorf("--log-format json wrote %q (%v); want one JSON object", out.String(), err)
	}

	out.Reset()
	env := map[string]string{"CLUSTERD_LOG_FORMAT": "text"}
	cfg, _, err = parse(nil, func(k string) string { return env[k] }, &out)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Logger.Info("hello")
	if !strings.Contains(out.String(), "msg=hello") {
		t.Errorf("text log = %q", out.String())
	}

	if _, _, err := parse([]string{"--log-format", "xml"}, func(string) string { return "" }, io.Discard); err == nil || !strings.Contains(err.Error(), "text or json") {
		t.Errorf("--log-format xml: %v; want a refusal naming the formats", err)
	}
}

// --help says what becomes of a dead peer's operations by default: they are
// adopted (--on-owner-loss=resume), not failed.
func TestHelpSaysDeadPeersOperationsAreAdopted(t *testing.T) {
	var out strings.Builder
	if _, _, err := parse([]string{"--help"}, func(string) string { return "" }, &out); err == nil {
		t.Fatal("--help: nil error; want the usage printed instead of serving")
	}
	var peer string
	lines := strings.Split(out.String(), "\n")
	for i, l := range lines {
		if strings.Contains(l, "-peer-timeout") && i+1 < len(lines) {
			peer = lines[i+1]
		}
	}
	if !strings.Contains(peer, "adopted by a live server") || !strings.Contains(peer, "with --on-owner-loss=fail") {
		t.Errorf("--help on --peer-timeout: %q; want its operations adopted, failed only with --on-owner-loss=fail", peer)
	}
}
