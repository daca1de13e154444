package service

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/clusterd/clusterd/repository"
)

func TestWatchTokenRoundTrip(t *testing.T) {
	many := watchToken{Floor: 1 << 40}
	for i := range maxTokenIDs {
		many.Seen = append(many.Seen, many.Floor+int64(i)*1_000_003+1)
	}
	for _, tok := range []watchToken{{}, {Floor: 7}, {Floor: 7, Seen: []int64{9, 12, 400}}, many} {
		enc := tok.encode()
		if len(enc) > maxResumeTokenLen {
			t.Errorf("token of %d ids: %d bytes; want at most %d", len(tok.Seen), len(enc), maxResumeTokenLen)
		}
		got, err := decodeWatchToken(enc)
		if err != nil || got.Floor != tok.Floor || !slices.Equal(got.Seen, tok.Seen) {
			t.Errorf("decode(encode(%v)) = %v, %v", tok, got, err)
		}
	}
	for _, bad := range []string{"", "!!", "AA", watchToken{Floor: 3}.encode() + "AA", strings.Repeat("A", 40)} {
		if _, err := decodeWatchToken(bad); err == nil {
			t.Errorf("decode(%q) succeeded; want an error", bad)
		}
	}
}

// The rows a watch reads, in id order, with whether each has settled; the
// token after each; what a resume from each token delivers of the same
// rows read again later (all settled by then).
func TestWatchTokenPass(t *testing.T) {
	row := func(id int64, settled bool) repository.Change { return repository.Change{ID: id, Settled: settled} }
	cases := []struct {
		name  string
		start watchToken
		rows  []repository.Change
		// deliver says which rows the watch's filter keeps (all when nil).
		deliver   func(id int64) bool
		wantFloor int64
		wantSeen  []int64
	}{
		{"nothing read", watchToken{Floor: 5}, nil, nil, 5, nil},
		{"settled rows move the floor", watchToken{Floor: 5}, []repository.Change{row(6, true), row(8, true)}, nil, 8, nil},
		{"unsettled rows are remembered", watchToken{Floor: 5}, []repository.Change{row(6, true), row(7, false), row(9, false)}, nil, 6, []int64{7, 9}},
		{"a settled row forgets the ids below it", watchToken{Floor: 5, Seen: []int64{7, 9}}, []repository.Change{row(7, true), row(8, true), row(9, false)}, nil, 8, []int64{9}},
		{"delivered ids are skipped, not remembered twice", watchToken{Floor: 5, Seen: []int64{7}}, []repository.Change{row(7, false), row(8, false)}, nil, 5, []int64{7, 8}},
		{"rows below the floor change nothing", watchToken{Floor: 10, Seen: []int64{12}}, []repository.Change{row(4, true), row(12, false)}, nil, 10, []int64{12}},
		{"a filtered-out row is not remembered but settles", watchToken{Floor: 5}, []repository.Change{row(6, false), row(7, true), row(8, false)},
			func(id int64) bool { return id != 8 }, 7, nil},
		{"Galera: a settled larger id passes an unsettled smaller one", watchToken{Floor: 5}, []repository.Change{row(6, false), row(9, true)}, nil, 9, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tok := tc.start
			for _, r := range tc.rows {
				deliver := tok.fresh(r.ID) && (tc.deliver == nil || tc.deliver(r.ID))
				tok = tok.pass(r, deliver)
			}
			if tok.Floor != tc.wantFloor || !slices.Equal(tok.Seen, tc.wantSeen) {
				t.Errorf("token = %+v; want floor %d, seen %v", tok, tc.wantFloor, tc.wantSeen)
			}
		})
	}
}

