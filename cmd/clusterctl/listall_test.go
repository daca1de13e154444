package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"
)

// listAll follows the page tokens to the last page, stops once it holds
// --limit items (trimming the last page), and passes a page's error on.
func TestListAll(t *testing.T) {
	a := &app{}
	a.timeout.d = time.Minute
	pages := map[string]struct {
		items []int
		next  string
	}{"": {[]int{1, 2}, "p2"}, "p2": {[]int{3, 4}, "p3"}, "p3": {[]int{5}, ""}}
	for _, tc := range []struct {
		limit int
		want  []int
		calls int
	}{{0, []int{1, 2, 3, 4, 5}, 3}, {3, []int{1, 2, 3}, 2}, {4, []int{1, 2, 3, 4}, 2}, {9, []int{1, 2, 3, 4, 5}, 3}} {
		calls := 0
		got, err := listAll(context.Background(), a, tc.limit, func(ctx context.Context, token string) ([]int, string, error) {
			calls++
			if _, ok := ctx.Deadline(); !ok {
				t.Error("a page was read without --timeout")
			}
			p := pages[token]
			return p.items, p.next, nil
		})
		if err != nil || !slices.Equal(got, tc.want) || calls != tc.calls {
			t.Errorf("limit %d: %v, %v after %d calls; want %v after %d", tc.limit, got, err, calls, tc.want, tc.calls)
		}
	}
	boom := errors.New("boom")
	_, err := listAll(context.Background(), a, 0, func(_ context.Context, token string) ([]int, string, error) {
		if token == "p2" {
			return nil, "", fmt.Errorf("page 2: %w", boom)
		}
		return []int{1}, "p2", nil
	})
	if !errors.Is(err, boom) {
		t.Errorf("a failing page: %v; want its error", err)
	}
}
