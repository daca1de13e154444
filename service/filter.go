package service

import (
	"strconv"
	"strings"
)

// term is one `field = value` condition of an AIP-160 filter.
type term struct {
	Field string
	Value string
}

// parseFilter reads the subset of AIP-160 clusterd supports: conditions
// `field = value` (value bare or double-quoted) joined by AND. allowed lists
// the fields the collection can be filtered on; anything else is an
// INVALID_ARGUMENT naming the filter field, so a client never gets a silently
// unfiltered list.
func parseFilter(field, filter string, allowed ...string) ([]term, error) {
	if len(filter) > maxFilterLen {
		return nil, invalid(field, "must be at most %d bytes, got %d", maxFilterLen, len(filter))
	}
	filter = strings.TrimSpace(filter)
	if filter == "" {
		return nil, nil
	}
	var terms []term
	for _, part := range splitAnd(filter) {
		name, value, ok := strings.Cut(part, "=")
		if !ok || strings.ContainsAny(name, "!<>:") {
			return nil, invalid(field, "unsupported condition %q: use `field = value` joined by AND", Clip(part))
		}
		name, value = strings.TrimSpace(name), strings.TrimSpace(value)
		if strings.HasPrefix(value, `"`) {
			unq, err := strconv.Unquote(value)
			if err != nil {
				return nil, invalid(field, "bad quoted value in %q", Clip(part))
			}
			value = unq
		} else if value == "" || strings.ContainsAny(value, " \t\"=") {
			return nil, invalid(field, "bad value in %q", Clip(part))
		}
		known := false
		for _, a := range allowed {
			known = known || a == name
		}
		if !known {
			return nil, invalid(field, "unknown field %q (supported: %s)", Clip(name), strings.Join(allowed, ", "))
		}
		terms = append(terms, term{Field: name, Value: value})
	}
	return terms, nil
}

// splitAnd splits on the AND keyword outside double quotes.
func splitAnd(s string) []string {
	var parts []string
	inQuote, start := false, 0
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '"' && (i == 0 || s[i-1] != '\\'):
			inQuote = !inQuote
		case !inQuote && strings.HasPrefix(s[i:], " AND "):
			parts = append(parts, strings.TrimSpace(s[start:i]))
			start = i + len(" AND ")
			i += len(" AND ") - 1
		}
	}
	return append(parts, strings.TrimSpace(s[start:]))
}
