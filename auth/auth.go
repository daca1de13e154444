// Package auth decides who is calling clusterd: a bearer token from the
// token file, a verified TLS client certificate, or, in development mode
// only, the x-clusterd-account header. Handlers ask the Identity it puts in
// the request context which account they act for; nothing else in clusterd
// reads credentials.
package auth

import (
	"context"
	"regexp"
)

// Role is what an identity may do: a user acts on its own account only; an
// admin sees every account, may act for one, and drives the Simulator.
type Role string

// The roles of the token file and of client certificates.
const (
	RoleUser  Role = "user"
	RoleAdmin Role = "admin"
)

// AccountHeader is the request metadata (gRPC) or HTTP header (REST) that an
// admin, or any caller in development mode, uses to act for an account.
// Users' requests carry it in vain: it is ignored for them.
const AccountHeader = "x-clusterd-account"

// DefaultAccount is the account of development-mode callers that name none.
const DefaultAccount = "default"

// accountName is an RFC 1123 label: accounts appear in resource listings and
// logs, so they are held to the same rule as cluster display names.
var accountName = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// ValidAccount reports whether s can name an account.
func ValidAccount(s string) bool { return accountName.MatchString(s) }

// Identity is an authenticated caller.
type Identity struct {
	// Account is the account the caller acts for: the account of the
	// clusters it creates and, unless All, the only account it sees.
	Account string
	Role    Role
	// All is set for an admin that names no account to act for: it sees
	// every account's resources.
	All bool
	// Subject says where the identity came from, for logs ("token
	// sha256:1a2b3c4d", "certificate CN=team-a", "development mode").
	Subject string
}

// Sees reports whether the identity may see and act on a resource of account.
// Handlers answer NOT_FOUND when it may not, so nobody learns that another
// account's resource exists.
func (id Identity) Sees(account string) bool { return id.All || id.Account == account }

// Scope is the account lists are restricted to, or "" for every account.
func (id Identity) Scope() string {
	if id.All {
		return ""
	}
	return id.Account
}

// IsAdmin reports whether the identity has the admin role.
func (id Identity) IsAdmin() bool { return id.Role == RoleAdmin }

type identityKey struct{}

// NewContext returns ctx carrying id; the server's interceptor calls it once
// per request, after authentication.
func NewContext(ctx context.Context, id Identity) context.Context {
	return context.WithValue(ctx, identityKey{}, id)
}

// FromContext returns the request's identity; ok is false when the request
// was not authenticated (which handlers must treat as a refusal).
func FromContext(ctx context.Context) (Identity, bool) {
	id, ok := ctx.Value(identityKey{}).(Identity)
	return id, ok
}
