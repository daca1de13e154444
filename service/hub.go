package service

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
)

// WatchStore is the part of the repository watches read.
type WatchStore interface {
	ReadChanges(ctx context.Context, q repository.ChangeQuery) ([]repository.Change, error)
	ReadChangeMarks(ctx context.Context, q repository.ChangeQuery) ([]repository.Change, error)
	ChangeHead(ctx context.Context, settle time.Duration) (repository.ChangeHead, error)
	ChangesPurgedThrough(ctx context.Context) (int64, error)
	ClustersByID(ctx context.Context, ids []string) (map[string]repository.Cluster, error)
	JobsByID(ctx context.Context, ids []string) (map[string]repository.Job, error)
	GetJob(ctx context.Context, id string) (repository.Job, error)
}

// HubConfig is what a Hub needs.
type HubConfig struct {
	Store WatchStore
	// Infra reports the clusters' nodes, so a watch's clusters are what
	// GetCluster returns.
	Infra infra.Infrastructure
	// Poll is how often the feed is read (default 200ms).
	Poll time.Duration
	// Settle is the feed's settle window (default
	// repository.SettleWindow); tests shorten it.
	Settle time.Duration
	// Buffer is how many changes a watcher may fall behind before it is
	// ended with WATCH_TOO_SLOW (default DefaultWatchBuffer).
	Buffer int
	// MaxPerAccount caps the watches one account may have open on this
	// server (default DefaultMaxWatchesPerAccount; WATCH_LIMIT past it).
	MaxPerAccount int
	// Keep is how long the hub keeps the changes it read, so that a watch
	// that resumes from a token of that age attaches without reading the
	// feed itself (default 1 minute).
	Keep time.Duration
	// Bookmark is how often a watch is told its newer resume token while
	// nothing it keeps changes (default 1 minute).
	Bookmark time.Duration
	Logger   *slog.Logger
}

// Hub is a server's one reader of the change feed: it reads the feed every
// Poll, one query whoever watches (and, when it found changes and a watcher
// is attached, one read of their clusters, their jobs and their nodes), and
// hands each change to every watcher of this process, which filters it. A change committed
// through any server sharing the database reaches every server's watchers
// at their next poll. Each watcher has a bounded buffer; one that falls
// behind is ended (WATCH_TOO_SLOW, with its resume token), never buffered
// without end. Run owns the polling goroutine; when it returns, every
// watch ends UNAVAILABLE (SHUTTING_DOWN), so clients resume on another
// server.
type Hub struct {
	cfg HubConfig
	log *slog.Logger

	// ready is closed once Run has read the feed's head, halted once Run
	// has returned.
	ready, halted chan struct{}

	mu sync.Mutex
	// stopped: Run has returned; no watch may start.
	stopped bool
	// pos is where the hub has read up to, as a token of its own.
	pos watchToken
	// window holds the changes read with an id above base, in the order
	// read; base is a floor the hub had, so a watcher whose floor is at or
	// above base finds every change it still needs in window.
	window []watchItem
	base   int64
	// seq numbers the changes the hub reads (watchItem.seq).
	seq   uint64
	marks []floorMark
	// bookmarked is when markers last asked watchers for a bookmark.
	bookmarked time.Time
	// watchers are the attached watchers; open counts the watches of each
	// account, attached or starting.
	watchers map[*watcher]struct{}
	open     map[string]int
	// states is, per cluster, the state the newest history entry the
	// hub has read left it in: the state a progress or end change is
	// shown with (only Run's goroutine uses it).
	states map[string]clusterSnapshot
	// read is the highest id a poll has read (only Run's goroutine uses
	// it). While rows above the floor up to it have not settled, each
	// poll reads their marks again: a row with a smaller id than those
	// may commit later.
	read int64
}

// clusterSnapshot is a cluster's state, version and holder as a history
// entry left them.
type clusterSnapshot struct {
	state   lifecycle.State
	version int64
	op      string
}

// floorMark is the hub's floor at a time, for trimming the window.
type floorMark struct {
	at    time.Time
	floor int64
}

