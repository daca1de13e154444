package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
)

// TestImage builds the container image as `make image` does and runs it as
// an orchestrator would: with --network host (the only network containers
// get here), its own HEALTHCHECK, a volume for the embedded database or a
// MariaDB DSN, and SIGTERM to stop. It checks what a user of the image
// sees: the container turns healthy, serves a create to its end, runs as a
// non-root user, exits 0 on SIGTERM, keeps its SQLite database in the volume
// across containers, and its version label is what the binary prints.
func TestImage(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the image test builds an image")
	}
	if out, err := exec.Command("docker", "info").CombinedOutput(); err != nil {
		skipOrFail(t, "no Docker engine (make docker starts one): %v: %s", err, tail(string(out), 500))
	}
	t.Parallel()
	tag := fmt.Sprintf("clusterd-test:%d-%d", os.Getpid(), time.Now().UnixNano())
	build := exec.Command("bash", "scripts/image.sh", tag)
	build.Dir = repoRoot(t)
	build.Env = append(os.Environ(), "VERSION=v0.0.0-imagetest", "COMMIT=imagetest")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("scripts/image.sh: %v\n%s", err, out)
	}
	t.Cleanup(func() { _, _ = docker(t, "rmi", "-f", tag) })

	t.Run("labels", func(t *testing.T) {
		label, err := docker(t, "inspect", "-f", `{{index .Config.Labels "org.opencontainers.image.version"}}`, tag)
		if err != nil || label != "v0.0.0-imagetest" {
			t.Fatalf("image version label %q (%v); want v0.0.0-imagetest", label, err)
		}
		name := containerName()
		out, err := docker(t, "run", "--rm", "--name", name, "--network", "host", tag, "--version")
		if err != nil || !strings.HasPrefix(out, "clusterd v0.0.0-imagetest") {
			t.Fatalf("clusterd --version in the image: %q (%v); want it to start with clusterd v0.0.0-imagetest", out, err)
		}
	})

	t.Run("sqlite", func(t *testing.T) {
		volume := containerName()
		if _, err := docker(t, "volume", "create", volume); err != nil {
			t.Fatalf("docker volume create: %v", err)
		}
		t.Cleanup(func() { _, _ = docker(t, "volume", "rm", "-f", volume) })
		c := runImage(t, tag, "-v", volume+":/data")
		created := c.srv.create(t, "image-sqlite")
		c.nonRoot(t)
		c.terminate(t)

		// A second container on the same volume has the cluster.
		c2 := runImage(t, tag, "-v", volume+":/data")
		if got := c2.srv.cluster(t, created.GetName()); got.GetState() != clv1.Cluster_RUNNING {
			t.Fatalf("cluster %s in the volume's database is %s; want RUNNING", created.GetName(), got.GetState())
		}
		c2.terminate(t)
	})

	t.Run("mariadb", func(t *testing.T) {
		dsn := newDatabase(t)
		c := runImage(t, tag, "-e", "CLUSTERD_DATABASE="+dsn)
		c.srv.create(t, "image-mariadb")
		c.nonRoot(t)
		c.terminate(t)
	})
}

// container is one clusterd container of TestImage and clients of it.
type container struct {
	name string
	srv  *server
}

// runImage starts the image detached on loopback ports with --network host
// and the given docker run options, and waits until its HEALTHCHECK reports
// healthy. The container is removed when the test ends, and its log printed
// if the test failed.
func runImage(t *testing.T, tag string, opts ...string) *container {
	t.Helper()
	name := containerName()
	grpcAddr, httpAddr := freeAddr(t), freeAddr(t)
	args := append([]string{"run", "-d", "--name", name, "--network", "host",
		"-e", "CLUSTERD_GRPC_ADDR=" + grpcAddr, "-e", "CLUSTERD_HTTP_ADDR=" + httpAddr,
		"-e", "CLUSTERD_SIM_STEP_DELAY=0"}, opts...)
	args = append(args, tag)
	if out, err := docker(t, args...); err != nil {
		t.Fatalf("docker run: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if t.Failed() {
			logs, _ := exec.Command("docker", "logs", name).CombinedOutput()
			t.Logf("log of container %s:\n%s", name, logs)
		}
		_, _ = docker(t, "rm", "-f", "-v", name) // -v: and its anonymous volumes
	})
	c := &container{name: name, srv: &server{id: name, addr: grpcAddr}}
	if err := c.srv.dial(grpcAddr); err != nil {
		t.Fatalf("dial %s: %v", grpcAddr, err)
	}
	t.Cleanup(func() { _ = c.srv.conn.Close() })
	deadline := time.Now().Add(3 * time.Minute)
	for {
		st, err := docker(t, "inspect", "-f", "{{.State.Status}} {{.State.Health.Status}}", name)
		if err == nil && st == "running healthy" {
			return c
		}
		if err != nil || strings.HasPrefix(st, "exited") || time.Now().After(deadline) {
			t.Fatalf("container %s is %q (%v), not healthy", name, st, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// nonRoot checks the server process runs as the image's user, 65532, as
// the host's kernel sees it.
func (c *container) nonRoot(t *testing.T) {
	t.Helper()
	pid, err := docker(t, "inspect", "-f", "{{.State.Pid}}", c.name)
	if err != nil {
		t.Fatalf("docker inspect: %v", err)
	}
	status, err := os.ReadFile(filepath.Join("/proc", pid, "status"))
	if err != nil {
		t.Fatalf("the container's process %s: %v", pid, err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if f := strings.Fields(line); len(f) == 5 && f[0] == "Uid:" {
			if f[1] != "65532" || f[2] != "65532" {
				t.Fatalf("clusterd in the container runs as uid %s (effective %s); want 65532", f[1], f[2])
			}
			return
		}
	}
	t.Fatalf("no Uid line in /proc/%s/status", pid)
}

// terminate stops the container as an orchestrator does (SIGTERM, then
// SIGKILL after a grace period well past the server's shutdown budget) and
// requires exit 0.
func (c *container) terminate(t *testing.T) {
	t.Helper()
	if out, err := docker(t, "stop", "--time", "60", c.name); err != nil {
		t.Fatalf("docker stop: %v: %s", err, out)
	}
	code, err := docker(t, "inspect", "-f", "{{.State.ExitCode}}", c.name)
	if err != nil || code != "0" {
		logs, _ := exec.Command("docker", "logs", c.name).CombinedOutput()
		t.Fatalf("container %s exited with %q (%v) after SIGTERM; want 0. Log:\n%s", c.name, code, err, tail(string(logs), 3000))
	}
}

// docker runs the docker command line and returns its trimmed output.
func docker(t *testing.T, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, "docker", args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return strings.TrimSpace(out.String()), err
}

// containerName is a name no other test or run uses.
func containerName() string {
	return "clusterd-test-" + strconv.Itoa(os.Getpid()) + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
}

// repoRoot is the repository's top folder (the e2e package's parent).
func repoRoot(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(wd)
}
