// Package runner runs clusterd's operations as asynchronous jobs owned by the
// server process.
//
// An RPC claims a cluster (repository.Store.Claim writes the compare-and-set
// and the IN_PROGRESS job row in one transaction, SPEC §3.2) and hands the
// work to a Runner, then returns a google.longrunning.Operation at once
// (SPEC §4). The Runner owns the job from then on:
//
//   - it runs the work on a context derived from the Runner's own, never the
//     RPC's, which gRPC cancels as soon as the handler returns;
//   - it bounds the work by the job's Deadline;
//   - it records each step on the job row (Progress.Step; a first step that
//     the job's claim recorded is read instead), and in the same round trip
//     learns whether a cancellation was requested, possibly through another
//     server, and whether recovery already ended the job;
//   - it rides out a database outage (a restart, a failover): a step's write
//     is made again until the database answers, and a job whose lease
//     lapsed meanwhile, or whose work met the outage, is handed off once
//     the database is back (Config.HandOff), for this server or a peer to
//     run on from its last recorded step, all within the job's deadline;
//   - it cancels the job's context when a cancellation is requested (Cancel,
//     on the server that served CancelOperation; Config.WatchCancels, for a
//     request served by another server), so a step in flight, a held or slow
//     one included, ends at once rather than at its end;
//   - it ends the job and releases the cluster in one transaction
//     (repository.Store.FinishJob), exactly once, in one place, retrying
//     through a transient database outage until the job's deadline;
//   - Shutdown cancels the running jobs, ends them, and waits for them.
//
// # Job errors
//
// A job that did not succeed stores, in repository.Job.Error, a
// google.rpc.Status encoded with protojson (the JSON mapping of
// google/rpc/status.proto), which the service decodes into the Operation's
// error as is:
//
//	{"code":1,  "message":"operation cancelled"}            cancelled (CANCELLED)
//	{"code":4,  "message":"operation deadline exceeded"}    past the job's deadline (DEADLINE_EXCEEDED)
//	{"code":14, "message":"server shutting down"}           interrupted by Shutdown (UNAVAILABLE)
//	{"code":13, "message":"internal error: panic: ..."}     Run panicked (INTERNAL)
//	{"code":N,  "message":"...", "details":[...]}           Run returned a gRPC status error: its code, message and details
//	{"code":2,  "message":"<err.Error()>"}                  any other error (UNKNOWN)
//
// protojson output is not byte-stable (it varies whitespace on purpose), so
// readers must decode it rather than compare strings.
package runner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/clusterd/clusterd/repository"
)

// Store is the part of the repository the runner needs. It is declared here,
// where it is used, so the runner depends on two methods rather than on the
// whole repository, and so it says exactly which writes a job makes: its
// progress, and its end.
type Store interface {
	// RecordProgress writes a running job's step and returns the job as
	// stored; a job no longer IN_PROGRESS is a *repository.JobConflictError.
	RecordProgress(ctx context.Context, jobID string, p repository.Progress) (repository.Job, error)
	// GetJob reads a job: a first step that the job's claim recorded
	// already is read rather than written again (Progress.Step).
	GetJob(ctx context.Context, jobID string) (repository.Job, error)
	// FinishJob ends an IN_PROGRESS job and releases its cluster in one
	// transaction.
	FinishJob(ctx context.Context, f repository.Finish) (repository.Job, error)
	// HandOffJob lets go of a running job, still IN_PROGRESS and holding its
	// cluster, for another server to adopt (Config.HandOff).
	HandOffJob(ctx context.Context, h repository.HandOff) (repository.Job, error)
	// CancelRequested returns which of the jobs ids are IN_PROGRESS with a
	// cancellation requested (Config.WatchCancels).
	CancelRequested(ctx context.Context, ids []string) ([]string, error)
}

