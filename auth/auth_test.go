package auth

import (
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func line(token, account, role string) string {
	sum := sha256.Sum256([]byte(token))
	return "sha256:" + hex.EncodeToString(sum[:]) + " " + account + " " + role + "\n"
}

func TestParseTokensRefusesEveryMalformedLine(t *testing.T) {
	good := line("t1", "team-a", "user")
	for name, tc := range map[string]struct{ file, wantErr string }{
		"comments and blanks": {file: "# who\n\n  \n" + good + "# end\n"},
		"two fields":          {file: "sha256:00 team-a\n", wantErr: "line 1: want"},
		"no prefix":           {file: strings.TrimPrefix(good, "sha256:"), wantErr: "line 1: the token must be given as sha256:"},
		"short hex":           {file: "sha256:abcd team-a user\n", wantErr: "line 1: the token must be given"},
		"bad account":         {file: "# x\n" + strings.Replace(good, "team-a", "Team_A", 1), wantErr: "line 2: account"},
		"bad role":            {file: strings.Replace(good, "user", "root", 1), wantErr: "line 1: role"},
		"duplicate":           {file: good + line("t1", "team-b", "admin"), wantErr: "line 2: the same token as line 1"},
	} {
		t.Run(name, func(t *testing.T) {
			tok, err := ParseTokens(strings.NewReader(tc.file))
			if tc.wantErr == "" {
				if err != nil || tok.Len() != 1 {
					t.Fatalf("ParseTokens = %v, %v; want 1 identity", tok, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("ParseTokens error = %v; want it to contain %q", err, tc.wantErr)
			}
		})
	}
}

func TestParseTokensNeverEchoesAToken(t *testing.T) {
	// A file with a clear-text token by mistake: the error must not repeat it.
	_, err := ParseTokens(strings.NewReader("s3cr3t-token team-a user\n"))
	if err == nil || strings.Contains(err.Error(), "s3cr3t") {
		t.Fatalf("error %v; want a refusal that does not quote the token", err)
	}
}

func authenticator(t *testing.T, file string, certs bool) *Authenticator {
	t.Helper()
	var path string
	if file != "" {
		path = filepath.Join(t.TempDir(), "tokens")
		if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	a, err := New(Config{TokensFile: path, ClientCertificates: certs})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func cert(cn string, ous ...string) *x509.Certificate {
	return &x509.Certificate{Subject: pkix.Name{CommonName: cn, OrganizationalUnit: ous}}
}

func TestAuthenticate(t *testing.T) {
	tokens := line("user-token", "team-a", "user") + line("admin-token", "ops", "admin")
	withTokens := authenticator(t, tokens, false)
	withCerts := authenticator(t, "", true)
	dev := authenticator(t, "", false)
	type want struct {
		account string
		role    Role
		all     bool
		err     error
	}
	for _, tc := range []struct {
		name string
		a    *Authenticator
		c    Credentials
		want want
	}{
		{"user token", withTokens, Credentials{Authorization: "Bearer user-token"}, want{account: "team-a", role: RoleUser}},
		{"scheme is case-insensitive", withTokens, Credentials{Authorization: "bearer  user-token "}, want{account: "team-a", role: RoleUser}},
		{"user's account header is ignored", withTokens, Credentials{Authorization: "Bearer user-token", Account: "team-b"}, want{account: "team-a", role: RoleUser}},
		{"admin sees all", withTokens, Credentials{Authorization: "Bearer admin-token"}, want{account: "ops", role: RoleAdmin, all: true}},
		{"admin acts for an account", withTokens, Credentials{Authorization: "Bearer admin-token", Account: "team-b"}, want{account: "team-b", role: RoleAdmin}},
		{"admin names a bad account", withTokens, Credentials{Authorization: "Bearer admin-token", Account: "B!"}, want{err: &HeaderError{}}},
		{"wrong token", withTokens, Credentials{Authorization: "Bearer nope"}, want{err: ErrBadCredentials}},
		{"not bearer", withTokens, Credentials{Authorization: "Basic dXNlcjpwdw=="}, want{err: ErrBadCredentials}},
		{"empty bearer", withTokens, Credentials{Authorization: "Bearer "}, want{err: ErrBadCredentials}},
		{"huge token", withTokens, Credentials{Authorization: "Bearer " + strings.Repeat("x", maxTokenLen+1)}, want{err: ErrBadCredentials}},
		{"non-UTF-8 token", withTokens, Credentials{Authorization: "Bearer \xff"}, want{err: &HeaderError{}}},
		{"nothing", withTokens, Credentials{}, want{err: ErrNoCredentials}},
		{"header alone is no identity", withTokens, Credentials{Account: "team-a"}, want{err: ErrNoCredentials}},
		{"user certificate", withCerts, Credentials{Certificate: cert("team-a", "eng")}, want{account: "team-a", role: RoleUser}},
		{"admin certificate", withCerts, Credentials{Certificate: cert("ops", AdminOU)}, want{account: "ops", role: RoleAdmin, all: true}},
		{"certificate without an account", withCerts, Credentials{Certificate: cert("Team A")}, want{err: ErrBadCredentials}},
		{"token sent to a certificate-only server", withCerts, Credentials{Authorization: "Bearer user-token"}, want{err: ErrBadCredentials}},
		{"certificate server, nothing", withCerts, Credentials{}, want{err: ErrNoCredentials}},
		{"development mode", dev, Credentials{}, want{account: DefaultAccount, role: RoleAdmin, all: true}},
		{"development mode with an account", dev, Credentials{Account: "team-a"}, want{account: "team-a", role: RoleAdmin}},
		{"development mode, bad account", dev, Credentials{Account: "\xff"}, want{err: &HeaderError{}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, err := tc.a.Authenticate(tc.c)
			if tc.want.err != nil {
				var he *HeaderError
				if _, isHeader := tc.want.err.(*HeaderError); isHeader && !errors.As(err, &he) {
					t.Fatalf("err = %v; want a *HeaderError", err)
				} else if !isHeader && !errors.Is(err, tc.want.err) {
					t.Fatalf("err = %v; want %v", err, tc.want.err)
				}
				if strings.Contains(err.Error(), "token\xff") || strings.Contains(err.Error(), "user-token") {
					t.Errorf("error %q quotes a credential", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Authenticate: %v", err)
			}
			if id.Account != tc.want.account || id.Role != tc.want.role || id.All != tc.want.all {
				t.Errorf("identity = %+v; want %+v", id, tc.want)
			}
		})
	}
}

func TestReloadKeepsTheOldTableOnError(t *testing.T) {
	a := authenticator(t, line("old", "team-a", "user"), false)
	path := a.cfg.TokensFile
	if err := os.WriteFile(path, []byte(line("new", "team-b", "user")), 0o600); err != nil {
		t.Fatal(err)
	}
	if n, err := a.Reload(); err != nil || n != 1 {
		t.Fatalf("Reload = %d, %v", n, err)
	}
	if _, err := a.Authenticate(Credentials{Authorization: "Bearer old"}); !errors.Is(err, ErrBadCredentials) {
		t.Errorf("old token after reload: %v; want refused", err)
	}
	if id, err := a.Authenticate(Credentials{Authorization: "Bearer new"}); err != nil || id.Account != "team-b" {
		t.Errorf("new token after reload: %+v, %v", id, err)
	}
	for name, file := range map[string]string{
		"malformed": "garbage\n",
		// Loaded, either would lock every caller out.
		"empty":               "",
		"comments and blanks": "# every token revoked\n\n",
	} {
		if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
			t.Fatal(err)
		}
		if n, err := a.Reload(); err == nil {
			t.Fatalf("Reload of the %s file succeeded with %d identities", name, n)
		} else if name != "malformed" && !errors.Is(err, ErrNoIdentities) {
			t.Errorf("Reload of the %s file: %v; want ErrNoIdentities", name, err)
		}
		if id, err := a.Authenticate(Credentials{Authorization: "Bearer new"}); err != nil || id.Account != "team-b" {
			t.Errorf("after a failed reload of the %s file the previous table must stay: %+v, %v", name, id, err)
		}
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Reload(); err == nil {
		t.Fatal("Reload of a missing file succeeded")
	}
}

func TestNewRefusesATokenFileWithoutIdentities(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(path, []byte("# nobody yet\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{TokensFile: path}); !errors.Is(err, ErrNoIdentities) {
		t.Fatalf("New with a file of comments only: %v; want ErrNoIdentities", err)
	}
}

func TestScope(t *testing.T) {
	admin := Identity{Account: "ops", Role: RoleAdmin, All: true}
	user := Identity{Account: "team-a", Role: RoleUser}
	if admin.Scope() != "" || !admin.Sees("team-b") {
		t.Errorf("admin scope %q, sees team-b %v; want every account", admin.Scope(), admin.Sees("team-b"))
	}
	if user.Scope() != "team-a" || user.Sees("team-b") || !user.Sees("team-a") {
		t.Errorf("user scope %q; want only team-a", user.Scope())
	}
}
