package client

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"google.golang.org/grpc/codes"
)

// Backoff says how RetryAborted waits between attempts: Initial, then twice
// as long each time up to Max, with up to half of each wait added at random
// so that clients refused together do not retry together.
type Backoff struct {
	Initial time.Duration
	Max     time.Duration
	// Attempts bounds the calls, the first included (0: until ctx ends).
	Attempts int
}

// DefaultBackoff suits a cluster operation: the holder usually finishes
// within seconds to minutes.
var DefaultBackoff = Backoff{Initial: 200 * time.Millisecond, Max: 5 * time.Second, Attempts: 20}

// Retryable reports whether RetryAborted tries err again: an ABORTED refusal
// because another operation held the cluster or a concurrent request won a
// race. A stale etag (ETAG_MISMATCH) is not: the same request would be
// refused forever.
func Retryable(err error) bool {
	return Code(err) == codes.Aborted && Reason(err) != ReasonEtagMismatch
}

// RetryAborted calls call until it succeeds, fails with an error Retryable
// refuses, runs out of attempts or ctx ends, waiting per b in between. It
// returns the last result. Give mutations a request_id, so that a retry of a
// request that did go through returns its operation instead of a second one.
func RetryAborted[T any](ctx context.Context, b Backoff, call func(ctx context.Context) (T, error)) (T, error) {
	wait := b.Initial
	if wait <= 0 {
		wait = DefaultBackoff.Initial
	}
	for attempt := 1; ; attempt++ {
		out, err := call(ctx)
		if err == nil || !Retryable(err) || (b.Attempts > 0 && attempt >= b.Attempts) {
			return out, err
		}
		sleep := wait + rand.N(wait/2+1)
		t := time.NewTimer(sleep)
		select {
		case <-ctx.Done():
			t.Stop()
			return out, fmt.Errorf("gave up after %d attempts (%w): %w", attempt, ctx.Err(), err)
		case <-t.C:
		}
		if wait *= 2; b.Max > 0 && wait > b.Max {
			wait = b.Max
		}
	}
}