// Task is one claimed job and the work to do for it. The claim must have
// committed before the Task is started (SPEC §3.2): the runner never claims,
// it only runs and ends.
type Task struct {
	// Job is the job as returned by Store.Claim or Store.CreateCluster:
	// IN_PROGRESS, with its Deadline set.
	Job repository.Job
	// Run does the work. It calls p.Step before each step, and stops when
	// Step returns an error (returning it, wrapped or not). On success it
	// returns the outcome. Run's ctx carries the job's deadline and is
	// cancelled by Shutdown and by a cancellation request (its cause is then
	// ErrCancelled), so the step in flight must end promptly on it, having
	// changed nothing or something a rerun finds done: every step is
	// idempotent and fenced (SPEC §6), so this is no worse than a crash.
	Run func(ctx context.Context, p *Progress) (Outcome, error)
	// Release builds the cluster transition that ends the job when it did not
	// succeed (failure, cancellation, deadline, shutdown, panic); cause says
	// why (errors.Is it against ErrCancelled, ErrDeadline, ErrShutdown). It
	// may return nil to leave the cluster alone. It is called on a context
	// that is not the (possibly cancelled) job context, so it can still read
	// the database, and called again if it, or the write of the job's end,
	// failed transiently (repository.ErrUnavailable), so it must be
	// idempotent. When Release is nil or fails otherwise, the job still ends
	// and the cluster stays named by a finished job, which the scanner's
	// orphan recovery fails (SPEC §5).
	Release func(ctx context.Context, cause error) (*repository.Transition, error)
}

// Outcome is how a job that succeeded ends.
type Outcome struct {
	// Result is opaque JSON stored as the job's result (the operation's
	// response).
	Result string
	// Release is how the cluster moves, written in the same transaction as
	// the job's end; nil leaves the cluster alone.
	Release *repository.Transition
}

// Errors the runner returns, or gives to Task.Release as the cause of a job's
// end, so callers can tell the reasons apart with errors.Is.
var (
	// ErrCancelled: the job's row has CancelRequested (SPEC §4). It is the
	// cause of the job context's cancellation, and Progress.Step returns it;
	// the job ends CANCELLED.
	ErrCancelled = errors.New("operation cancelled")
	// ErrJobEnded: the job's row is no longer IN_PROGRESS because someone
	// else (recovery, on this server or another) ended it. Progress.Step
	// returns it wrapping the store's error; the work must stop, and the
	// runner writes nothing more, since the job's end is already recorded and
	// the cluster may belong to another operation by now.
	ErrJobEnded = errors.New("job already ended elsewhere")
	// ErrDeadline is the cause given to Task.Release when the job ran past its
	// deadline (SPEC §4); the job ends FAILED with DEADLINE_EXCEEDED.
	ErrDeadline = errors.New("operation deadline exceeded")
	// ErrListed: Reserve was asked for a job this runner lists already (it
	// runs here, is still ending here, or is reserved by a claim in
	// flight), so this server must not claim or adopt it again.
	ErrListed = errors.New("job already listed on this server's runner")
	// ErrStopped: Start was called after Shutdown. The caller's claim is
	// already written, so the caller must end the job itself (or leave it to
	// recovery once this server is gone).
	ErrStopped = errors.New("runner stopped")
	// ErrShutdown is the cause given to Task.Release for jobs interrupted by
	// Shutdown; they end FAILED with UNAVAILABLE, so a client may retry on
	// another server.
	ErrShutdown = errors.New("server shutting down")
	// ErrLeaseLost: this server's heartbeat lapsed (Config.Lease), so its
	// peers may already count it dead and recover its clusters; its jobs
	// stop at their next step.
	ErrLeaseLost = errors.New("server lease lost")
)

// Why a job ended that its own runner did not end: liveness fails the jobs of
// servers that are gone (package scanner). They are the runner's vocabulary
// too, so that every job's end is encoded by one mapping (Config.Encode).
var (
	// ErrServerRestarted: the job belonged to an earlier incarnation of the
	// server that failed it (the process restarted mid-operation).
	ErrServerRestarted = errors.New("server restarted")
	// ErrOwnerStopped: the job's server stopped heartbeating for longer than
	// the peer timeout; a peer failed it.
	ErrOwnerStopped = errors.New("owner server stopped")
	// ErrJobLost: the job's own live server no longer ran it (its end could
	// not be recorded when it finished).
	ErrJobLost = errors.New("its server lost track of it (the end of the job could not be recorded)")
)

