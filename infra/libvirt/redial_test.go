package libvirt

import (
	"context"
	"errors"
	"net/url"
	"os"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/clusterd/clusterd/repository"
)

type passGuard struct{}

func (passGuard) CheckHolder(context.Context, repository.Fence) error { return nil }

// TestWatchConnectsAgainAfterALostConnection: once the driver's connection
// to libvirt is lost (libvirtd restarted), its steps fail until the next
// Watch, which connects it (and its network filters' connection) again
// before subscribing; from then on the steps work again.
func TestWatchConnectsAgainAfterALostConnection(t *testing.T) {
	uri := "test+unix:///default"
	if u := os.Getenv("CLUSTERD_TEST_LIBVIRT_URI"); u != "" {
		uri = u
	}
	u, _ := url.Parse(uri)
	if probe, err := golibvirt.ConnectToURI(u); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("libvirtd does not answer on %s (make libvirt starts it): %v", uri, err)
		}
		t.Skipf("libvirtd does not answer on %s (make libvirt starts it): %v", uri, err)
	} else {
		_ = probe.Disconnect()
	}
	dir, err := os.MkdirTemp("", "lv-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	d, err := New(ctx, Config{URI: uri, PoolDir: dir, Pool: "clusterd-test-redial", Guard: passGuard{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	// The connections break as a libvirtd restart breaks them.
	_ = d.conn().Disconnect()
	if d.filterURL != nil {
		_ = d.filterConn().Disconnect()
	}
	if _, err := d.Machines(ctx); err == nil {
		t.Fatal("Machines on a lost connection succeeded; want an error")
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.Watch(wctx, func(...string) {}) }()
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := d.Machines(ctx)
		if err == nil {
			_, err = d.Rules(ctx, "00000000-0000-0000-0000-000000000000")
		}
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Machines after Watch: %v; want the connection back", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Watch ended with %v; want context.Canceled", err)
	}
}
