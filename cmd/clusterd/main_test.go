package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestFlagsAndEnvironmentTwins(t *testing.T) {
	env := map[string]string{
		"CLUSTERD_DATABASE":  "mysql://u:p@127.0.0.1:3306/db",
		"CLUSTERD_GRPC_ADDR": "0.0.0.0:1",
		"CLUSTERD_LOG_LEVEL": "DEBUG",
	}
	cfg, level, err := parse([]string{"--grpc-addr", "127.0.0.1:7000", "--server-id", "s9"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Database != env["CLUSTERD_DATABASE"] {
		t.Errorf("database = %q; want the environment's", cfg.Database)
	}
	if cfg.GRPCAddr != "127.0.0.1:7000" {
		t.Errorf("grpc addr = %q; the command line must win over the environment", cfg.GRPCAddr)
	}
	if cfg.HTTPAddr != "127.0.0.1:8080" || cfg.Infra != "sim" || cfg.ServerID != "s9" || level != slog.LevelDebug {
		t.Errorf("cfg = %+v, level %v", cfg, level)
	}
}

func TestDefaults(t *testing.T) {
	cfg, _, err := parse(nil, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Database != "sqlite:clusterd.db" || cfg.GRPCAddr != "127.0.0.1:9090" || cfg.HTTPAddr != "127.0.0.1:8080" || cfg.ServerID == "" {
		t.Errorf("defaults = %+v", cfg)
	}
}

func TestBadInputIsRefused(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
	}{
		{[]string{"--no-such-flag"}, nil},
		{[]string{"stray"}, nil},
		{nil, map[string]string{"CLUSTERD_LOG_LEVEL": "LOUD"}},
		{nil, map[string]string{"CLUSTERD_SHUTDOWN_TIMEOUT": "soon"}},
	} {
		if _, _, err := parse(tc.args, func(k string) string { return tc.env[k] }, io.Discard); err == nil {
			t.Errorf("parse(%v, %v) accepted bad input", tc.args, tc.env)
		}
	}
}

// TestStartupErrorsKeepSecrets: a start-up error names the database but
// never its password, even when the DSN does not parse; a SQLite file in a
// missing folder is reported as such.
func TestStartupErrorsKeepSecrets(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no", "such", "folder")
	for _, tc := range []struct {
		database string
		want     string
	}{
		{"mysql://clusterd:s3cret-pw@127.0.0.1:1/db", "127.0.0.1:1"},
		{"mysql://clusterd:s3cret-pw@127.0.0.1:1/db%zz", "parse mysql DSN"},
		{"mysql://clusterd:s3cret-pw@[::1/db", "parse mysql DSN"},
		{"postgres://clusterd:s3cret-pw@127.0.0.1/db", "unsupported DSN"},
		{"sqlite:" + filepath.Join(missing, "clusterd.db"), "the folder " + missing + " of the SQLite database"},
	} {
		var stderr strings.Builder
		err := run([]string{"--database", tc.database, "--database-wait", "1ms", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}, func(string) string { return "" }, &stderr)
		if err == nil {
			t.Fatalf("%s: started", tc.database)
		}
		if strings.Contains(err.Error()+stderr.String(), "s3cret") {
			t.Errorf("%s: the password is in the error: %v %s", tc.database, err, stderr.String())
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %q does not say %q", tc.database, err, tc.want)
		}
	}
}

func TestDefaultServerIDIsUniquePerProcess(t *testing.T) {
	host, _ := os.Hostname()
	if host == "" {
		host = "clusterd"
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, host + ":9090"},
		{[]string{"--grpc-addr", "0.0.0.0:7001"}, host + ":7001"},
		{[]string{"--grpc-addr", "127.0.0.1:0"}, fmt.Sprintf("%s:pid%d", host, os.Getpid())},
		{[]string{"--server-id", "given"}, "given"},
	} {
		cfg, _, err := parse(tc.args, func(string) string { return "" }, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.ServerID != tc.want {
			t.Errorf("parse(%v): server id %q; want %q", tc.args, cfg.ServerID, tc.want)
		}
	}
	cfg, _, err := parse(nil, func(k string) string { return map[string]string{"CLUSTERD_SERVER_ID": "from-env"}[k] }, io.Discard)
	if err != nil || cfg.ServerID != "from-env" {
		t.Errorf("CLUSTERD_SERVER_ID: server id %q, %v; want from-env", cfg.ServerID, err)
	}
	if cfg.DatabaseWait != 60*time.Second {
		t.Errorf("database wait %s; want the 60s default", cfg.DatabaseWait)
	}
}

// TestLibvirtFlags: --infra libvirt takes its connection, pool, node image
// and VM sizes from the command line (or their CLUSTERD_* twins).
func TestLibvirtFlags(t *testing.T) {
	env := map[string]string{"CLUSTERD_LIBVIRT_URI": "test+unix:///default"}
	cfg, _, err := parse([]string{"--infra", "libvirt", "--libvirt-pool-dir", "/srv/pool", "--node-kernel", "/k", "--node-initrd", "/i",
		"--libvirt-offerings", "small:1:128,large:2:256"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	lc := cfg.Libvirt
	if cfg.Infra != "libvirt" || lc.URI != "test+unix:///default" || lc.PoolDir != "/srv/pool" || lc.Pool != "clusterd" || lc.Kernel != "/k" || lc.Initrd != "/i" {
		t.Errorf("libvirt config = %+v", lc)
	}
	if len(lc.Offerings) != 2 || lc.Offerings["large"].CPUs != 2 || lc.Offerings["large"].MemoryMiB != 256 {
		t.Errorf("offerings = %+v", lc.Offerings)
	}
	if _, _, err := parse([]string{"--libvirt-offerings", "small:0:128"}, func(string) string { return "" }, io.Discard); err == nil {
		t.Error("an offering of 0 vCPUs was accepted")
	}
}
