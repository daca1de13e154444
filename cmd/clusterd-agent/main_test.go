package main

import (
	"os"
	"path/filepath"
	"testing"
)

func TestFindPortByName(t *testing.T) {
	sys := t.TempDir()
	for dev, name := range map[string]string{"vport0p1": "org.qemu.guest_agent.0\n", "vport1p2": "org.clusterd.agent.0\n"} {
		if err := os.MkdirAll(filepath.Join(sys, dev), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(sys, dev, "name"), []byte(name), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := findPort(sys, "org.clusterd.agent.0")
	if err != nil || got != "/dev/vport1p2" {
		t.Fatalf("got %q, %v; want /dev/vport1p2", got, err)
	}
	if got, err := findPort(sys, "org.clusterd.agent.1"); err == nil {
		t.Fatalf("got %q for a port that is not there, want an error", got)
	}
}

func TestMachineFromCmdline(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cmdline")
	if err := os.WriteFile(path, []byte("console=ttyS0 clusterd.machine=6673255d-bbb7 panic=-1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := machineFromCmdline(path); got != "6673255d-bbb7" {
		t.Fatalf("got %q, want 6673255d-bbb7", got)
	}
	if got := machineFromCmdline(filepath.Join(t.TempDir(), "missing")); got != "" {
		t.Fatalf("got %q from no command line, want empty", got)
	}
}
