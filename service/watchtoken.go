package service

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"slices"

	"github.com/clusterd/clusterd/repository"
)

// A resume token says exactly which rows of the change feed a watch has
// delivered, although the feed's ids commit out of order (see
// repository.SettleWindow): a floor, every row at or below which has been
// delivered or was of no interest, and the ids above the floor already
// delivered. A watch resumed from it reads the rows above the floor and
// skips the delivered ones: it misses nothing and repeats nothing. The
// floor moves past a row only once the row has settled (is older than the
// settle window by the database's clock), when every row with a smaller id
// has committed; the ids at or below the floor are then forgotten.
//
// Encoded, a token is URL-safe base64 of a version byte, the floor and the
// number of ids as uvarints, and each id as its uvarint distance from the
// previous one (from the floor for the first): a few bytes for a watch
// that keeps up. A watch delivers at most maxTokenIDs unsettled rows'
// worth of ids: past that, the floor is moved up to keep the newest
// maxTokenIDs (so a token stays under ~4 KiB even with large gaps), which
// can miss a row only if more than maxTokenIDs rows were delivered within
// the settle window and one with a smaller id then commits later still.

// maxTokenIDs bounds the delivered ids a resume token carries.
const maxTokenIDs = 512

// maxResumeTokenLen bounds the resume token a request may carry.
const maxResumeTokenLen = 8192

// tokenVersion is the first byte of an encoded token.
const tokenVersion = 1

// watchToken is a decoded resume token.
type watchToken struct {
	// Floor: every row with an id at or below it is done with.
	Floor int64
	// Seen are the ids above Floor already delivered, ascending.
	Seen []int64
}

// errBadToken: a resume token that does not decode.
var errBadToken = errors.New("not a resume token of this API")

// encode returns t as an opaque token.
func (t watchToken) encode() string {
	buf := make([]byte, 0, 1+2*binary.MaxVarintLen64+len(t.Seen)*3)
	buf = append(buf, tokenVersion)
	buf = binary.AppendUvarint(buf, uint64(t.Floor))
	buf = binary.AppendUvarint(buf, uint64(len(t.Seen)))
	prev := t.Floor
	for _, id := range t.Seen {
		buf = binary.AppendUvarint(buf, uint64(id-prev))
		prev = id
	}
	return base64.RawURLEncoding.EncodeToString(buf)
}

// decodeWatchToken parses a token encode made; anything else is
// errBadToken.
func decodeWatchToken(s string) (watchToken, error) {
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(raw) == 0 || raw[0] != tokenVersion {
		return watchToken{}, errBadToken
	}
	raw = raw[1:]
	next := func() (uint64, bool) {
		v, n := binary.Uvarint(raw)
		if n <= 0 {
			return 0, false
		}
		raw = raw[n:]
		return v, true
	}
	floor, ok1 := next()
	count, ok2 := next()
	if !ok1 || !ok2 || floor > 1<<62 || count > maxTokenIDs {
		return watchToken{}, errBadToken
	}
	t := watchToken{Floor: int64(floor)}
	prev := t.Floor
	for range count {
		d, ok := next()
		if !ok || d == 0 || d > 1<<62 {
			return watchToken{}, errBadToken
		}
		prev += int64(d)
		if prev <= 0 {
			return watchToken{}, errBadToken
		}
		t.Seen = append(t.Seen, prev)
	}
	if len(raw) != 0 {
		return watchToken{}, errBadToken
	}
	return t, nil
}

// fresh reports whether row id is new to the watch: above the floor and
// not delivered yet.
func (t watchToken) fresh(id int64) bool {
	if id <= t.Floor {
		return false
	}
	_, found := slices.BinarySearch(t.Seen, id)
	return !found
}

// pass returns the token after the watch has looked at row c (rows are
// looked at in id order, every row above the floor, as read): delivered
// says whether c was sent. A settled row raises the floor to its id,
// forgetting the ids below; a delivered row above the floor is remembered.
func (t watchToken) pass(c repository.Change, delivered bool) watchToken {
	t.Seen = slices.Clone(t.Seen)
	t.passOwned(c, delivered)
	return t
}

// passOwned is pass on a token whose Seen nothing else holds, in place: a
// reader of many rows (the hub's poll) copies Seen once for all of them,
// not once a row.
func (t *watchToken) passOwned(c repository.Change, delivered bool) {
	if c.Settled {
		t.raiseOwned(c.ID)
	}
	if delivered && t.fresh(c.ID) {
		i, _ := slices.BinarySearch(t.Seen, c.ID)
		t.Seen = slices.Insert(t.Seen, i, c.ID)
		if len(t.Seen) > maxTokenIDs {
			t.raiseOwned(t.Seen[len(t.Seen)-maxTokenIDs-1])
		}
	}
}

// raiseOwned is raise on a token whose Seen nothing else holds, in place.
func (t *watchToken) raiseOwned(floor int64) {
	if floor <= t.Floor {
		return
	}
	i, found := slices.BinarySearch(t.Seen, floor)
	if found {
		i++
	}
	t.Floor = floor
	t.Seen = append(t.Seen[:0], t.Seen[i:]...)
}

// raise returns t with its floor at least floor, forgetting the ids at or
// below it.
func (t watchToken) raise(floor int64) watchToken {
	if floor <= t.Floor {
		return t
	}
	t.Seen = slices.Clone(t.Seen)
	t.raiseOwned(floor)
	return t
}
