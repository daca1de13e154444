package main

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clusterd/clusterd/agent"
)

// bootDeadline bounds one boot to a ready agent: 3 to 17 s here under TCG,
// with room for a machine whose load is 25.
const bootDeadline = 5 * time.Minute

// nodeImage returns the directory holding vmlinuz and initrd.img (make
// node-image). It skips the test when QEMU is missing, and when the image
// is missing too, except under CI (make test builds the image first).
func nodeImage(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("qemu-system-x86_64 is missing (apt-get install qemu-system-x86)")
	}
	dir := os.Getenv("CLUSTERD_NODE_IMAGE")
	if dir == "" {
		dir = filepath.Join("..", "..", "build", "node-image")
	}
	for _, f := range []string{"vmlinuz", "initrd.img"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s is missing: run make node-image", filepath.Join(dir, f))
			}
			t.Skipf("%s is missing: run make node-image", filepath.Join(dir, f))
		}
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	return abs
}

// vm is one QEMU process booting the node image.
type vm struct {
	cmd     *exec.Cmd
	sock    string
	qmpSock string
	console string
	done    chan struct{}
	started time.Time
}

// startVM boots the node image with disk as its state disk and iso in its
// cdrom. The VM is killed and waited for on cleanup, whatever happens. The
// cdrom sits on virtio-scsi: the cloud kernel has no AHCI driver, so q35's
// default cdrom (-cdrom) would be invisible to it.
func startVM(t *testing.T, image, dir, name, disk, iso string) *vm {
	t.Helper()
	v := &vm{
		sock:    filepath.Join(dir, name+".sock"),
		console: filepath.Join(dir, name+".console"),
		qmpSock: filepath.Join(dir, name+".qmp"),
		done:    make(chan struct{}),
	}
	cmd := exec.Command("qemu-system-x86_64",
		"-machine", "q35", "-accel", "tcg", "-m", "256", "-smp", "1",
		"-nodefaults", "-display", "none", "-no-reboot",
		"-serial", "file:"+v.console,
		"-kernel", filepath.Join(image, "vmlinuz"),
		"-initrd", filepath.Join(image, "initrd.img"),
		"-append", "console=ttyS0 no_timer_check panic=-1 clusterd.machine="+name,
		"-drive", "file="+disk+",format=raw,if=virtio",
		"-device", "virtio-scsi-pci,id=scsi",
		"-drive", "file="+iso+",format=raw,if=none,media=cdrom,readonly=on,id=cd",
		"-device", "scsi-cd,drive=cd,bus=scsi.0,id=cd0",
		"-device", "virtio-serial",
		"-chardev", "socket,path="+v.sock+",server=on,wait=off,id=agent",
		"-device", "virtserialport,chardev=agent,name="+agent.PortName,
		"-nic", "none",
		"-qmp", "unix:"+v.qmpSock+",server=on,wait=off",
	)
	out, err := os.Create(filepath.Join(dir, name+".qemu"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	v.cmd = cmd
	v.started = time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatalf("start qemu: %v", err)
	}
	go func() {
		cmd.Wait()
		close(v.done)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-v.done
		if t.Failed() {
			b, _ := os.ReadFile(v.console)
			q, _ := os.ReadFile(filepath.Join(dir, name+".qemu"))
			t.Logf("%s console (tail):\n%s\nqemu: %s", name, tail(string(b), 30), q)
		}
	})
	return v
}

// changeISO swaps the cdrom's medium for iso while the VM runs, as
// libvirt's change-media does.
func (v *vm) changeISO(t *testing.T, iso string) {
	t.Helper()
	v.qmp(t, "blockdev-change-medium", map[string]any{"id": "cd0", "filename": iso, "format": "raw", "read-only-mode": "read-only"})
}

