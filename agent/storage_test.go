package agent_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/clusterd/clusterd/agent"
)

// newDisk returns a zeroed 16 MiB "volume".
func newDisk(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "disk.raw")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, 16<<20); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestDiskStoreKeepsTheLastSave(t *testing.T) {
	path := newDisk(t)
	d := &agent.DiskStore{Path: path}
	if got, err := d.Load(); err != nil || got != nil {
		t.Fatalf("new disk: got %q, %v; want nothing", got, err)
	}
	for _, s := range []string{`{"a":1}`, `{"a":2}`, `{"a":3}`} {
		if err := d.Save([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	// Another process (the agent after a reboot) reads it back.
	if got, err := (&agent.DiskStore{Path: path}).Load(); err != nil || string(got) != `{"a":3}` {
		t.Fatalf("got %q, %v; want {\"a\":3}", got, err)
	}
}

// A save torn by a power cut leaves the save before it.
func TestDiskStoreSurvivesATornSave(t *testing.T) {
	path := newDisk(t)
	d := &agent.DiskStore{Path: path}
	for _, s := range []string{`{"a":1}`, `{"a":2}`} {
		if err := d.Save([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	// The second save went to slot 1 (offset 1 MiB): tear its data.
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("X"), 1<<20+32+3); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if got, err := (&agent.DiskStore{Path: path}).Load(); err != nil || string(got) != `{"a":1}` {
		t.Fatalf("got %q, %v; want the save before the torn one", got, err)
	}
	// The next save goes over the torn slot, not over the good one.
	d2 := &agent.DiskStore{Path: path}
	if err := d2.Save([]byte(`{"a":4}`)); err != nil {
		t.Fatal(err)
	}
	if got, err := (&agent.DiskStore{Path: path}).Load(); err != nil || string(got) != `{"a":4}` {
		t.Fatalf("got %q, %v; want {\"a\":4}", got, err)
	}
}

func TestBuildISOIsReadBack(t *testing.T) {
	path := filepath.Join(t.TempDir(), "v.iso")
	for _, v := range []string{"1.31.2", "v1.32.0-rc.1"} {
		if err := agent.BuildISO(path, v); err != nil {
			t.Fatal(err)
		}
		if got, err := (agent.ISOFile{Path: path}).Version(); err != nil || got != v {
			t.Fatalf("got %q, %v; want %q", got, err, v)
		}
	}
	if err := agent.BuildISO(path, "1.31 2"); err == nil {
		t.Fatal("built an ISO for a version with a space")
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm()&0o004 == 0 {
		t.Fatalf("ISO mode %v: qemu running as another user cannot read it", fi.Mode())
	}
}

func TestISOFileWithoutAnImage(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, make([]byte, 64<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{filepath.Join(dir, "missing"), empty} {
		if _, err := (agent.ISOFile{Path: path}).Version(); !errors.Is(err, agent.ErrNoVersion) {
			t.Errorf("%s: got %v, want ErrNoVersion", path, err)
		}
	}
}

// xorriso (the usual ISO tool) reads the image BuildISO writes, and
// ReadISOVersion reads xorriso's, Rock Ridge and Joliet included.
func TestISOAgainstXorriso(t *testing.T) {
	if _, err := exec.LookPath("xorriso"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("xorriso is missing (apt-get install xorriso)")
		}
		t.Skip("xorriso is missing")
	}
	dir := t.TempDir()
	ours := filepath.Join(dir, "ours.iso")
	if err := agent.BuildISO(ours, "1.31.2"); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "VERSION.out")
	if b, err := exec.Command("xorriso", "-indev", ours, "-osirrox", "on", "-extract", "/VERSION", out).CombinedOutput(); err != nil {
		t.Fatalf("xorriso cannot read BuildISO's image: %v\n%s", err, b)
	}
	if got, err := os.ReadFile(out); err != nil || string(got) != "1.31.2\n" {
		t.Fatalf("xorriso read VERSION %q, %v; want \"1.31.2\\n\"", got, err)
	}

	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(filepath.Join(src, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string]string{"AAA": "x", "VERSION": "1.32.0\n", "bin/kubelet": "ELF", "zzz-long-name.txt": "y"} {
		if err := os.WriteFile(filepath.Join(src, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	theirs := filepath.Join(dir, "theirs.iso")
	if b, err := exec.Command("xorriso", "-as", "mkisofs", "-quiet", "-r", "-J", "-o", theirs, src).CombinedOutput(); err != nil {
		t.Fatalf("xorriso: %v\n%s", err, b)
	}
	if got, err := (agent.ISOFile{Path: theirs}).Version(); err != nil || got != "1.32.0" {
		t.Fatalf("got %q, %v from xorriso's image; want 1.32.0", got, err)
	}
}
