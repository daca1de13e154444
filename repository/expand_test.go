package repository

import (
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// contractPatterns are changes a server of the previous release cannot run
// beside: it reads or writes what they remove or rename, or its inserts
// break on what they require.
var contractPatterns = []struct {
	re   *regexp.Regexp
	what string
}{
	{regexp.MustCompile(`\bdrop\s+(table|column)\b`), "drops what the previous release reads"},
	{regexp.MustCompile(`\bdrop\s+(?:if\s+exists\s+)?\w+\s*(,|$)`), "drops a column (MySQL's short form)"},
	{regexp.MustCompile(`\brename\b`), "renames what the previous release names"},
	{regexp.MustCompile(`\b(change|modify)\s+(column\s+)?\w+\s+\w+`), "redefines a column the previous release writes"},
	{regexp.MustCompile(`\badd\s+(constraint|unique|foreign\s+key|primary\s+key|check)\b`), "adds a constraint the previous release's writes may break"},
}

var (
	addNotNull  = regexp.MustCompile(`\badd\s+(column\s+)?(if\s+not\s+exists\s+)?\w+\s+.*\bnot\s+null\b`)
	hasDefault  = regexp.MustCompile(`\bdefault\b`)
	uniqueIndex = regexp.MustCompile(`\bcreate\s+unique\s+index\b.*\bon\s+(\w+)`)
	createTable = regexp.MustCompile(`\bcreate\s+table\s+(if\s+not\s+exists\s+)?(\w+)`)
)

// contractChanges lists the statements of a goose migration's Up section
// that are not expand-only (see contractPatterns; also a NOT NULL column
// without a default, and a unique index on a table the file did not
// create), except those whose comment says "contract:", which an author
// writes for a change the previous release no longer depends on.
func contractChanges(migration string) []string {
	up, _, _ := strings.Cut(migration, "-- +goose Down")
	created := map[string]bool{}
	var found []string
	for _, stmt := range strings.Split(up, ";") {
		var code []string
		allowed := false
		for _, line := range strings.Split(stmt, "\n") {
			if c := strings.TrimSpace(line); strings.HasPrefix(c, "--") {
				allowed = allowed || strings.Contains(c, "contract:")
				continue
			}
			code = append(code, line)
		}
		s := strings.ToLower(strings.Join(strings.Fields(strings.ReplaceAll(strings.Join(code, " "), "`", "")), " "))
		if s == "" {
			continue
		}
		if m := createTable.FindStringSubmatch(s); m != nil {
			created[m[2]] = true
			continue
		}
		var why []string
		if strings.HasPrefix(s, "alter ") || strings.HasPrefix(s, "drop ") || strings.HasPrefix(s, "rename ") {
			for _, p := range contractPatterns {
				if p.re.MatchString(s) {
					why = append(why, p.what)
				}
			}
		}
		for _, clause := range topLevelClauses(s) {
			if addNotNull.MatchString(clause) && !hasDefault.MatchString(clause) {
				why = append(why, "adds a NOT NULL column without a default (the previous release's inserts fail)")
			}
		}
		if m := uniqueIndex.FindStringSubmatch(s); m != nil && !created[m[1]] {
			why = append(why, "adds a unique index to a table the previous release writes")
		}
		if len(why) > 0 && !allowed {
			found = append(found, s+": "+strings.Join(why, "; "))
		}
	}
	return found
}

// topLevelClauses splits a statement at the commas outside parentheses
// (an ALTER TABLE's clauses; not DECIMAL(10,2)'s comma).
func topLevelClauses(s string) []string {
	var out []string
	depth, start := 0, 0
	for i, r := range s {
		switch r {
		case '(':
			depth++
		case ')':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, s[start:i])
				start = i + 1
			}
		}
	}
	return append(out, s[start:])
}

