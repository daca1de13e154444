package main

import (
	"bufio"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDeployFilesNameRealFlags reads the deployment files' CLUSTERD_*
// settings (deploy/systemd/clusterd.env, its commented examples too, and
// the Kubernetes Deployment): each must be the twin of a flag, and the
// environment file's settings must parse, so a renamed flag or a bad value
// there fails here rather than at a user's start.
func TestDeployFilesNameRealFlags(t *testing.T) {
	root := filepath.Join("..", "..", "deploy")
	flags := map[string]bool{}
	_, _, err := parse([]string{"-h"}, func(string) string { return "" }, &flagLister{flags})
	if err == nil {
		t.Fatal("parse -h: no error; want flag.ErrHelp")
	}
	if len(flags) < 20 {
		t.Fatalf("read %d flag names from the usage text; the lister is broken", len(flags))
	}

	envFile, err := os.Open(filepath.Join(root, "systemd", "clusterd.env"))
	if err != nil {
		t.Fatal(err)
	}
	defer envFile.Close()
	settings := map[string]string{}
	sc := bufio.NewScanner(envFile)
	setting := regexp.MustCompile(`^(#)?(CLUSTERD_[A-Z0-9_]+)=(.*)$`)
	for n := 1; sc.Scan(); n++ {
		m := setting.FindStringSubmatch(strings.TrimSpace(sc.Text()))
		if m == nil {
			continue
		}
		if !flags[m[2]] {
			t.Errorf("clusterd.env line %d: %s is no flag's twin", n, m[2])
		}
		if m[1] == "" {
			settings[m[2]] = m[3]
		}
	}
	if len(settings) == 0 {
		t.Fatal("clusterd.env sets nothing")
	}
	if _, _, err := parse(nil, func(k string) string { return settings[k] }, io.Discard); err != nil {
		t.Errorf("clusterd.env's settings do not parse: %v", err)
	}

	manifest, err := os.ReadFile(filepath.Join(root, "kubernetes", "deployment.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`name: (CLUSTERD_[A-Z0-9_]+)`).FindAllStringSubmatch(string(manifest), -1) {
		if !flags[m[1]] {
			t.Errorf("deployment.yaml: %s is no flag's twin", m[1])
		}
	}
}

// flagLister collects the environment twins of the flags a usage text
// lists ("  -grpc-addr string").
type flagLister struct{ names map[string]bool }

var usageFlag = regexp.MustCompile(`(?m)^  -([a-z0-9-]+)`)

func (l *flagLister) Write(p []byte) (int, error) {
	for _, m := range usageFlag.FindAllStringSubmatch(string(p), -1) {
		l.names[envName(m[1])] = true
	}
	return len(p), nil
}