// Config is what a Runner needs.
type Config struct {
	// Store records progress and ends jobs. Required.
	Store Store
	// Logger receives the runner's logs; nil means slog.Default().
	Logger *slog.Logger
	// OnDone, optional, is called with the final job row after this runner
	// ended a job, so the service can wake WaitOperation callers without
	// polling. It is not called for jobs someone else ended. It runs on the
	// job's goroutine and must not block.
	OnDone func(job repository.Job)
	// FinishTimeout is the least budget a job has for recording its end or
	// its hand-off, Release included (default 30s); a job whose deadline is
	// further away has until its deadline, since it was accepted for that
	// long. The writes run on a context that survives the job's
	// cancellation, so that a cancelled or timed-out job still records its
	// end, and they are retried through a transient database outage
	// (repository.ErrUnavailable: a restart, a failover) until the budget is
	// spent or Abort is called (a shutdown out of time).
	FinishTimeout time.Duration
	// Lease, optional, says whether this server may still act; jobs stop at
	// their next step when it does not (see ErrLeaseLost).
	Lease Lease
	// Encode turns why a job did not succeed (an error of its work, or one
	// of the Err* causes above) into the job's stored error, the protojson
	// of a google.rpc.Status with its ErrorInfo: one mapping, the service's,
	// for operations and RPCs alike. Nil stores the code and message only.
	Encode func(cause error) string
	// WatchCancels, when positive, is how often the runner asks the database
	// which of its jobs have a cancellation requested, so that a cancel
	// served by another server reaches the step in flight within about that
	// long (one query per interval for all the jobs, and none while no job
	// runs). Zero leaves such a cancel to the job's next Step; a cancel of a
	// job of this process is seen at once through Cancel either way.
	WatchCancels time.Duration
	// HandOff makes a job interrupted by Shutdown, by the loss of the lease
	// or by a database outage (its work returned repository.ErrUnavailable
	// before its deadline) hand itself off (Store.HandOffJob) at the step
	// boundary where it stopped, instead of failing: it stays IN_PROGRESS,
	// holding its cluster, for a live server (this one too, once its lease
	// is back) to adopt and run on (SPEC §5 step 4).
	// Without it such a job ends FAILED (UNAVAILABLE) and its cluster is
	// released to the failure state.
	HandOff bool
}

// Lease says whether this server may still act (package lease): nil while
// its heartbeat is recent and nobody took its server id.
type Lease interface {
	Check() error
}

// DefaultFinishTimeout is the FinishTimeout used when Config leaves it zero.
const DefaultFinishTimeout = 30 * time.Second

// Runner runs jobs in goroutines it owns, and stops and waits for them on
// Shutdown. It is safe for concurrent use.
type Runner struct {
	store         Store
	log           *slog.Logger
	onDone        func(repository.Job)
	finishTimeout time.Duration
	lease         Lease
	encode        func(error) string
	handOff       bool
	watchEvery    time.Duration

	// ctx is the parent of every job's context. It belongs to the runner, not
	// to any request, and only Shutdown cancels it.
	ctx    context.Context
	cancel context.CancelFunc
	// finishCtx is the parent of the contexts jobs record their end on; only
	// Abort cancels it.
	finishCtx   context.Context
	abortFinish context.CancelFunc
	// wg counts the jobs and the goroutines that run them (workers) and
	// the watch: Shutdown waits for all.
	wg sync.WaitGroup
	// toWorker gives a job to a worker waiting for one; idleWorkers counts
	// those waiting (see worker).
	toWorker    chan func()
	idleWorkers atomic.Int32
	workerIdle  time.Duration

	mu      sync.Mutex
	stopped bool
	// running maps the jobs of this process to the cancellation of their
	// context once started (nil: reserved by a claim that has not committed
	// yet).
	running map[string]context.CancelCauseFunc
	// watching says whether the goroutine of Config.WatchCancels runs; it
	// runs while jobs do.
	watching bool
}

// New returns a Runner ready to Start tasks.
func New(cfg Config) *Runner {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	timeout := cfg.FinishTimeout
	if timeout <= 0 {
		timeout = DefaultFinishTimeout
	}
	encode := cfg.Encode
	if encode == nil {
		encode = EncodePlain
	}
	ctx, cancel := context.WithCancel(context.Background())
	finishCtx, abort := context.WithCancel(context.Background())
	return &Runner{
		store:         cfg.Store,
		log:           log,
		onDone:        cfg.OnDone,
		finishTimeout: timeout,
		lease:         cfg.Lease,
		encode:        encode,
		handOff:       cfg.HandOff,
		watchEvery:    cfg.WatchCancels,
		ctx:           ctx,
		cancel:        cancel,
		finishCtx:     finishCtx,
		abortFinish:   abort,
		running:       map[string]context.CancelCauseFunc{},
		toWorker:      make(chan func()),
		workerIdle:    workerIdle,
	}
}