// TestContractChanges: the classifier tells expand-only statements from
// contract ones.
func TestContractChanges(t *testing.T) {
	for _, tc := range []struct {
		sql      string
		contract bool
	}{
		{"ALTER TABLE clusters ADD COLUMN IF NOT EXISTS note VARCHAR(10) NOT NULL DEFAULT '';", false},
		{"ALTER TABLE clusters ADD COLUMN note DATETIME NULL;", false},
		{"CREATE TABLE IF NOT EXISTS t (id INT NOT NULL PRIMARY KEY, n INT NOT NULL);", false},
		{"CREATE TABLE t (id INT NOT NULL);\nCREATE UNIQUE INDEX t_id ON t (id);", false},
		{"CREATE INDEX idx ON clusters (state);", false},
		{"-- +goose Up\nSELECT 1;\n-- +goose Down\nALTER TABLE clusters DROP COLUMN note;", false},
		{"ALTER TABLE clusters ADD COLUMN note VARCHAR(10) NOT NULL;", true},
		{"ALTER TABLE clusters\n ADD COLUMN a INT NULL,\n ADD COLUMN b INT NOT NULL;", true},
		{"ALTER TABLE clusters DROP COLUMN note;", true},
		{"ALTER TABLE clusters DROP note;", true},
		{"DROP TABLE jobs;", true},
		{"ALTER TABLE clusters RENAME COLUMN a TO b;", true},
		{"ALTER TABLE clusters CHANGE a b INT;", true},
		{"ALTER TABLE clusters MODIFY COLUMN a BIGINT NOT NULL;", true},
		{"ALTER TABLE clusters ADD UNIQUE (name);", true},
		{"CREATE UNIQUE INDEX c_name ON clusters (name);", true},
		{"-- contract: v0.3.0 no longer reads note\nALTER TABLE clusters DROP COLUMN note;", false},
		{"ALTER TABLE clusters ADD COLUMN price DECIMAL(10,2) NOT NULL;", true},
		{"ALTER TABLE clusters ADD COLUMN price DECIMAL(10,2) NOT NULL DEFAULT 0, ADD COLUMN x INT NULL;", false},
		{"ALTER TABLE `clusters` DROP `note`;", true},
		{"CREATE UNIQUE INDEX `c_name` ON `clusters` (name);", true},
	} {
		if got := contractChanges(tc.sql); (len(got) > 0) != tc.contract {
			t.Errorf("contractChanges(%q) = %q; want contract=%v", tc.sql, got, tc.contract)
		}
	}
}

// TestMigrationsExpandOnly: a migration the previous release does not have
// (scripts/release.sh previous) only adds, so that the previous release's
// servers run on the schema while a rolling upgrade replaces them; a
// contract step says so in a "-- contract:" comment, and goes in a release
// after the one that stopped depending on what it removes.
func TestMigrationsExpandOnly(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("bash", filepath.Join(root, "scripts", "release.sh"), "previous").CombinedOutput()
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("no previous release: %v: %s", err, out)
		}
		t.Skipf("no previous release: %v: %s", err, out)
	}
	previous := strings.TrimSpace(string(out))
	listed, err := exec.Command("git", "-C", root, "ls-tree", "-r", "--name-only", previous, "repository/migrations").Output()
	if err != nil {
		t.Fatalf("git ls-tree %s: %v", previous, err)
	}
	released := map[string]bool{}
	for _, p := range strings.Fields(string(listed)) {
		released[strings.TrimPrefix(p, "repository/")] = true
	}
	if len(released) == 0 {
		t.Fatalf("the previous release %s has no migrations", previous)
	}
	checked := 0
	err = fs.WalkDir(migrations, "migrations", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || path.Ext(p) != ".sql" {
			return err
		}
		data, err := fs.ReadFile(migrations, p)
		if err != nil {
			return err
		}
		if released[p] {
			// A released migration has run on databases as it was: a change
			// to it would never run there.
			was, err := exec.Command("git", "-C", root, "show", previous+":repository/"+p).Output()
			if err != nil {
				return fmt.Errorf("git show %s:repository/%s: %w", previous, p, err)
			}
			if string(was) != string(data) {
				t.Errorf("%s changed since the previous release; a released migration is never edited (add a new one)", p)
			}
			return nil
		}
		checked++
		for _, c := range contractChanges(string(data)) {
			t.Errorf("%s is not expand-only: %s", p, c)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d migrations since the previous release (%s), %d in it", checked, previous[:12], len(released))
}
