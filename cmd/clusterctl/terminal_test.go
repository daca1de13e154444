package main

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/clusterd/clusterd/internal/syncbuf"
)

// terminal is what a pseudo-terminal has shown so far.
type terminal struct{ syncbuf.Buffer }

// waitFor polls (bounded) until the screen matches.
func (s *terminal) waitFor(t *testing.T, re *regexp.Regexp) string {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if out := s.String(); re.MatchString(out) {
			return out
		}
		time.Sleep(10 * time.Millisecond) // sampling the screen, not synchronising
	}
	t.Fatalf("the terminal never showed %v; it shows %q", re, s.String())
	return ""
}

// TestProgressBarInATerminal runs clusterctl (this test binary as its main)
// in a pseudo-terminal: create --wait draws one line redrawn in place, a
// bar of steps done out of the total with the step it is at, and ends with
// the cluster.
func TestProgressBarInATerminal(t *testing.T) {
	addr := serve(t)
	s := sim(t, addr)
	hold(t, s)

	cmd := exec.Command(os.Args[0], "create", "web", "--kubernetes-version", "1.30.2", "--offering", "medium", "--workers", "2", "--wait")
	cmd.Env = append(os.Environ(), runMainEnv+"=1", "CLUSTERCTL_SERVER="+addr, "CLUSTERCTL_CONFIG="+t.TempDir()+"/none")
	tty, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 30, Cols: 110})
	if err != nil {
		t.Fatalf("start clusterctl in a pseudo-terminal: %v", err)
	}
	defer tty.Close()
	var screen terminal
	copied := make(chan error, 1)
	go func() {
		_, err := io.Copy(&screen, tty)
		copied <- err
	}()

	// Held at join_node: the bar shows the step and a partial count.
	bar := regexp.MustCompile(`(?s)^create operations/[0-9a-f-]{36}\r?\n.*\r\[(█*)(░*)\] +\d+s (\d+)/(\d+) join_node\x1b\[K`)
	out := screen.waitFor(t, bar)
	m := bar.FindStringSubmatch(out)
	if len(m[1]) == 0 || len(m[2]) == 0 || m[3] == m[4] {
		t.Errorf("held at join_node the bar is %q; want partly filled, %s of %s steps", m[0], m[3], m[4])
	}
	waitHeld(t, s)
	// Held, the line is still redrawn: the elapsed time moves.
	screen.waitFor(t, regexp.MustCompile(`\] +([1-9]\d*)s \d+/\d+ join_node\x1b\[K`))
	release(t, s)

	if err := cmd.Wait(); err != nil {
		t.Fatalf("clusterctl exited with %v; screen %q", err, screen.String())
	}
	out = screen.waitFor(t, regexp.MustCompile(`State:\s+RUNNING`))
	full := regexp.MustCompile(`\r\[█+\] +\d+s (\d+)/(\d+) \S+\x1b\[K  succeeded\r?\n`).FindStringSubmatch(out)
	if full == nil || full[1] != full[2] {
		t.Errorf("the last drawing is not a full bar followed by succeeded: %q", out)
	}
	if strings.Contains(out, "steps)") {
		t.Errorf("a terminal got the plain progress lines: %q", out)
	}
	_ = tty.Close()
	if err := <-copied; err != nil && !errors.Is(err, os.ErrClosed) && !strings.Contains(err.Error(), "input/output error") {
		t.Errorf("reading the terminal: %v", err)
	}
}

// TestDeleteAsksOnATerminal: delete on a terminal asks first; no keeps the
// cluster (exit 1), yes deletes it; --yes does not ask.
func TestDeleteAsksOnATerminal(t *testing.T) {
	addr := serve(t)
	env := map[string]string{"CLUSTERCTL_SERVER": addr}
	ok(t, env, "create", "gone", "--kubernetes-version", "1.30.2", "--offering", "medium", "--wait")
	ok(t, env, "create", "also", "--kubernetes-version", "1.30.2", "--offering", "medium", "--wait")

	for _, answer := range []string{"n", "y"} {
		cmd := exec.Command(os.Args[0], "delete", "gone", "--wait")
		cmd.Env = append(os.Environ(), runMainEnv+"=1", "CLUSTERCTL_SERVER="+addr, "CLUSTERCTL_CONFIG="+t.TempDir()+"/none")
		tty, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 30, Cols: 110})
		if err != nil {
			t.Fatalf("start clusterctl in a pseudo-terminal: %v", err)
		}
		var screen terminal
		copied := make(chan struct{})
		go func() {
			defer close(copied)
			_, _ = io.Copy(&screen, tty)
		}()
		screen.waitFor(t, regexp.MustCompile(`Delete cluster gone and all its machines\? This cannot be undone\. \[y/N\] $`))
		if _, err := tty.Write([]byte(answer + "\n")); err != nil {
			t.Fatal(err)
		}
		err = cmd.Wait()
		_ = tty.Close()
		<-copied
		if answer == "n" {
			if err == nil || !strings.Contains(screen.String(), "clusterctl: cluster gone not deleted: not confirmed") {
				t.Errorf("answered no: %v, screen %q; want exit 1, not deleted", err, screen.String())
			}
			ok(t, env, "get", "gone")
			continue
		}
		if err != nil || !strings.Contains(screen.String(), "succeeded") {
			t.Errorf("answered yes: %v, screen %q; want the delete followed to its end", err, screen.String())
		}
	}
	refused(t, env, 1, "(NOT_FOUND)", "get", "gone")
	// Not a terminal (a script): no question, as before; --yes never asks.
	ok(t, env, "delete", "also", "--yes", "--wait")
}
