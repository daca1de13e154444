package service

import (
	"errors"
	"slices"
	"testing"
)

func TestParseFilter(t *testing.T) {
	allowed := []string{"state", "display_name"}
	good := []struct {
		in   string
		want []term
	}{
		{"", nil},
		{"state = RUNNING", []term{{"state", "RUNNING"}}},
		{"state=RUNNING", []term{{"state", "RUNNING"}}},
		{`display_name = "a AND b" AND state = STOPPED`, []term{{"display_name", "a AND b"}, {"state", "STOPPED"}}},
	}
	for _, tt := range good {
		got, err := parseFilter("filter", tt.in, allowed...)
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("parseFilter(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
	for _, in := range []string{"colour = red", "state", "state != RUNNING", "state = ", `state = "unterminated`, "state = RUNNING OR state = STOPPED", "state = a b"} {
		_, err := parseFilter("filter", in, allowed...)
		var inv *InvalidArgumentError
		if !errors.As(err, &inv) || inv.Violations[0].Field != "filter" {
			t.Errorf("parseFilter(%q) = %v; want an INVALID_ARGUMENT on filter", in, err)
		}
	}
}

func TestPageTokens(t *testing.T) {
	tok := encodePageToken("id-7", "clusters?state = RUNNING", true)
	if after, err := decodePageToken("page_token", tok, "clusters?state = RUNNING"); err != nil || after != "id-7" {
		t.Errorf("round trip = %q, %v", after, err)
	}
	if _, err := decodePageToken("page_token", tok, "clusters?state = STOPPED"); err == nil {
		t.Error("a token was accepted for a different filter")
	}
	if _, err := decodePageToken("page_token", "garbage!", "q"); err == nil {
		t.Error("a malformed token was accepted")
	}
	if encodePageToken("id", "q", false) != "" {
		t.Error("last page has a next token")
	}
	for _, tt := range []struct {
		in   int32
		want int
		ok   bool
	}{{0, defaultPageSize, true}, {7, 7, true}, {5000, maxPageSize, true}, {-1, 0, false}} {
		got, err := pageSize("page_size", tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("pageSize(%d) = %d, %v", tt.in, got, err)
		}
	}
}
