package server

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/clusterd/clusterd/auth"
)

// openCalls are the authenticated calls in progress, gRPC and REST alike
// (the gateway is a client of the gRPC server). A reload of the token file
// ends those whose credentials no longer stand for the identity they were
// given: without it a revoked token kept its open WaitOperation, or a
// stream, for as long as the call lasted. The registry starts no goroutine:
// revoke cancels contexts, and each call's handler returns on its own.
type openCalls struct {
	mu    sync.Mutex
	calls map[*openCall]struct{}
}

type openCall struct {
	creds  auth.Credentials
	id     auth.Identity
	cancel context.CancelCauseFunc
}

func newOpenCalls() *openCalls { return &openCalls{calls: map[*openCall]struct{}{}} }

// open registers a call that authenticated as id with creds. Its context is
// cancelled with auth.ErrRevoked once still (the authenticator's verdict
// on the current token table) no longer holds for it; done ends the
// registration and must be called when the call returns.
//
// still is asked again after registering: a reload that swapped the table
// after this call authenticated, but scanned the registry before it was
// added, would otherwise miss it.
func (o *openCalls) open(ctx context.Context, creds auth.Credentials, id auth.Identity, still func(auth.Credentials, auth.Identity) bool) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	c := &openCall{creds: creds, id: id, cancel: cancel}
	o.mu.Lock()
	o.calls[c] = struct{}{}
	o.mu.Unlock()
	if !still(creds, id) {
		o.mu.Lock()
		delete(o.calls, c)
		o.mu.Unlock()
		cancel(revokedError(id))
	}
	return ctx, func() {
		o.mu.Lock()
		delete(o.calls, c)
		o.mu.Unlock()
		cancel(nil)
	}
}

// revoke ends every open call for which still no longer holds and returns
// how many it ended.
func (o *openCalls) revoke(still func(auth.Credentials, auth.Identity) bool) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for c := range o.calls {
		if !still(c.creds, c.id) {
			c.cancel(revokedError(c.id))
			delete(o.calls, c)
			n++
		}
	}
	return n
}

// revokedError is the cause of a revoked call's cancellation, which the
// call answers with (UNAUTHENTICATED, reason CREDENTIALS_REVOKED).
func revokedError(id auth.Identity) error {
	return fmt.Errorf("%w: since the server reloaded its token file, the credentials of this call (%s) no longer stand for account %s as %s",
		auth.ErrRevoked, id.Subject, id.Account, id.Role)
}

// revoked is the error a call ends with when its credentials were revoked
// while it ran, or nil when they were not.
func revoked(ctx context.Context) error {
	if cause := context.Cause(ctx); errors.Is(cause, auth.ErrRevoked) {
		return cause
	}
	return nil
}

// stillAuthenticates reports whether creds still authenticate as id under
// the authenticator's current table: a token removed from the file, or
// given another account or role, does not.
func (s *Server) stillAuthenticates(creds auth.Credentials, id auth.Identity) bool {
	now, err := s.auth.Authenticate(creds)
	return err == nil && now == id
}