// watchItem is one change as the hub hands it out, with what it was read
// with: the cluster (nil for a job of no cluster), as stored and as
// GetCluster presents it (nodes included), and the change's job, if any.
// An item with no change only raises the watcher's floor to floor: every
// change up to it has been handed out.
type watchItem struct {
	change *repository.Change
	// cluster is the cluster as the change left it, as far as the feed
	// says: its state, version and holder are those of the change (a
	// history entry) or of the newest history entry before it that was
	// read with it; its other fields are as read.
	cluster *repository.Cluster
	view    *clv1.Cluster
	job     *repository.Job
	// snap is the cluster's state, version and holder as the history
	// entries read up to this change left them (hasSnap false: none read).
	// staged says the item has not been presented yet: cluster, view and
	// job are unset until present reads them. A watcher only receives
	// presented items.
	snap    clusterSnapshot
	hasSnap bool
	staged  bool
	floor   int64
	// bookmark, on a marker, asks the watch to send its token if it
	// moved since its last message.
	bookmark bool
	// seq orders the changes in the hub's window.
	seq uint64
}

// watcher is one open watch as the hub sees it.
type watcher struct {
	account string
	items   chan watchItem
	// done is closed, with err set, when the hub ends the watch.
	done chan struct{}
	err  error
	// marked is the floor of the last marker queued (h.mu held).
	marked int64
}

// Defaults of HubConfig.
const (
	// DefaultWatchBuffer: a watcher may fall this many changes behind.
	DefaultWatchBuffer = 1024
	// DefaultMaxWatchesPerAccount: watches one account may have open on a
	// server.
	DefaultMaxWatchesPerAccount = 64
)

