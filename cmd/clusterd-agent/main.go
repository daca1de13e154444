// Command clusterd-agent is the node agent inside a machine's guest (the
// node image's init runs it as PID 1's successor). It serves package agent's
// protocol on the virtio-serial port agent.PortName, keeps its state on the
// raw disk -state and reads the version from the ISO in -iso, and serves
// for ever: when the host closes the channel it waits for the next
// connection. As the guest's PID 1 it powers the machine off when the ACPI
// power button is pressed (libvirt's graceful shutdown).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/clusterd/clusterd/agent"
)

func main() {
	port := flag.String("port", agent.PortName, "name of the virtio-serial port to serve on")
	state := flag.String("state", "/dev/vda", "raw disk (or file) that keeps the agent's state")
	iso := flag.String("iso", "/dev/sr0", "cdrom (or image file) holding the version's ISO")
	machine := flag.String("machine", "", "machine id (default: clusterd.machine= on the kernel command line)")
	pki := flag.String("pki-dir", "/etc/kubernetes/pki", "where a join's cluster CA is stored (ca.crt, and ca.key 0600 on a control node)")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("clusterd-agent: ")

	if *machine == "" {
		*machine = machineFromCmdline("/proc/cmdline")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if os.Getpid() == 1 {
		// The guest's init: answer the ACPI power button (libvirt's
		// graceful shutdown) by powering off.
		go watchPowerButton(ctx, "/dev/input", powerOff)
	}
	cfg := agent.Config{State: &agent.DiskStore{Path: *state}, ISO: agent.ISOFile{Path: *iso}, Machine: *machine, PKIDir: *pki}
	log.Printf("machine %q, state %s, iso %s, port %s", *machine, *state, *iso, *port)
	serve(ctx, *port, cfg)
}

// serve finds the port and serves it until ctx is done, reopening it after
// each host connection ends (a virtio-serial port reads EOF while no host
// is connected, so this also waits for the first one).
func serve(ctx context.Context, name string, cfg agent.Config) {
	var lastErr string
	report := func(err error) {
		if err == nil {
			lastErr = ""
			return
		}
		if msg := err.Error(); msg != lastErr {
			log.Print(msg)
			lastErr = msg
		}
	}
	for ctx.Err() == nil {
		dev, err := findPort("/sys/class/virtio-ports", name)
		if err == nil {
			err = serveOnce(ctx, dev, cfg)
		}
		report(err)
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// serveOnce serves one host connection on the port device dev.
func serveOnce(ctx context.Context, dev string, cfg agent.Config) error {
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("open port: %w", err)
	}
	defer f.Close()
	if err := agent.Serve(ctx, f, cfg); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("serve %s: %w", dev, err)
	}
	return nil
}

// findPort returns the device (/dev/vportNpM) of the virtio-serial port
// whose name (as the host's channel gives it) is name.
func findPort(sysDir, name string) (string, error) {
	entries, err := filepath.Glob(filepath.Join(sysDir, "*", "name"))
	if err != nil {
		return "", fmt.Errorf("find port %s: %w", name, err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(e)
		if err != nil {
			continue
		}
		if strings.TrimSpace(string(b)) == name {
			return filepath.Join("/dev", filepath.Base(filepath.Dir(e))), nil
		}
	}
	return "", fmt.Errorf("find port %s: no virtio-serial port of that name (yet)", name)
}

// machineFromCmdline returns clusterd.machine=ID from the kernel command
// line at path, or "" when it is not there.
func machineFromCmdline(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	for _, f := range strings.Fields(string(b)) {
		if v, ok := strings.CutPrefix(f, "clusterd.machine="); ok {
			return v
		}
	}
	return ""
}
