package service

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
)

// Page sizes (AIP-158): 0 means the default, larger values are coerced down
// to the maximum, negative values are refused.
const (
	defaultPageSize = 50
	maxPageSize     = 1000
)

// pageToken is what an opaque next_page_token carries: where the previous
// page ended, and a digest of the request it belongs to, so a token cannot be
// replayed against a different filter or collection.
type pageToken struct {
	After string `json:"a"`
	Query string `json:"q"`
}

// pageSize validates and defaults a request's page_size.
func pageSize(field string, n int32) (int, error) {
	switch {
	case n < 0:
		return 0, invalid(field, "must not be negative, got %d", n)
	case n == 0:
		return defaultPageSize, nil
	case n > maxPageSize:
		return maxPageSize, nil
	}
	return int(n), nil
}

// decodePageToken returns where the page starts; query identifies the
// request (its collection and filter) the token must have come from.
func decodePageToken(field, token, query string) (string, error) {
	if token == "" {
		return "", nil
	}
	if len(token) > maxPageTokenLen {
		return "", invalid(field, "is not a token this service issued")
	}
	raw, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil {
		return "", invalid(field, "is not a token this service issued")
	}
	var pt pageToken
	if err := json.Unmarshal(raw, &pt); err != nil || pt.After == "" {
		return "", invalid(field, "is not a token this service issued")
	}
	if pt.Query != digest(query) {
		return "", invalid(field, "was issued for a different request (filter or parent changed)")
	}
	return pt.After, nil
}

// encodePageToken returns the next_page_token after a page whose last key is
// after, or "" when there is no next page.
func encodePageToken(after, query string, more bool) string {
	if !more {
		return ""
	}
	raw, _ := json.Marshal(pageToken{After: after, Query: digest(query)})
	return base64.RawURLEncoding.EncodeToString(raw)
}

func digest(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:8])
}
