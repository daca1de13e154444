package libvirt

import (
	"context"
	"errors"
	"fmt"
	"strings"

	golibvirt "github.com/digitalocean/go-libvirt"
)

// WatchingMessage is what Watch logs once it is subscribed: from then on
// no change of a domain escapes it.
const WatchingMessage = "watching libvirt domain events"

// Watch reports libvirt's truth as it changes, for reconciliation: it
// subscribes to domain lifecycle events (started, shut down, destroyed,
// crashed, suspended, redefined...) and calls observe with the cluster of
// each clusterd domain an event is about, until ctx ends (it then returns
// ctx.Err()) or its connection to libvirt breaks (an error: the caller
// calls Watch again, which first connects the driver's own connections
// again if they broke too, and its periodic sweep covers the gap). A
// domain already undefined has no metadata left to name its cluster; its
// destroy_machine step reported it.
func (d *Driver) Watch(ctx context.Context, observe func(clusterIDs ...string)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := d.redial(); err != nil {
		return err
	}
	// A connection of its own: go-libvirt ends a subscription (an RPC)
	// after its channel closes, which a Close of the driver's connection
	// right after would interrupt.
	lv, err := golibvirt.ConnectToURI(d.url)
	if err != nil {
		return fmt.Errorf("libvirt driver: connect to %s for domain events: %w", d.uri, err)
	}
	defer func() { _ = lv.Disconnect() }() // going away: an interrupted unsubscription is fine
	events, err := lv.LifecycleEvents(ctx)
	if err != nil {
		return fmt.Errorf("libvirt driver: subscribe to domain lifecycle events: %w", err)
	}
	d.log.Info(WatchingMessage, "uri", d.uri)
	for ev := range events {
		if !strings.HasPrefix(ev.Dom.Name, "clusterd-") {
			continue
		}
		m, err := d.metaOf(ev.Dom)
		if err != nil {
			d.log.Debug("domain event without clusterd metadata", "domain", ev.Dom.Name, "event", ev.Event, "error", err)
			continue
		}
		if m.Cluster != "" {
			observe(m.Cluster)
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return errors.New("libvirt driver: domain lifecycle events ended: the connection to libvirt closed")
}
