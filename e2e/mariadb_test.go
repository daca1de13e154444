package e2e

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// privateMariaDB is a mariadbd of the test's own, on its own port and data
// directory, that the test may stop, kill and start at will: the machine's
// MariaDB on 3306 is shared by every test (and every engineer), so it is
// never restarted. It runs without grant tables (any user, no password) and
// without durability it does not need (flush at commit to the OS only).
type privateMariaDB struct {
	t       *testing.T
	dir     string
	port    int
	cmd     *exec.Cmd
	exited  chan struct{}
	errLog  string
	runAsMy bool
}

const (
	mariadbd        = "/usr/sbin/mariadbd"
	mariadbInstall  = "mariadb-install-db"
	mariadbStartMax = 30 * time.Second
)

// startPrivateMariaDB installs a fresh data directory and starts mariadbd on
// a free port; it is stopped and removed when the test ends. The test is
// skipped (or fails under CI) when MariaDB's server binaries are missing.
func startPrivateMariaDB(t *testing.T) *privateMariaDB {
	t.Helper()
	if _, err := os.Stat(mariadbd); err != nil {
		skipOrFail(t, "no %s (%v): the test needs a MariaDB server of its own", mariadbd, err)
	}
	install, err := exec.LookPath(mariadbInstall)
	if err != nil {
		skipOrFail(t, "no %s on PATH: the test needs a MariaDB server of its own", mariadbInstall)
	}
	dir, err := os.MkdirTemp("", "clusterd-mariadb-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	m := &privateMariaDB{t: t, dir: dir, errLog: filepath.Join(dir, "error.log")}
	// A temporary directory of its own: the bootstrap's temporary tables in
	// the shared /tmp were once lost while other servers started beside it.
	if err := os.Mkdir(m.tmpDir(), 0o700); err != nil {
		t.Fatal(err)
	}
	args := []string{"--no-defaults", "--datadir=" + filepath.Join(dir, "data"), "--tmpdir=" + m.tmpDir(),
		"--auth-root-authentication-method=normal", "--skip-test-db"}
	if os.Geteuid() == 0 {
		// mariadbd refuses to run as root: run it as mysql, owning its files.
		my, err := user.Lookup("mysql")
		if err != nil {
			skipOrFail(t, "running as root and no mysql user to run mariadbd as: %v", err)
		}
		uid, _ := strconv.Atoi(my.Uid)
		gid, _ := strconv.Atoi(my.Gid)
		for _, d := range []string{dir, m.tmpDir()} {
			if err := os.Chown(d, uid, gid); err != nil {
				t.Fatal(err)
			}
		}
		m.runAsMy = true
		args = append(args, "--user=mysql")
	}
	out, err := exec.Command(install, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", mariadbInstall, err, out)
	}
	m.port = stablePort(t) // restarted on it
	m.start()
	t.Cleanup(func() {
		m.kill()
		if t.Failed() {
			if b, err := os.ReadFile(m.errLog); err == nil {
				t.Logf("private mariadbd error log (last 4k):\n%s", tail(string(b), 4096))
			}
		}
	})
	return m
}

func skipOrFail(t *testing.T, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

// start runs mariadbd and waits until it answers.
// tmpDir is the server's own directory for temporary files.
func (m *privateMariaDB) tmpDir() string { return filepath.Join(m.dir, "tmp") }

func (m *privateMariaDB) start() {
	t := m.t
	t.Helper()
	args := []string{
		"--no-defaults", "--datadir=" + filepath.Join(m.dir, "data"), "--tmpdir=" + m.tmpDir(), "--port=" + strconv.Itoa(m.port),
		"--bind-address=127.0.0.1", "--socket=" + filepath.Join(m.dir, "mysqld.sock"),
		"--pid-file=" + filepath.Join(m.dir, "mysqld.pid"), "--log-error=" + m.errLog,
		"--skip-grant-tables", "--skip-name-resolve", "--innodb-buffer-pool-size=64M",
		"--innodb-flush-log-at-trx-commit=2", "--max-connections=500",
	}
	if m.runAsMy {
		args = append(args, "--user=mysql")
	}
	m.cmd = exec.Command(mariadbd, args...)
	dieWithParent(m.cmd)
	if err := m.cmd.Start(); err != nil {
		t.Fatalf("start mariadbd: %v", err)
	}
	m.exited = make(chan struct{})
	go func(cmd *exec.Cmd, exited chan struct{}) {
		_ = cmd.Wait()
		close(exited)
	}(m.cmd, m.exited)
	deadline := time.Now().Add(mariadbStartMax)
	for {
		if err := m.ping(); err == nil {
			return
		}
		select {
		case <-m.exited:
			b, _ := os.ReadFile(m.errLog)
			t.Fatalf("mariadbd exited at start:\n%s", tail(string(b), 4096))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("mariadbd did not answer within %s", mariadbStartMax)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (m *privateMariaDB) ping() error {
	db, err := sql.Open("mysql", m.driverDSN(""))
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return db.PingContext(ctx)
}

// stop shuts mariadbd down as an operator would (SIGTERM) and waits.
func (m *privateMariaDB) stop() {
	m.t.Helper()
	if m.cmd == nil {
		return
	}
	_ = m.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-m.exited:
	case <-time.After(60 * time.Second):
		m.t.Errorf("mariadbd did not stop within 60s of SIGTERM; killing it")
		m.kill()
	}
	m.cmd = nil
}

// restart stops mariadbd and starts it again; it returns how long the
// database was down.
func (m *privateMariaDB) restart() time.Duration {
	m.t.Helper()
	began := time.Now()
	m.stop()
	m.start()
	return time.Since(began)
}

func (m *privateMariaDB) kill() {
	if m.cmd == nil {
		return
	}
	_ = m.cmd.Process.Kill()
	<-m.exited
	m.cmd = nil
}

// newDatabase creates a database and returns clusterd's DSN for it.
func (m *privateMariaDB) newDatabase(name string) string {
	m.t.Helper()
	db, err := sql.Open("mysql", m.driverDSN(""))
	if err != nil {
		m.t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec("CREATE DATABASE " + name + " CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"); err != nil {
		m.t.Fatalf("create database %s: %v", name, err)
	}
	return fmt.Sprintf("mysql://root@127.0.0.1:%d/%s", m.port, name)
}

func (m *privateMariaDB) driverDSN(db string) string {
	cfg := mysql.NewConfig()
	cfg.Net, cfg.Addr, cfg.User, cfg.DBName = "tcp", fmt.Sprintf("127.0.0.1:%d", m.port), "root", db
	cfg.Timeout = 2 * time.Second
	cfg.ParseTime = true
	return cfg.FormatDSN()
}

// sqlDB opens database name directly, for checks the API cannot make.
func (m *privateMariaDB) sqlDB(name string) *sql.DB {
	m.t.Helper()
	db, err := sql.Open("mysql", m.driverDSN(name))
	if err != nil {
		m.t.Fatal(err)
	}
	m.t.Cleanup(func() { _ = db.Close() })
	return db
}
