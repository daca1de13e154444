package service

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"unicode/utf8"

	"github.com/google/uuid"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/clusterd/clusterd/auth"
)

// caller is the identity the server's interceptor authenticated. A request
// without one never reaches a handler through the server; refusing it here
// keeps a wiring mistake from serving every account.
func caller(ctx context.Context) (auth.Identity, error) {
	id, ok := auth.FromContext(ctx)
	if !ok {
		return auth.Identity{}, fmt.Errorf("%w: the request was not authenticated", auth.ErrNoCredentials)
	}
	return id, nil
}

// visible answers with a NotFoundError for a resource of an account the
// caller may not see, exactly as if it did not exist, so nobody learns what
// other accounts have.
func visible(id auth.Identity, account, name string) error {
	if !id.Sees(account) {
		return &NotFoundError{Name: name}
	}
	return nil
}

// Bounds of free-form inputs; longer values are refused before any work.
const (
	maxFilterLen    = 1024
	maxPageTokenLen = 512
	// maxQuoted is how much of an invalid value an error message repeats.
	maxQuoted = 40
)

// Clip is s cut to a prefix fit for an error message or a log line (at a
// rune boundary), saying how long the whole was, so a megabyte of garbage
// is never echoed back. Every message that quotes a client's value quotes
// Clip of it.
func Clip(s string) string {
	if len(s) <= maxQuoted {
		return s
	}
	cut := maxQuoted
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s…(%d bytes)", s[:cut], len(s))
}

// sum adds node counts without int32 overflow.
func sum(counts ...int32) int64 {
	var n int64
	for _, c := range counts {
		n += int64(c)
	}
	return n
}

// canonicalRequestID checks an AIP-155 request id (empty, or a UUID in any
// case) and returns it in canonical (lower-case) form, so that a retry that
// spells the same UUID differently is the same request.
func canonicalRequestID(id string) (string, error) {
	if id == "" {
		return "", nil
	}
	u, err := uuid.Parse(id)
	if err != nil || len(id) != 36 {
		return "", invalid("request_id", "must be a UUID, got %q", Clip(id))
	}
	return u.String(), nil
}

// requestHash fingerprints a request without its request_id: the same
// request id sent with other parameters (or to another method) is a
// different request, refused rather than answered with the first one's
// operation.
func requestHash(req proto.Message) string {
	m := proto.Clone(req)
	if f := m.ProtoReflect().Descriptor().Fields().ByName(requestIDField); f != nil {
		m.ProtoReflect().Clear(f)
	}
	raw, _ := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	h := sha256.New()
	h.Write([]byte(m.ProtoReflect().Descriptor().FullName()))
	h.Write([]byte{0})
	h.Write(raw)
	return hex.EncodeToString(h.Sum(nil))
}

// checkListSize refuses a repeated field with more entries than a cluster
// can have nodes, before any entry is looked at.
func checkListSize(v *violations, field string, n int, max int32) bool {
	if int64(n) > int64(max) {
		v.add(field, "names %d entries; at most %d (the maximum cluster size)", n, max)
		return false
	}
	return true
}

// requestIDField is the descriptor name every mutating request uses.
const requestIDField protoreflect.Name = "request_id"
