package version

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// TestReleaseScript checks scripts/release.sh against this repository:
// every release CHANGELOG.md names is a commit of its history, `version`
// prints a git-describe version of the newest one HEAD contains, and
// `previous` a release commit HEAD contains.
func TestReleaseScript(t *testing.T) {
	if out, err := exec.Command("git", "-C", "..", "rev-parse", "--is-shallow-repository").Output(); err != nil || strings.TrimSpace(string(out)) != "false" {
		if os.Getenv("CI") != "" {
			t.Fatalf("not a full git clone (%v, %q)", err, out)
		}
		t.Skipf("not a full git clone (%v, %q)", err, out)
	}
	changelog, err := os.ReadFile("../CHANGELOG.md")
	if err != nil {
		t.Fatal(err)
	}
	releases := regexp.MustCompile(`(?m)^## (v\d+\.\d+\.\d+) \(\d{4}-\d{2}-\d{2}, commit ([0-9a-f]{40})\)$`).FindAllStringSubmatch(string(changelog), -1)
	headings := regexp.MustCompile(`(?m)^## v`).FindAllString(string(changelog), -1)
	if len(releases) == 0 || len(releases) != len(headings) {
		t.Fatalf("CHANGELOG.md: %d release headings, %d of the form '## vX.Y.Z (YYYY-MM-DD, commit <40 hex>)'", len(headings), len(releases))
	}
	for _, r := range releases {
		if err := exec.Command("git", "-C", "..", "cat-file", "-e", r[2]+"^{commit}").Run(); err != nil {
			t.Errorf("CHANGELOG.md: release %s names commit %s, which is not in this repository", r[1], r[2])
		}
	}
	run := func(arg string) string {
		out, err := exec.Command("bash", "../scripts/release.sh", arg).Output()
		if err != nil {
			t.Fatalf("release.sh %s: %v", arg, err)
		}
		return strings.TrimSpace(string(out))
	}
	if v := run("version"); !regexp.MustCompile(`^v\d+\.\d+\.\d+(-\d+-g[0-9a-f]{7,})?(-dirty)?$`).MatchString(v) {
		t.Errorf("release.sh version = %q; want vX.Y.Z[-N-gHASH][-dirty]", v)
	}
	prev := run("previous")
	found := false
	for _, r := range releases {
		found = found || r[2] == prev
	}
	if !found {
		t.Errorf("release.sh previous = %q; want one of CHANGELOG.md's release commits", prev)
	}
	if err := exec.Command("git", "-C", "..", "merge-base", "--is-ancestor", prev, "HEAD").Run(); err != nil {
		t.Errorf("the previous release %s is not in HEAD's history: %v", prev, err)
	}
}
