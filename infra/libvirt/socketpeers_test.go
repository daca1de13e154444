package libvirt

import (
	"net"
	"path/filepath"
	"runtime"
	"testing"
	"time"
)

// TestSocketPeers: with one connection accepted and one left in the
// listener's backlog, as QEMU leaves a second client of a channel's
// socket, the silent-agent log line says accepted=1 waiting=1.
func TestSocketPeers(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc/net/unix")
	}
	path := filepath.Join(t.TempDir(), "m.agent")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if got := socketPeers(path); got != "accepted=0 waiting=0" {
		t.Errorf("no client: %q", got)
	}
	first, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	served, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer served.Close()
	second, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	deadline := time.Now().Add(10 * time.Second)
	for got := socketPeers(path); got != "accepted=1 waiting=1"; got = socketPeers(path) {
		if time.Now().After(deadline) {
			t.Fatalf("one accepted, one in the backlog: %q; want accepted=1 waiting=1", got)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
