package auth

import (
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"unicode/utf8"
)

// Errors of authentication. The server maps them to UNAUTHENTICATED (REST
// 401) and PERMISSION_DENIED (403); their messages never contain a
// credential.
var (
	// ErrNoCredentials: the request carries no token or certificate and the
	// server is not in development mode.
	ErrNoCredentials = errors.New("no credentials")
	// ErrBadCredentials: a token that is unknown or malformed, or a client
	// certificate that names no valid account.
	ErrBadCredentials = errors.New("invalid credentials")
	// ErrAdminOnly: an authenticated user called an admin-only service.
	ErrAdminOnly = errors.New("permission denied")
	// ErrRevoked: a call in progress whose credentials a reload of the
	// token file removed (or gave another account or role); the server ends
	// it rather than let it finish on an identity that no longer exists.
	ErrRevoked = errors.New("credentials revoked")
)

// HeaderError is a credential header that is not even well-formed (not
// UTF-8, or an account that is no DNS label): INVALID_ARGUMENT, naming the
// header.
type HeaderError struct {
	Header string
	Detail string
}

// Error names the header.
func (e *HeaderError) Error() string { return e.Header + ": " + e.Detail }

// AdminOU is the OrganizationalUnit that makes a client certificate's
// subject an admin; any other certificate is a user of the account named by
// its CommonName.
const AdminOU = "clusterd-admin"

// Credentials is what one request presents, gathered by the server from gRPC
// metadata, the TLS connection, or (for REST) the gateway.
type Credentials struct {
	// Authorization is the authorization header ("Bearer <token>"), if any.
	Authorization string
	// Account is the x-clusterd-account header, if any.
	Account string
	// Certificate is the client certificate the TLS handshake verified
	// against --tls-client-ca, if any; never an unverified one.
	Certificate *x509.Certificate
}

// Config says which identities a server accepts. With neither, it runs in
// development mode.
type Config struct {
	// TokensFile is the --auth-tokens file; "" accepts no tokens.
	TokensFile string
	// ClientCertificates is set when mutual TLS verifies client
	// certificates (--tls-client-ca).
	ClientCertificates bool
}

// Authenticator turns a request's credentials into an Identity. It is safe
// for concurrent use; Reload swaps the token table without disturbing
// requests in flight.
type Authenticator struct {
	cfg    Config
	tokens atomic.Pointer[Tokens]
}

// New loads the token file, if any.
func New(cfg Config) (*Authenticator, error) {
	a := &Authenticator{cfg: cfg}
	if cfg.TokensFile != "" {
		if _, err := a.Reload(); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// DevMode reports whether the server accepts no identities at all, so that
// the account comes from the x-clusterd-account header. The server only
// allows it on loopback listeners.
func (a *Authenticator) DevMode() bool {
	return a.cfg.TokensFile == "" && !a.cfg.ClientCertificates
}

// Reload reads the token file again (on SIGHUP) and returns how many
// identities it holds. On error, a file with no identity included (see
// LoadTokens), the previous table stays in force.
func (a *Authenticator) Reload() (int, error) {
	if a.cfg.TokensFile == "" {
		return 0, nil
	}
	t, err := LoadTokens(a.cfg.TokensFile)
	if err != nil {
		return 0, err
	}
	a.tokens.Store(t)
	return t.Len(), nil
}

// Authenticate decides who sent a request: a bearer token wins, then a
// verified client certificate, then development mode. An admin may name the
// account it acts for in the x-clusterd-account header; a user's header is
// ignored.
func (a *Authenticator) Authenticate(c Credentials) (Identity, error) {
	if !utf8.ValidString(c.Authorization) {
		return Identity{}, &HeaderError{Header: "authorization", Detail: "is not valid UTF-8"}
	}
	if !utf8.ValidString(c.Account) {
		return Identity{}, &HeaderError{Header: AccountHeader, Detail: "is not valid UTF-8"}
	}
	var id Identity
	switch {
	case c.Authorization != "" && a.cfg.TokensFile != "":
		token, ok := bearer(c.Authorization)
		if !ok {
			return Identity{}, fmt.Errorf("%w: the authorization header must be `Bearer <token>`", ErrBadCredentials)
		}
		if id, ok = a.tokens.Load().Lookup(token); !ok {
			return Identity{}, fmt.Errorf("%w: the bearer token is not known to this server", ErrBadCredentials)
		}
	case c.Certificate != nil:
		var err error
		if id, err = CertificateIdentity(c.Certificate); err != nil {
			return Identity{}, err
		}
	case c.Authorization != "" && !a.DevMode():
		return Identity{}, fmt.Errorf("%w: this server accepts client certificates, not bearer tokens", ErrBadCredentials)
	case a.DevMode():
		id = Identity{Account: DefaultAccount, Role: RoleAdmin, All: true, Subject: "development mode"}
	default:
		return Identity{}, fmt.Errorf("%w: %s", ErrNoCredentials, a.howTo())
	}
	if id.IsAdmin() && c.Account != "" {
		if !ValidAccount(c.Account) {
			return Identity{}, &HeaderError{Header: AccountHeader, Detail: "must be a DNS label (lower-case letters, digits, '-'; at most 63)"}
		}
		id.Account, id.All = c.Account, false
	}
	return id, nil
}

// howTo tells a caller without credentials what this server accepts.
func (a *Authenticator) howTo() string {
	var ways []string
	if a.cfg.TokensFile != "" {
		ways = append(ways, "send `authorization: Bearer <token>`")
	}
	if a.cfg.ClientCertificates {
		ways = append(ways, "present a client certificate signed by the server's client CA")
	}
	return strings.Join(ways, " or ")
}

// bearer extracts the token of "Bearer <token>" (the scheme is
// case-insensitive, RFC 6750).
func bearer(header string) (string, bool) {
	scheme, token, ok := strings.Cut(strings.TrimSpace(header), " ")
	if !ok || !strings.EqualFold(scheme, "bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

// CertificateIdentity maps a verified client certificate to an identity: its
// subject's CommonName is the account (a DNS label), and an
// OrganizationalUnit of AdminOU makes it an admin; otherwise it is a user.
func CertificateIdentity(cert *x509.Certificate) (Identity, error) {
	cn := cert.Subject.CommonName
	if !ValidAccount(cn) {
		return Identity{}, fmt.Errorf("%w: the client certificate's CommonName %.70q is not an account (a DNS label)", ErrBadCredentials, cn)
	}
	id := Identity{Account: cn, Role: RoleUser, Subject: "certificate CN=" + cn}
	if slices.Contains(cert.Subject.OrganizationalUnit, AdminOU) {
		id.Role, id.All = RoleAdmin, true
	}
	return id, nil
}