// qmp runs one command on the VM's QEMU monitor (QMP) and fails the test
// when QEMU refuses it.
func (v *vm) qmp(t *testing.T, cmd string, args any) {
	t.Helper()
	conn, err := net.Dial("unix", v.qmpSock)
	if err != nil {
		t.Fatalf("qmp: %v", err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(time.Minute))
	dec := json.NewDecoder(conn)
	// call sends a command and returns its reply, skipping events.
	call := func(cmd string, args any) {
		t.Helper()
		b, _ := json.Marshal(map[string]any{"execute": cmd, "arguments": args})
		if _, err := conn.Write(b); err != nil {
			t.Fatalf("qmp %s: %v", cmd, err)
		}
		for {
			var reply struct {
				Return *json.RawMessage
				Error  *struct{ Desc string }
			}
			if err := dec.Decode(&reply); err != nil {
				t.Fatalf("qmp %s: %v", cmd, err)
			}
			if reply.Error != nil {
				t.Fatalf("qmp %s: %s", cmd, reply.Error.Desc)
			}
			if reply.Return != nil {
				return
			}
		}
	}
	var greeting map[string]any
	if err := dec.Decode(&greeting); err != nil {
		t.Fatalf("qmp greeting: %v", err)
	}
	call("qmp_capabilities", map[string]any{})
	call(cmd, args)
}

// stop kills the VM (a power cut: the agent gets no warning) and waits.
func (v *vm) stop(t *testing.T) {
	t.Helper()
	select {
	case <-v.done:
		t.Fatal("the VM had stopped by itself")
	default:
	}
	v.cmd.Process.Kill()
	select {
	case <-v.done:
	case <-time.After(time.Minute):
		t.Fatal("qemu did not exit")
	}
}

// dial connects to the VM's agent channel; QEMU creates the socket just
// after it starts, and serves one connection at a time (a second waits
// until the first is closed).
func (v *vm) dial(t *testing.T, ctx context.Context) (*agent.Client, net.Conn) {
	t.Helper()
	for {
		conn, err := net.Dial("unix", v.sock)
		if err == nil {
			t.Cleanup(func() { conn.Close() })
			return agent.NewClient(conn), conn
		}
		select {
		case <-ctx.Done():
			t.Fatalf("dial %s: %v", v.sock, err)
		case <-v.done:
			t.Fatal("qemu exited before its socket was there")
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// ready waits for the agent's first answer (the request waits in QEMU until
// the guest opens its port) and returns it with the time since start.
func (v *vm) ready(t *testing.T) (*agent.Client, net.Conn, agent.Status, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bootDeadline)
	defer cancel()
	c, conn := v.dial(t, ctx)
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatalf("agent never answered: %v", err)
	}
	return c, conn, st, time.Since(v.started)
}

func TestNodeImageBootsToAnAgentThatKeepsItsState(t *testing.T) {
	image := nodeImage(t)
	dir := t.TempDir()
	disk := filepath.Join(dir, "state.raw")
	if err := os.WriteFile(disk, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(disk, 16<<20); err != nil {
		t.Fatal(err)
	}
	iso1, iso2, iso3 := filepath.Join(dir, "v1.iso"), filepath.Join(dir, "v2.iso"), filepath.Join(dir, "v3.iso")
	for path, v := range map[string]string{iso1: "1.31.2", iso2: "1.32.0", iso3: "1.33.0"} {
		if err := agent.BuildISO(path, v); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), bootDeadline)
	defer cancel()

	first := startVM(t, image, dir, "m-1", disk, iso1)
	c, conn, st, boot := first.ready(t)
	t.Logf("first boot: agent ready %v after qemu started", boot.Round(time.Millisecond))
	if want := (agent.Status{Machine: "m-1", ISOVersion: "1.31.2"}); st != want {
		t.Fatalf("first status: got %+v, want %+v", st, want)
	}
	if st, err := c.Join(ctx, "c-1", st.ISOVersion); err != nil || !st.Joined || st.Version != "1.31.2" {
		t.Fatalf("join: got %+v, %v", st, err)
	}
	kc, err := c.Kubeconfig(ctx)
	if err != nil || !strings.Contains(kc, `current-context: "c-1"`) {
		t.Fatalf("kubeconfig: got %q, %v", kc, err)
	}
	if _, err := c.Upgrade(ctx, "1.32.0"); !isRefusal(err) {
		t.Fatalf("upgrade to a version the ISO does not hold: got %v, want a refusal", err)
	}

	// The ISO swapped while the machine runs: the agent reads the new one.
	first.changeISO(t, iso2)
	if st, err := c.Upgrade(ctx, "1.32.0"); err != nil || st.Version != "1.32.0" || st.ISOVersion != "1.32.0" {
		t.Fatalf("upgrade after the ISO swap: got %+v, %v", st, err)
	}

	// The host closes the channel and comes back: the agent answers again.
	// The guest sees the channel closed (its port reads EOF) and reopens
	// its port; a request that reaches it meanwhile is lost, so the request
	// is sent again on a new connection until one is answered, as
	// infra/libvirt's SocketAgents does (drain is idempotent). On a loaded
	// machine the slow guest took longer than a fixed 2 s pause (run C2).
	conn.Close()
	for {
		try, cancelTry := context.WithTimeout(ctx, 10*time.Second)
		c2, conn2 := first.dial(t, try)
		st, err := c2.Drain(try)
		cancelTry()
		if err == nil {
			if !st.Cordoned {
				t.Fatalf("drain on a new connection: got %+v; want cordoned", st)
			}
			break
		}
		conn2.Close()
		if ctx.Err() != nil {
			t.Fatalf("drain on a new connection: no answer within %s: %v", bootDeadline, err)
		}
	}

	// Power cut, then boot with the next version's ISO.
	first.stop(t)
	second := startVM(t, image, dir, "m-1", disk, iso3)
	c, _, st, boot = second.ready(t)
	t.Logf("second boot: agent ready %v after qemu started", boot.Round(time.Millisecond))
	want := agent.Status{Machine: "m-1", Cluster: "c-1", Version: "1.32.0", ISOVersion: "1.33.0", Joined: true, Cordoned: true}
	if st != want {
		t.Fatalf("after reboot: got %+v, want %+v (the state on the disk)", st, want)
	}
	st, err = c.Upgrade(ctx, "1.33.0")
	want.Version, want.Cordoned = "1.33.0", false
	if err != nil || st != want {
		t.Fatalf("upgrade: got %+v, %v; want %+v", st, err, want)
	}
}

func isRefusal(err error) bool {
	var ae *agent.Error
	return errors.As(err, &ae)
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// TestNodeImagePowersOffOnThePowerButton: libvirt's graceful shutdown
// presses the guest's ACPI power button (QMP system_powerdown); the agent,
// as the guest's init, powers the machine off, so QEMU exits without being
// killed and the state saved before is still on the disk.
func TestNodeImagePowersOffOnThePowerButton(t *testing.T) {
	image := nodeImage(t)
	dir := t.TempDir()
	disk := filepath.Join(dir, "state.raw")
	if err := os.WriteFile(disk, make([]byte, 16<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	iso := filepath.Join(dir, "v1.iso")
	if err := agent.BuildISO(iso, "1.31.2"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), bootDeadline)
	defer cancel()
	m := startVM(t, image, dir, "m-1", disk, iso)
	c, _, _, _ := m.ready(t)
	if _, err := c.Join(ctx, "c-1", "1.31.2"); err != nil {
		t.Fatalf("join: %v", err)
	}
	// Pressed again every 2 s, as an impatient operator would: a press
	// before the agent has opened the button's input device goes unseen.
	pressed := time.Now()
	for off := false; !off; {
		select {
		case <-m.done: // off since the last look
		default:
			m.qmp(t, "system_powerdown", map[string]any{})
		}
		select {
		case <-m.done:
			off = true
			t.Logf("powered off %v after the first press", time.Since(pressed).Round(time.Millisecond))
		case <-time.After(2 * time.Second):
		case <-ctx.Done():
			t.Fatal("the guest did not power off on the ACPI power button")
		}
	}
	again := startVM(t, image, dir, "m-1", disk, iso)
	if _, _, st, _ := again.ready(t); !st.Joined || st.Cluster != "c-1" {
		t.Fatalf("after the power off: %+v; want the join kept", st)
	}
}
