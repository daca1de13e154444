package service

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/uuid"
	"google.golang.org/grpc/codes"
)

// refusedCleanly fails the test unless err is nil or an INVALID_ARGUMENT
// whose message quotes the input by a short prefix at most.
func refusedCleanly(t *testing.T, what, input string, err error) {
	t.Helper()
	if err == nil {
		return
	}
	var inval *InvalidArgumentError
	if !errors.As(err, &inval) {
		t.Fatalf("%s(%q): %v is not an InvalidArgumentError", what, input, err)
	}
	st := Status(err)
	if st.Code() != codes.InvalidArgument {
		t.Fatalf("%s(%q): status %v; want INVALID_ARGUMENT", what, input, st.Code())
	}
	if len(input) > 2*maxQuoted && strings.Contains(st.Message(), input) {
		t.Fatalf("%s: the message repeats the whole %d-byte input", what, len(input))
	}
	if len(st.Message()) > 600 {
		t.Fatalf("%s(%q): a message of %d bytes", what, input, len(st.Message()))
	}
}

func FuzzParseFilter(f *testing.F) {
	for _, s := range []string{"", "state = RUNNING", `display_name = "a b" AND account = team-a`, "state=", "= x",
		`a = "unterminated`, "state = RUNNING AND", " AND ", "state != RUNNING", "done = true", "x\xff = 1",
		"(state = RUNNING OR state = STOPPED) AND NOT display_name = web", `create_time > "2026-01-02T15:04:05Z"`,
		`cluster = "clusters/0192f0c1-7a3e-7000-8000-000000000000" AND done = false`, "-done = true",
		strings.Repeat("state = RUNNING AND ", 60)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, filter string) {
		for _, schema := range []filterSchema{clusterFilter, operationFilter} {
			parsed, err := parseFilter("filter", filter, schema)
			refusedCleanly(t, "parseFilter", filter, err)
			// What the service accepts, the repository can write as SQL.
			if err == nil && strings.HasPrefix(parsed.Where.String(), "invalid filter") {
				t.Fatalf("parseFilter(%q) accepted a filter the repository refuses: %s", filter, parsed.Where)
			}
		}
	})
}

func FuzzPageToken(f *testing.F) {
	good := encodePageToken("0192f0c1-7a3e-7000-8000-000000000000", "clusters?state = RUNNING", true)
	for _, s := range []string{"", good, good + "x", "not-base64!", "e30", strings.Repeat("A", 600)} {
		f.Add(s, "clusters?state = RUNNING")
	}
	f.Fuzz(func(t *testing.T, token, query string) {
		after, err := decodePageToken("page_token", token, query)
		refusedCleanly(t, "decodePageToken", token, err)
		if err == nil && token != "" && after == "" {
			t.Fatalf("decodePageToken(%q) accepted a token that names no position", token)
		}
		// Whatever the service issues (positions are ids: UTF-8), it takes
		// back for the same query only.
		if tok := encodePageToken(token+"k", query, true); utf8.ValidString(token) && len(tok) <= maxPageTokenLen {
			if got, err := decodePageToken("page_token", tok, query); err != nil || got != token+"k" {
				t.Fatalf("round trip of %q: %q, %v", token+"k", got, err)
			}
			if _, err := decodePageToken("page_token", tok, query+"x"); err == nil {
				t.Fatalf("a token of query %q was accepted for %q", query, query+"x")
			}
		}
	})
}

func FuzzParseName(f *testing.F) {
	for _, s := range []string{"", "clusters/0192f0c1-7a3e-7000-8000-000000000000", "clusters/0192F0C1-7A3E-7000-8000-000000000000",
		"clusters/abc", "operations/0192f0c1-7a3e-7000-8000-000000000000", "clusters/{0192f0c1-7a3e-7000-8000-000000000000}", "clusters/\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		id, err := parseName("name", name, clusterPrefix)
		refusedCleanly(t, "parseName", name, err)
		if err != nil {
			return
		}
		if u, perr := uuid.Parse(id); perr != nil || u.String() != id {
			t.Fatalf("parseName(%q) = %q, not a canonical UUID", name, id)
		}
		if !strings.EqualFold(clusterPrefix+id, name) {
			t.Fatalf("parseName(%q) = %q, not the name's own UUID", name, id)
		}
	})
}

func FuzzRequestID(f *testing.F) {
	for _, s := range []string{"", "0192f0c1-7a3e-7000-8000-000000000000", "0192F0C1-7A3E-7000-8000-000000000000", "retry-1",
		"urn:uuid:0192f0c1-7a3e-7000-8000-000000000000", "{0192f0c1-7a3e-7000-8000-000000000000}"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		got, err := canonicalRequestID(id)
		refusedCleanly(t, "canonicalRequestID", id, err)
		if err == nil && id != "" && (got != strings.ToLower(id) || len(got) != 36) {
			t.Fatalf("canonicalRequestID(%q) = %q; want the lower-case UUID", id, got)
		}
	})
}