// Start launches the task in a goroutine owned by the runner. The job's
// context derives from the runner's own (cancelled only by Shutdown) with the
// job's Deadline, never from the caller's: an RPC's context is cancelled when
// its handler returns, which is right after Start. Start returns ErrStopped
// after Shutdown, and an error for a task that cannot run (no Run, no
// deadline, or a job already running here); in every error case nothing was
// started and the job's row is untouched.
func (r *Runner) Start(t Task) error {
	if t.Job.ID == "" || t.Run == nil {
		return fmt.Errorf("start job %q: task needs a job id and a Run function", t.Job.ID)
	}
	if t.Job.Deadline.IsZero() {
		return fmt.Errorf("start job %s: job has no deadline", t.Job.ID)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		return fmt.Errorf("start job %s: %w", t.Job.ID, ErrStopped)
	}
	if r.running[t.Job.ID] != nil {
		return fmt.Errorf("start job %s: already running", t.Job.ID)
	}
	// The context exists before the goroutine, so a Cancel that follows
	// Start always finds it.
	deadlineCtx, stop := context.WithDeadline(r.ctx, t.Job.Deadline)
	jobCtx, cancel := context.WithCancelCause(deadlineCtx)
	r.running[t.Job.ID] = cancel
	// Add under mu, which Shutdown takes before Wait: no Add can follow Wait.
	r.wg.Add(1)
	job := func() { r.run(t, jobCtx, func() { cancel(nil); stop() }) }
	select {
	case r.toWorker <- job:
	default:
		r.wg.Add(1)
		go r.worker(job)
	}
	if r.watchEvery > 0 && !r.watching {
		r.watching = true
		r.wg.Add(1)
		go r.watch()
	}
	return nil
}

// Cancel cancels the context of job jobID, with cause ErrCancelled, if it
// runs in this process, and reports whether it does: its step in flight ends
// at once and the job ends CANCELLED (SPEC §4). The caller has recorded the
// request on the job's row first (repository.Store.RequestCancel), so the
// job's end and every server agree that it was cancelled.
func (r *Runner) Cancel(jobID string) bool {
	r.mu.Lock()
	cancel := r.running[jobID]
	r.mu.Unlock()
	if cancel == nil {
		return false
	}
	cancel(ErrCancelled)
	return true
}

// watchTimeout bounds one query of watch.
const watchTimeout = 10 * time.Second

// watch is the goroutine of Config.WatchCancels: every interval, while jobs
// run, it asks the database which of them have a cancellation requested (by
// a CancelOperation that another server served) and cancels them. It ends
// when no job runs (Start starts it again) or at Shutdown.
func (r *Runner) watch() {
	defer r.wg.Done()
	tick := time.NewTicker(r.watchEvery)
	defer tick.Stop()
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-tick.C:
		}
		r.mu.Lock()
		ids := make([]string, 0, len(r.running))
		for id, cancel := range r.running {
			if cancel != nil {
				ids = append(ids, id)
			}
		}
		if len(r.running) == 0 {
			r.watching = false
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		if len(ids) == 0 {
			continue
		}
		ctx, cancel := context.WithTimeout(r.ctx, watchTimeout)
		cancelled, err := r.store.CancelRequested(ctx, ids)
		cancel()
		if err != nil {
			// The jobs' next steps see the request anyway.
			if r.ctx.Err() == nil {
				r.log.Warn("could not look for cancelled jobs", "jobs", len(ids), "err", err)
			}
			continue
		}
		for _, id := range cancelled {
			if r.Cancel(id) {
				r.log.Info("job cancelled through another server: interrupting its step", "job", id)
			}
		}
	}
}

// Reserve lists a job id as running before the claim that creates the job,
// or the adoption that makes it this server's, commits, so that no moment
// exists when the job is IN_PROGRESS in the database but unknown to this
// runner (the scanner fails such jobs as lost). The caller must Start the
// job, or call the returned release if the claim failed; release after
// Start does nothing.
//
// A job listed here already is refused (ErrListed, with a release that does
// nothing): it runs here, or its attempt is still recording its end or its
// hand-off, or another claim reserved it. Its adoption would commit a new
// attempt that Start then refuses, fencing the attempt that runs.
func (r *Runner) Reserve(jobID string) (release func(), err error) {
	r.mu.Lock()
	_, listed := r.running[jobID]
	if !listed {
		r.running[jobID] = nil
	}
	r.mu.Unlock()
	if listed {
		return func() {}, fmt.Errorf("reserve job %s: %w", jobID, ErrListed)
	}
	return func() {
		r.mu.Lock()
		if cancel, ok := r.running[jobID]; ok && cancel == nil {
			delete(r.running, jobID)
		}
		r.mu.Unlock()
	}, nil
}

