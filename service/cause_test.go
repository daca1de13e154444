package service

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/clusterd/clusterd/infra"
)

// decodeJobError is the stored error as GetOperation returns it.
func decodeJobError(t *testing.T, stored string) *status.Status {
	t.Helper()
	p := &spb.Status{}
	if err := protojson.Unmarshal([]byte(stored), p); err != nil {
		t.Fatalf("stored error %q does not decode: %v", stored, err)
	}
	return status.FromProto(p)
}

// An infrastructure step's error is the server's own account of what went
// wrong: the operation's error carries it whole, up to maxCause bytes, and
// cut there (on a rune boundary, saying so) beyond.
func TestEncodeJobErrorKeepsAStepsCause(t *testing.T) {
	long := strings.Repeat("é", 3000) // 6000 bytes, two per rune
	tests := []struct {
		name  string
		cause string
		// whole: the message is "step upgrade_node failed: " + cause.
		whole bool
	}{
		{"short", "upgrade_node: injected failure (fault f-1)", true},
		{"longer than a client's quoted input", "upgrade_node: " + strings.Repeat("the hypervisor said no; ", 20) + "(fault f-42)", true},
		{"exactly the bound", strings.Repeat("x", maxCause-len("step upgrade_node failed: ")), true},
		{"beyond the bound", long, false},
		{"beyond the bound, one byte runes", strings.Repeat("y", 3*maxCause), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := fmt.Errorf("run job: %w", &StepError{Step: infra.StepUpgradeNode, Err: errors.New(tt.cause)})
			st := decodeJobError(t, EncodeJobError(err))
			msg := st.Message()
			if st.Code() != codes.Unavailable {
				t.Errorf("code = %v; want UNAVAILABLE", st.Code())
			}
			var info *errdetails.ErrorInfo
			for _, d := range st.Details() {
				if i, ok := d.(*errdetails.ErrorInfo); ok {
					info = i
				}
			}
			if info.GetReason() != ReasonStepFailed || info.GetMetadata()["step"] != infra.StepUpgradeNode {
				t.Errorf("ErrorInfo = %v; want STEP_FAILED at step upgrade_node", info)
			}
			want := "step upgrade_node failed: " + tt.cause
			if tt.whole {
				if msg != want {
					t.Errorf("message = %q; want the whole cause %q", msg, want)
				}
				return
			}
			suffix := fmt.Sprintf("…(cut: %d bytes in all)", len(want))
			switch {
			case len(msg) > maxCause:
				t.Errorf("message is %d bytes; want at most %d", len(msg), maxCause)
			case len(msg) < maxCause-utf8.UTFMax:
				t.Errorf("message is %d bytes; want the bound used (%d)", len(msg), maxCause)
			case !utf8.ValidString(msg):
				t.Errorf("message %q is not valid UTF-8: cut inside a rune", msg)
			case !strings.HasSuffix(msg, suffix):
				t.Errorf("message ends %q; want it to say it was cut (%q)", msg[len(msg)-40:], suffix)
			case !strings.HasPrefix(want, strings.TrimSuffix(msg, suffix)):
				t.Errorf("message %q is not a prefix of the cause", msg)
			}
		})
	}
}

// A cause that is not valid UTF-8 (an infrastructure's raw output) is still
// stored: protojson refuses such strings, and the cause must not become
// "internal error".
func TestEncodeJobErrorKeepsACauseThatIsNotUTF8(t *testing.T) {
	err := &StepError{Step: infra.StepAttachISO, Err: errors.New("attach_iso: driver said \xff\xfe gone")}
	st := decodeJobError(t, EncodeJobError(err))
	if want := "step attach_iso failed: attach_iso: driver said \uFFFD gone"; st.Message() != want {
		t.Errorf("message = %q; want %q", st.Message(), want)
	}
}