// Rows that commit out of order: whatever point a watch stops at, a resume
// from its token delivers exactly the rows it had not, once each.
func TestWatchTokenResumeMissesNothingRepeatsNothing(t *testing.T) {
	// Ids 1..12 become visible in this order; each becomes settled three
	// reads after it appeared.
	order := []int64{1, 3, 2, 4, 7, 5, 6, 8, 12, 9, 11, 10}
	for stop := 0; stop <= len(order); stop++ {
		var (
			visible   []int64
			appeared  = map[int64]int{}
			delivered = map[int64]int{}
			tok       watchToken
		)
		read := func(step int) {
			rows := slices.Clone(visible)
			slices.Sort(rows)
			for _, id := range rows {
				if id <= tok.Floor {
					continue
				}
				c := repository.Change{ID: id, Settled: step-appeared[id] >= 3}
				send := tok.fresh(id)
				if send {
					delivered[id]++
				}
				tok = tok.pass(c, send)
			}
		}
		for step, id := range order {
			visible = append(visible, id)
			appeared[id] = step
			if step < stop {
				read(step)
			}
		}
		// Resume from the token (a new watch), rows read again until all
		// settled.
		tok, _ = decodeWatchToken(tok.encode())
		for step := len(order); step < len(order)+4; step++ {
			read(step)
		}
		for _, id := range order {
			if delivered[id] != 1 {
				t.Errorf("stopped after %d reads: row %d delivered %d times; want once", stop, id, delivered[id])
			}
		}
	}
}

// A watch that delivers more unsettled rows than a token can carry keeps
// the newest and raises its floor past the oldest.
func TestWatchTokenIsBounded(t *testing.T) {
	tok := watchToken{}
	for id := int64(1); id <= 3*maxTokenIDs; id++ {
		tok = tok.pass(repository.Change{ID: id}, true)
	}
	if len(tok.Seen) != maxTokenIDs || tok.Floor != 2*maxTokenIDs {
		t.Errorf("token after %d unsettled rows: floor %d, %d ids; want floor %d, %d ids", 3*maxTokenIDs, tok.Floor, len(tok.Seen), 2*maxTokenIDs, maxTokenIDs)
	}
}

// passCopying is pass as it was written first, a copy of the ids at every
// change: the reference the in-place one is checked against.
func passCopying(t watchToken, c repository.Change, delivered bool) watchToken {
	if c.Settled {
		t = t.raise(c.ID)
	}
	if delivered && t.fresh(c.ID) {
		i, _ := slices.BinarySearch(t.Seen, c.ID)
		t.Seen = slices.Insert(slices.Clone(t.Seen), i, c.ID)
		if len(t.Seen) > maxTokenIDs {
			t = t.raise(t.Seen[len(t.Seen)-maxTokenIDs-1])
		}
	}
	return t
}

// A page of rows passed in place (the hub's poll) leaves the token that
// passing them row by row with copies leaves, and the token it started
// from as it was: a watch that started from the hub's position holds its
// ids.
func TestWatchTokenPassOwnedIsPass(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for round := range 200 {
		start := watchToken{Floor: 100}
		for id := int64(101); id < 140; id++ {
			if rng.IntN(3) == 0 {
				start.Seen = append(start.Seen, id)
			}
		}
		kept := slices.Clone(start.Seen)
		var rows []repository.Change
		for id := int64(101); id < int64(101+rng.IntN(3*maxTokenIDs)); id++ {
			if rng.IntN(4) > 0 {
				rows = append(rows, repository.Change{ID: id, Settled: rng.IntN(3) == 0})
			}
		}
		byRow := start
		owned := start
		owned.Seen = slices.Clone(owned.Seen)
		for _, c := range rows {
			delivered := rng.IntN(5) > 0
			byRow = passCopying(byRow, c, delivered)
			owned.passOwned(c, delivered)
		}
		if owned.Floor != byRow.Floor || !slices.Equal(owned.Seen, byRow.Seen) {
			t.Fatalf("round %d: in place %d %v; row by row %d %v", round, owned.Floor, owned.Seen, byRow.Floor, byRow.Seen)
		}
		if !slices.Equal(start.Seen, kept) {
			t.Fatalf("round %d: the starting token's ids changed: %v; were %v", round, start.Seen, kept)
		}
	}
}