// Running returns the ids of the jobs running in this process (and those
// reserved by a claim in flight), sorted. A job stays listed until its end
// is written, so a liveness check that compares
// this list with the IN_PROGRESS jobs of this server never sees a live job as
// orphaned.
func (r *Runner) Running() []string {
	r.mu.Lock()
	ids := make([]string, 0, len(r.running))
	for id := range r.running {
		ids = append(ids, id)
	}
	r.mu.Unlock()
	slices.Sort(ids)
	return ids
}

// Interrupt stops accepting tasks and cancels the running jobs' contexts,
// without waiting for them (Shutdown does). Called first in a graceful stop,
// it makes sure every job sees its context done, and so ends as interrupted
// by the shutdown (ErrShutdown: handed off with Config.HandOff), whatever
// else the stop then does to its current step (a simulated held step let go
// with its own error).
func (r *Runner) Interrupt() {
	r.mu.Lock()
	r.stopped = true
	r.mu.Unlock()
	r.cancel()
}

// Shutdown stops accepting tasks, cancels the running jobs' contexts (their
// current step is interrupted; they end FAILED with cause ErrShutdown and
// their Release applied, or with Config.HandOff are handed off for another
// server to adopt), and waits for every job goroutine. If ctx is done
// first it returns an error wrapping ctx.Err(); the jobs keep ending in the
// background, each bounded by FinishTimeout. Shutdown may be called more than
// once.
func (r *Runner) Shutdown(ctx context.Context) error {
	r.Interrupt()

	done := make(chan struct{})
	go func() {
		// Ends when the last job does; bounded by FinishTimeout per job.
		r.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("runner shutdown: jobs still ending %v: %w", r.Running(), ctx.Err())
	}
}

// Abort gives up on recording the ends that jobs are still writing (a
// database that stays down past the shutdown budget): their writes return at
// once, the jobs stay IN_PROGRESS in the database, and peers or this
// server's next incarnation fail them. It does not wait; Shutdown does.
func (r *Runner) Abort() {
	r.abortFinish()
}

// Workers: a job runs on a goroutine that, once the job has ended, waits
// for the next job for up to workerIdle, so that a busy server does not
// start a goroutine a job. A new goroutine's stack grows, by copies, to
// what the database drivers' calls need (SQLite's, translated from C, are
// deep): 1-3% of clusterd's CPU with jobs running when every job had a
// goroutine of its own (BENCHMARKS.md). A job waiting in a step holds its
// worker. At most maxIdleWorkers wait.
const (
	workerIdle     = 10 * time.Second
	maxIdleWorkers = 64
)

// worker runs job, then the jobs Start hands it, until it has waited
// workerIdle for one, more than maxIdleWorkers wait, or the runner stops.
func (r *Runner) worker(job func()) {
	defer r.wg.Done()
	idle := time.NewTimer(r.workerIdle)
	defer idle.Stop()
	for {
		job()
		job = nil // let go of the task while waiting
		if r.idleWorkers.Add(1) > maxIdleWorkers {
			r.idleWorkers.Add(-1)
			return
		}
		idle.Reset(r.workerIdle)
		select {
		case job = <-r.toWorker:
			r.idleWorkers.Add(-1)
		case <-idle.C:
			r.idleWorkers.Add(-1)
			return
		case <-r.ctx.Done():
			r.idleWorkers.Add(-1)
			return
		}
	}
}

// run is the job's work on a worker: run the work on jobCtx, end the job,
// let go of it (and of jobCtx, with done).
func (r *Runner) run(t Task, jobCtx context.Context, done func()) {
	defer r.wg.Done()
	defer done()
	log := r.log.With("job", t.Job.ID, "kind", t.Job.Kind, "cluster", t.Job.ResourceID)

	p := newProgress(r.store, t.Job, r.lease, log)

	out, err := r.call(jobCtx, log, t, p)
	final, ok := r.finish(jobCtx, log, t, p, out, err)

	r.mu.Lock()
	delete(r.running, t.Job.ID)
	r.mu.Unlock()
	if ok && r.onDone != nil {
		r.onDone(final)
	}
}

// call runs the task's work, turning a panic into an error so that one bad
// operation fails its job instead of the whole process.
func (r *Runner) call(ctx context.Context, log *slog.Logger, t Task, p *Progress) (out Outcome, err error) {
	defer func() {
		if v := recover(); v != nil {
			log.Error("job panicked", "panic", v, "stack", string(debug.Stack()))
			out, err = Outcome{}, &panicError{value: v}
		}
	}()
	return t.Run(ctx, p)
}