// NewHub returns a hub; Run starts it.
func NewHub(cfg HubConfig) *Hub {
	if cfg.Poll <= 0 {
		cfg.Poll = 200 * time.Millisecond
	}
	if cfg.Settle <= 0 {
		cfg.Settle = repository.SettleWindow
	}
	if cfg.Buffer <= 0 {
		cfg.Buffer = DefaultWatchBuffer
	}
	if cfg.MaxPerAccount <= 0 {
		cfg.MaxPerAccount = DefaultMaxWatchesPerAccount
	}
	if cfg.Keep <= 0 {
		cfg.Keep = time.Minute
	}
	if cfg.Bookmark <= 0 {
		cfg.Bookmark = time.Minute
	}
	if cfg.Keep < 2*cfg.Settle {
		cfg.Keep = 2 * cfg.Settle
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Hub{cfg: cfg, log: log, ready: make(chan struct{}), halted: make(chan struct{}), watchers: map[*watcher]struct{}{}, open: map[string]int{},
		states: map[string]clusterSnapshot{}}
}

// errWatchExpired: a resume token older than the feed's retention.
var errWatchExpired = errors.New("resume token expired")

// WatchTooSlowError ends a watcher that fell further behind than its
// buffer; Token is where it can resume.
type WatchTooSlowError struct{ Token string }

func (e *WatchTooSlowError) Error() string { return "the watch fell too far behind" }

// WatchLimitError refuses a watch past the account's limit.
type WatchLimitError struct {
	Account string
	Limit   int
}

func (e *WatchLimitError) Error() string {
	return fmt.Sprintf("account %q has %d watches open on this server, the most it may; close one or retry later", e.Account, e.Limit)
}

// Run polls the feed until ctx ends, then ends every watch (SHUTTING_DOWN)
// and returns. A failed read is logged and tried again at the next poll.
func (h *Hub) Run(ctx context.Context) {
	defer h.stop()
	t := time.NewTicker(h.cfg.Poll)
	defer t.Stop()
	started := false
	var warned time.Time
	for {
		if !started {
			head, err := h.cfg.Store.ChangeHead(ctx, h.cfg.Settle)
			if err == nil {
				h.mu.Lock()
				h.pos, h.base = watchToken{Floor: head.Floor}, head.Floor
				h.mu.Unlock()
				started = true
				close(h.ready)
			} else if ctx.Err() == nil {
				h.log.Warn("watch hub: read the change feed's head", "error", err)
			}
		} else if err := h.poll(ctx); err != nil && ctx.Err() == nil && time.Since(warned) >= time.Minute {
			// Once a minute at most: the health probe reports the
			// database's outage, and the poll tries again.
			h.log.Warn("watch hub: read the change feed", "error", err)
			warned = time.Now()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// stop ends every watch: the server is going away.
func (h *Hub) stop() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.stopped = true
	close(h.halted)
	for w := range h.watchers {
		h.end(w, errShuttingDown)
	}
}

// end detaches w and closes its done with err (h.mu held).
func (h *Hub) end(w *watcher, err error) {
	if _, ok := h.watchers[w]; !ok {
		return
	}
	delete(h.watchers, w)
	w.err = err
	close(w.done)
}

// pollLimit bounds the changes one read of the feed returns.
const pollLimit = 1000

// poll reads the feed once (again at once while it returns whole pages)
// and hands the new changes out. While rows it has read stay above the
// floor (not settled yet), it reads the feed's marks first (ids, whether
// settled), and whole only from the first row it has not handed out: the
// rows after the newest it read, or one that committed later than rows
// with larger ids. A poll is then two reads of the feed rather than one,
// where it read every unsettled row whole again.
func (h *Hub) poll(ctx context.Context) error {
	h.mu.Lock()
	after := h.pos.Floor
	h.mu.Unlock()
	// A page is published at once: it never holds more than a watcher's
	// buffer, so a watcher that keeps up is never cut off by a burst.
	limit := min(pollLimit, h.cfg.Buffer)
	for {
		h.mu.Lock()
		pos := h.pos
		h.mu.Unlock()
		// Pages follow the last id read, not the floor, which unsettled
		// rows hold back.
		rows, full, err := h.readPage(ctx, pos, max(after, pos.Floor), limit)
		if err != nil {
			return err
		}
		if len(rows) > 0 {
			after = rows[len(rows)-1].ID
			h.read = max(h.read, after)
		}
		var fresh []repository.Change
		// This page's own copy of the ids seen: h.pos, which a starting
		// watch may hold, is replaced at publish, never written.
		pos.Seen = slices.Clone(pos.Seen)
		for _, c := range rows {
			if !c.Brief && pos.fresh(c.ID) {
				fresh = append(fresh, c)
			}
			pos.passOwned(c, true)
		}
		items, states := stage(fresh, h.states)
		// What a change shows is read only when a watcher may receive it:
		// otherwise the items are kept staged, and a watch that attaches
		// later presents the ones it replays.
		if !h.publish(items, pos, false) {
			if err := h.present(ctx, items); err != nil {
				// The page is read again: h.states stays as it was.
				return err
			}
			h.publish(items, pos, true)
		}
		states.apply(h.states)
		if !full {
			return nil
		}
	}
}

// readPage reads up to limit rows of the feed above from, in id order: the
// rows pos has handed out briefly, the others whole. full reports a page
// that may have more after it.
func (h *Hub) readPage(ctx context.Context, pos watchToken, from int64, limit int) (rows []repository.Change, full bool, err error) {
	q := repository.ChangeQuery{After: from, Settle: h.cfg.Settle, Limit: limit}
	if h.read <= from {
		rows, err = h.cfg.Store.ReadChanges(ctx, q)
		return rows, len(rows) >= limit, err
	}
	marks, err := h.cfg.Store.ReadChangeMarks(ctx, q)
	if err != nil {
		return nil, false, err
	}
	i := slices.IndexFunc(marks, func(c repository.Change) bool { return pos.fresh(c.ID) })
	if i < 0 {
		return marks, len(marks) >= limit, nil
	}
	q.After = marks[i].ID - 1
	whole, err := h.cfg.Store.ReadChanges(ctx, q)
	if err != nil {
		return nil, false, err
	}
	return append(marks[:i], whole...), len(whole) >= limit, nil
}

// stage makes the items of changes, in order, with the snapshot of their
// cluster that the history entries read so far give: those in states, then
// those in changes. It reads nothing (present reads what the items show)
// and leaves states as it is: the snapshots the changes leave are returned,
// for the caller to apply once the items are published.
func stage(changes []repository.Change, states map[string]clusterSnapshot) ([]watchItem, snapshots) {
	next := snapshots{}
	items := make([]watchItem, len(changes))
	for i := range changes {
		ch := &changes[i]
		it := watchItem{change: ch, staged: true}
		if ch.Kind == repository.ChangeHistory {
			next[ch.ClusterID] = &clusterSnapshot{state: ch.State, version: ch.Version, op: ch.CurrentOperation}
		}
		snap, ok := next[ch.ClusterID]
		if !ok {
			if s, found := states[ch.ClusterID]; found {
				snap = &s
			}
		}
		if snap != nil {
			it.snap, it.hasSnap = *snap, true
			if snap.state == lifecycle.Destroyed {
				next[ch.ClusterID] = nil // nothing moves it any more
			}
		}
		items[i] = it
	}
	return items, next
}

// snapshots are the clusters' snapshots a page of changes leaves, by
// cluster id; nil for a cluster whose snapshot is dropped (destroyed).
type snapshots map[string]*clusterSnapshot

// apply writes the snapshots into states.
func (n snapshots) apply(states map[string]clusterSnapshot) {
	for id, snap := range n {
		if snap == nil {
			delete(states, id)
		} else {
			states[id] = *snap
		}
	}
}

// present reads what the staged items among items show: their clusters,
// with their nodes, and their jobs, one query each; a cluster's state,
// version and holder are those of the item's snapshot. Items already
// presented are left as they are.
func (h *Hub) present(ctx context.Context, items []watchItem) error {
	var clusterIDs, jobIDs []string
	for _, it := range items {
		if !it.staged {
			continue
		}
		if c := it.change; c.ClusterID != "" && !slices.Contains(clusterIDs, c.ClusterID) {
			clusterIDs = append(clusterIDs, c.ClusterID)
		}
		if c := it.change; c.Operation != "" && !slices.Contains(jobIDs, c.Operation) {
			jobIDs = append(jobIDs, c.Operation)
		}
	}
	var (
		clusters map[string]repository.Cluster
		jobs     map[string]repository.Job
		err      error
	)
	if len(clusterIDs) > 0 {
		if clusters, err = h.cfg.Store.ClustersByID(ctx, clusterIDs); err != nil {
			return err
		}
	}
	if len(jobIDs) > 0 {
		if jobs, err = h.cfg.Store.JobsByID(ctx, jobIDs); err != nil {
			return err
		}
	}
	views := map[string]*clv1.Cluster{}
	if len(clusters) > 0 {
		for _, c := range clusters {
			views[c.ID] = toCluster(c)
		}
		machines, err := h.cfg.Infra.Machines(ctx, clusterIDs...)
		if err != nil {
			return fmt.Errorf("list nodes: %w", err)
		}
		for _, m := range machines {
			if v := views[m.ClusterID]; v != nil {
				v.Nodes = append(v.Nodes, toNode(v.DisplayName, m))
			}
		}
	}
	for i := range items {
		it := &items[i]
		if !it.staged {
			continue
		}
		it.staged = false
		it.view = views[it.change.ClusterID]
		if c, ok := clusters[it.change.ClusterID]; ok {
			if it.hasSnap {
				c.State, c.Version, c.CurrentOperation = it.snap.state, it.snap.version, it.snap.op
			}
			it.cluster = &c
		}
		if j, ok := jobs[it.change.Operation]; ok {
			it.job = &j
		}
	}
	return nil
}

// publish hands items, then the hub's new floor, to every watcher, ending
// the ones whose buffer is full; and keeps items in the window. Items not
// presented (presented false) are published only while no watcher is
// attached: otherwise publish changes nothing and returns false, and the
// caller presents them and publishes again.
func (h *Hub) publish(items []watchItem, pos watchToken, presented bool) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !presented && len(items) > 0 && len(h.watchers) > 0 {
		return false
	}
	h.pos = pos
	for i := range items {
		h.seq++
		items[i].seq = h.seq
	}
	h.window = append(h.window, items...)
	now := time.Now()
	h.marks = append(h.marks, floorMark{at: now, floor: pos.Floor})
	// Forget what no watcher can need: the changes at or below a floor the
	// hub had Keep ago.
	cut := 0
	for cut < len(h.marks)-1 && now.Sub(h.marks[cut+1].at) >= h.cfg.Keep {
		cut++
	}
	if cut > 0 && h.marks[cut].floor > h.base {
		h.base = h.marks[cut].floor
		h.window = slices.DeleteFunc(h.window, func(it watchItem) bool { return it.change.ID <= h.base })
	}
	h.marks = h.marks[cut:]
	marker := watchItem{floor: pos.Floor}
	if now.Sub(h.bookmarked) >= h.cfg.Bookmark {
		marker.bookmark, h.bookmarked = true, now
	}
	for w := range h.watchers {
		if !w.offer(items, marker) {
			h.end(w, &WatchTooSlowError{})
		}
	}
	return true
}

// offer queues items and marker without blocking; false when the buffer
// is full for an item (the watcher must end: what it queued so far is a
// prefix of the feed, so its token stays exact). A marker that finds the
// buffer full, or that would not raise the floor, is left out: a later one
// carries a higher floor, and until then the watcher's token only keeps
// a few more ids.
func (w *watcher) offer(items []watchItem, marker watchItem) bool {
	for _, it := range items {
		select {
		case w.items <- it:
		default:
			return false
		}
	}
	if marker.floor > w.marked || marker.bookmark {
		select {
		case w.items <- marker:
			w.marked = marker.floor
		default:
		}
	}
	return true
}

// open counts a watch of account against its limit; the returned func
// gives it back.
func (h *Hub) openWatch(account string) (func(), error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopped {
		return nil, errShuttingDown
	}
	if h.open[account] >= h.cfg.MaxPerAccount {
		return nil, &WatchLimitError{Account: account, Limit: h.cfg.MaxPerAccount}
	}
	h.open[account]++
	return func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.open[account]--; h.open[account] <= 0 {
			delete(h.open, account)
		}
	}, nil
}

// waitReady waits until the hub has read the feed's head.
func (h *Hub) waitReady(ctx context.Context) error {
	select {
	case <-h.ready:
		return nil
	case <-h.halted:
		return errShuttingDown
	case <-ctx.Done():
		return ctx.Err()
	}
}

// catchUpLimit bounds the changes a watch reads at a time while it catches
// up to the hub.
const catchUpLimit = 500

// attach brings a watch from tok up to the hub and attaches it: while its
// floor is below what the hub keeps, it reads the feed itself (visit sees
// each change, in id order, and returns the token after it); then it
// visits the hub's kept changes above its floor, again while the hub reads
// more, and attaches once it has visited all the hub has: from then on the
// returned watcher receives every change the hub reads. A long replay
// therefore does not count against the watcher's buffer.
func (h *Hub) attach(ctx context.Context, account string, tok watchToken, visit func(watchItem, watchToken) (watchToken, error)) (*watcher, watchToken, error) {
	var (
		replayed uint64 // the seq of the last kept change visited
		after    int64  // the last id read from the feed while catching up
	)
	for {
		h.mu.Lock()
		if h.stopped {
			h.mu.Unlock()
			return nil, tok, errShuttingDown
		}
		if tok.Floor >= h.base {
			i := h.windowIndex(replayed + 1)
			kept := slices.Clone(h.window[i:min(len(h.window), i+catchUpLimit)])
			if len(kept) == 0 {
				w := &watcher{account: account, items: make(chan watchItem, h.cfg.Buffer), done: make(chan struct{})}
				h.watchers[w] = struct{}{}
				tok, _ = visit(watchItem{floor: h.pos.Floor}, tok) // a marker: no send
				h.mu.Unlock()
				return w, tok, nil
			}
			h.mu.Unlock()
			// The items the hub kept staged are presented, a page at a
			// time, and kept presented for the next watch.
			if err := h.present(ctx, kept); err != nil {
				return nil, tok, err
			}
			h.keepPresented(kept)
			for _, it := range kept {
				var err error
				if tok, err = visit(it, tok); err != nil {
					return nil, tok, err
				}
				replayed = it.seq
			}
			continue
		}
		base := h.base
		h.mu.Unlock()
		// Pages follow the last id read, not the floor, which unsettled
		// rows hold back.
		rows, err := h.cfg.Store.ReadChanges(ctx, repository.ChangeQuery{After: max(after, tok.Floor), Settle: h.cfg.Settle, Limit: catchUpLimit})
		if err != nil {
			return nil, tok, err
		}
		if len(rows) > 0 {
			after = rows[len(rows)-1].ID
		}
		if len(rows) == 0 {
			// Nothing above the floor now: the hub's kept changes are all
			// there is to see.
			tok = tok.raise(base)
			continue
		}
		var fresh []repository.Change
		for _, c := range rows {
			if tok.fresh(c.ID) {
				fresh = append(fresh, c)
			}
		}
		items, _ := stage(fresh, nil)
		if err := h.present(ctx, items); err != nil {
			return nil, tok, err
		}
		next := 0
		for _, c := range rows {
			it := watchItem{change: &c}
			if next < len(items) && items[next].change.ID == c.ID {
				it = items[next]
				next++
			}
			if tok, err = visit(it, tok); err != nil {
				return nil, tok, err
			}
		}
	}
}

// windowIndex is the index in the window of the first item whose seq is at
// least seq (h.mu held).
func (h *Hub) windowIndex(seq uint64) int {
	i, _ := slices.BinarySearchFunc(h.window, seq, func(it watchItem, seq uint64) int { return cmp.Compare(it.seq, seq) })
	return i
}

// keepPresented puts items, presented by an attaching watch, back in the
// window in place of the staged ones they were copied from, so the next
// watch to attach does not read them again.
func (h *Hub) keepPresented(items []watchItem) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, it := range items {
		if i := h.windowIndex(it.seq); i < len(h.window) && h.window[i].seq == it.seq && h.window[i].staged {
			h.window[i] = it
		}
	}
}

// detach ends a watcher its watch no longer reads.
func (h *Hub) detach(w *watcher) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.watchers[w]; ok {
		delete(h.watchers, w)
	}
}
