package server

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/scanner"
	"github.com/clusterd/clusterd/service"
	"github.com/clusterd/clusterd/version"
)

// metrics is what clusterd exports at GET /metrics: the gRPC server's
// metrics (go-grpc-middleware's Prometheus provider: grpc_server_handled_total,
// grpc_server_handling_seconds, ...; REST calls count too, since the gateway
// calls the gRPC server), clusterd's own counters, and gauges read at scrape
// time (clusters per state, the scanner's counters, the database pool).
// Each process has its own registry, so tests can run several servers.
//
// Where clusterd's counters are fed, without reaching into the packages that
// do the work:
//   - operations and their durations: the runner's OnDone callback (jobDone),
//     once per job this server ran to its end;
//   - refused claims: an interceptor on the mutating ClusterLifecycle RPCs
//     (refusals), reading the ErrorInfo reason of the mapped status;
//   - recoveries: a decorator of the scanner's Recoverer (recoverer), per
//     recovery whose claim won;
//   - repairs: a decorator of the service's Store (repairStore), per REPAIR
//     history entry the service writes.
type metrics struct {
	registry         *prometheus.Registry
	grpc             *grpcprom.ServerMetrics
	operations       *prometheus.CounterVec
	operationSeconds *prometheus.HistogramVec
	claimsRefused    *prometheus.CounterVec
	recoveries       *prometheus.CounterVec
	repairs          *prometheus.CounterVec
}

// Labels of the counters, listed so that every series exists from the
// start (a rate over a series that appears late misses its first events).
var (
	operationResults = []string{"succeeded", "failed", "cancelled"}
	// refusalReasons are the ErrorInfo reasons of a mutation refused at its
	// claim: the cluster is held, changed under it, in the wrong state, or
	// this server takes no work.
	refusalReasons = []string{
		service.ReasonOperationInProgress, service.ReasonConcurrentModification, service.ReasonInvalidStateTransition,
		service.ReasonEtagMismatch, service.ReasonServerUnavailable, service.ReasonShuttingDown,
	}
	recoveryKinds = []string{"orphan", "destroy_retry", "faults_detected", "recover_alert", "stop_alert"}
	// repairKinds are the steps recovery repairs with (the prefix of the
	// REPAIR entry's message), and "spec" for a spec made to match the nodes.
	repairKinds = []string{"destroy_machine", "delete_node", "resize_machine", "uncordon_node", "detach_iso", "configure_network", "spec"}
)

func newMetrics() *metrics {
	m := &metrics{
		registry: prometheus.NewRegistry(),
		grpc: grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram(
			grpcprom.WithHistogramBuckets([]float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}))),
		operations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "clusterd_operations_total",
			Help: "Operations this server ran to their end, by verb and result (succeeded, failed, cancelled).",
		}, []string{"verb", "result"}),
		operationSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "clusterd_operation_duration_seconds",
			Help:    "How long operations this server ran took, from claim to end, by verb.",
			Buckets: []float64{.1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600},
		}, []string{"verb"}),
		claimsRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "clusterd_claims_refused_total",
			Help: "Mutations refused at their claim, by ErrorInfo reason (OPERATION_IN_PROGRESS, INVALID_STATE_TRANSITION, ...).",
		}, []string{"reason"}),
		recoveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "clusterd_recoveries_total",
			Help: "Recoveries the scanner started and won, by kind (orphan, destroy_retry, faults_detected, recover_alert, stop_alert).",
		}, []string{"kind"}),
		repairs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "clusterd_repairs_total",
			Help: "Leftovers of interrupted or failed operations this server repaired, by kind (the repair step, or spec).",
		}, []string{"kind"}),
	}
	for _, verb := range service.Verbs() {
		m.operationSeconds.WithLabelValues(verb)
		for _, result := range operationResults {
			m.operations.WithLabelValues(verb, result)
		}
	}
	for _, r := range refusalReasons {
		m.claimsRefused.WithLabelValues(r)
	}
	for _, k := range recoveryKinds {
		m.recoveries.WithLabelValues(k)
	}
	for _, k := range repairKinds {
		m.repairs.WithLabelValues(k)
	}
	info := version.Get()
	buildInfo := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "clusterd_build_info",
		Help:        "Always 1; its labels say which build runs.",
		ConstLabels: prometheus.Labels{"version": info.Version, "commit": info.Commit, "goversion": info.GoVersion},
	})
	buildInfo.Set(1)
	m.registry.MustRegister(m.grpc, m.operations, m.operationSeconds, m.claimsRefused, m.recoveries, m.repairs, buildInfo,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// watch registers the gauges read at scrape time: clusters per state from
// the database, the scanner's counters and pass durations, the pool, the
// database's lock conflicts.
func (m *metrics) watch(store *repository.Store, sc *scanner.Scanner, quotas *service.Quotas, log *slog.Logger) {
	m.registry.MustRegister(&stateCollector{store: store, log: log}, scannerCollector{sc}, poolCollector{store}, conflictCollector{store},
		&quotaCollector{store: store, quotas: quotas, log: log})
	if _, ok := store.BatchStats(); ok {
		m.registry.MustRegister(batchCollector{store})
	}
}

// jobDone counts a job this server ended, then calls next (the Operations
// service's wake-up of WaitOperation callers). It is the runner's OnDone.
func (m *metrics) jobDone(next func(repository.Job)) func(repository.Job) {
	return func(j repository.Job) {
		result := strings.ToLower(string(j.Status))
		m.operations.WithLabelValues(j.Kind, result).Inc()
		if j.EndTime != nil {
			m.operationSeconds.WithLabelValues(j.Kind).Observe(j.EndTime.Sub(j.CreateTime).Seconds())
		}
		if next != nil {
			next(j)
		}
	}
}

// mutations are the ClusterLifecycle methods that claim a cluster.
var mutations = func() map[string]bool {
	out := map[string]bool{}
	for _, m := range []string{"CreateCluster", "StartCluster", "StopCluster", "ScaleCluster", "UpgradeCluster", "AddNodes", "RemoveNodes", "DeleteCluster"} {
		out["/"+clv1.ClusterLifecycle_ServiceDesc.ServiceName+"/"+m] = true
	}
	return out
}()

// refusals counts the mutations refused at their claim. It sits outside the
// error mapping, so it reads the status the client receives.
func (m *metrics) refusals() grpc.UnaryServerInterceptor {
	known := map[string]bool{}
	for _, r := range refusalReasons {
		known[r] = true
	}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		if err != nil && mutations[info.FullMethod] {
			if r := errorReason(err); known[r] {
				m.claimsRefused.WithLabelValues(r).Inc()
			}
		}
		return resp, err
	}
}

// errorReason is the ErrorInfo reason of a status error.
func errorReason(err error) string {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}

// recoverer counts the scanner's recoveries whose claim won.
func (m *metrics) recoverer(r scanner.Recoverer) scanner.Recoverer {
	return countedRecoverer{Recoverer: r, m: m}
}

// countedRecoverer is a scanner.Recoverer that counts what succeeded.
type countedRecoverer struct {
	scanner.Recoverer
	m *metrics
}

func (r countedRecoverer) count(kind string, err error) error {
	if err == nil {
		r.m.recoveries.WithLabelValues(kind).Inc()
	}
	return err
}

// RecoverOrphan counts an orphan taken over (a DESTROYING cluster's destroy
// retried counts as destroy_retry).
func (r countedRecoverer) RecoverOrphan(ctx context.Context, c repository.Cluster, orphan repository.Job, reason string) error {
	kind := "orphan"
	if ev, _ := lifecycle.OrphanEvent(c.State); ev == lifecycle.DestroyRequested {
		kind = "destroy_retry"
	}
	return r.count(kind, r.Recoverer.RecoverOrphan(ctx, c, orphan, reason))
}

// RetryDestroy counts a failed destroy retried.
func (r countedRecoverer) RetryDestroy(ctx context.Context, c repository.Cluster, reason string) error {
	return r.count("destroy_retry", r.Recoverer.RetryDestroy(ctx, c, reason))
}

// MarkFaulty counts a cluster moved to ALERT by reconciliation.
func (r countedRecoverer) MarkFaulty(ctx context.Context, c repository.Cluster, reason string) error {
	return r.count("faults_detected", r.Recoverer.MarkFaulty(ctx, c, reason))
}

// RecoverAlert counts an ALERT cluster brought back.
func (r countedRecoverer) RecoverAlert(ctx context.Context, c repository.Cluster) error {
	return r.count("recover_alert", r.Recoverer.RecoverAlert(ctx, c))
}

// StopAlert counts an ALERT cluster whose machines are all off, stopped.
func (r countedRecoverer) StopAlert(ctx context.Context, c repository.Cluster) error {
	return r.count("stop_alert", r.Recoverer.StopAlert(ctx, c))
}

// repairStore counts the repairs the service records in a cluster's history.
func (m *metrics) repairStore(s service.Store) service.Store {
	return repairStore{Store: s, m: m}
}

// repairStore is a service.Store that counts REPAIR entries.
type repairStore struct {
	service.Store
	m *metrics
}

// RecordEvent writes the entry; a REPAIR is counted whether or not its
// history entry could be written, since the repair itself was done.
func (s repairStore) RecordEvent(ctx context.Context, e repository.Event) error {
	if e.Name == repository.Repair {
		s.m.repairs.WithLabelValues(repairKind(e.Message)).Inc()
	}
	return s.Store.RecordEvent(ctx, e)
}

// repairKind reads the kind of a repair from its message, which starts
// with the step ("detach_iso: ..."); an unknown one is "other".
func repairKind(msg string) string {
	kind, _, _ := strings.Cut(msg, ":")
	for _, k := range repairKinds {
		if k == kind {
			return k
		}
	}
	return "other"
}

// stateCollector reads clusters per state from the database at each scrape.
type stateCollector struct {
	store *repository.Store
	log   *slog.Logger
}

var clustersDesc = prometheus.NewDesc("clusterd_clusters", "Clusters per state, in the database (every account, every server's).", []string{"state"}, nil)

// Describe names the one metric.
func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) { ch <- clustersDesc }

// Collect counts with a bounded query; a failure leaves the metric out of
// this scrape (the others are still served) and is reported to Prometheus.
func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	counts, err := c.store.CountClusters(ctx)
	if err != nil {
		c.log.Warn("metrics: cannot count clusters", "error", err)
		ch <- prometheus.NewInvalidMetric(clustersDesc, err)
		return
	}
	for _, st := range lifecycle.States() {
		ch <- prometheus.MustNewConstMetric(clustersDesc, prometheus.GaugeValue, float64(counts[st]), st.String())
	}
}

// quotaCollector reads every account's quota usage and limits at each
// scrape (one pass over the live clusters).
type quotaCollector struct {
	store  *repository.Store
	quotas *service.Quotas
	log    *slog.Logger
}

var (
	quotaUsageDesc = prometheus.NewDesc("clusterd_quota_usage",
		"What an account's clusters hold or are about to hold, per resource (clusters, nodes, cpus, memory_bytes).", []string{"account", "resource"}, nil)
	quotaLimitDesc = prometheus.NewDesc("clusterd_quota_limit",
		"An account's limit per resource (clusters, nodes, cpus, memory_bytes); absent when unlimited.", []string{"account", "resource"}, nil)
)

// Describe names the two metrics.
func (c *quotaCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- quotaUsageDesc
	ch <- quotaLimitDesc
}

// Collect reports usage and limits of every account with clusters or
// limits of its own; a failure leaves them out of this scrape.
func (c *quotaCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	qs, err := c.store.ListQuotas(ctx, c.quotas.Check())
	if err != nil {
		c.log.Warn("metrics: cannot read quotas", "error", err)
		ch <- prometheus.NewInvalidMetric(quotaUsageDesc, err)
		return
	}
	const mib = 1 << 20
	for _, q := range qs {
		for _, r := range []struct {
			name  string
			usage int64
			limit *int64
			scale float64
		}{
			{"clusters", q.Usage.Clusters, q.Limits.Clusters, 1},
			{"nodes", q.Usage.Nodes, q.Limits.Nodes, 1},
			{"cpus", q.Usage.CPUs, q.Limits.CPUs, 1},
			{"memory_bytes", q.Usage.MemoryMB, q.Limits.MemoryMB, mib},
		} {
			ch <- prometheus.MustNewConstMetric(quotaUsageDesc, prometheus.GaugeValue, float64(r.usage)*r.scale, q.Account, r.name)
			if r.limit != nil {
				ch <- prometheus.MustNewConstMetric(quotaLimitDesc, prometheus.GaugeValue, float64(*r.limit)*r.scale, q.Account, r.name)
			}
		}
	}
}

// scannerCollector exports the scanner's own counters (scanner.Metrics).
type scannerCollector struct{ sc *scanner.Scanner }

func scannerCounter(name, help string) *prometheus.Desc {
	return prometheus.NewDesc("clusterd_scanner_"+name+"_total", help, nil, nil)
}

var (
	scanPassDesc = prometheus.NewDesc("clusterd_scan_pass_duration_seconds",
		"How long the scanner's passes (liveness, orphan recovery, and when due reconciliation and GC) took.", nil, nil)
	scanLastPassDesc = prometheus.NewDesc("clusterd_scanner_last_pass_seconds", "How long the scanner's last pass took.", nil, nil)
	scanPasses       = scannerCounter("passes", "Scanner passes run (not those skipped without a lease).")
	scanJobsFailed   = scannerCounter("jobs_failed", "Jobs of dead servers, earlier incarnations or lost by this one that the scanner failed.")
	scanJobsAdopted  = scannerCounter("jobs_adopted", "Jobs of dead servers, earlier incarnations or handed off that this server adopted and runs on.")
	scanRecovered    = scannerCounter("recovered", "Recovery and reconciliation actions whose compare-and-set won.")
	scanLostRaces    = scannerCounter("lost_races", "Scanner actions another server or a user won first (normal).")
	scanPurged       = scannerCounter("purged", "Finished jobs deleted after the retention period.")
	scanErrors       = scannerCounter("errors", "Errors scanner passes met (they go on past them).")
)

// Describe lists the scanner's metrics.
func (c scannerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{scanPassDesc, scanLastPassDesc, scanPasses, scanJobsFailed, scanJobsAdopted, scanRecovered, scanLostRaces, scanPurged, scanErrors} {
		ch <- d
	}
}

// Collect snapshots scanner.Metrics.
func (c scannerCollector) Collect(ch chan<- prometheus.Metric) {
	m := c.sc.Metrics()
	counter := func(d *prometheus.Desc, v int64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
	counter(scanPasses, m.Passes)
	counter(scanJobsFailed, m.JobsFailed)
	counter(scanJobsAdopted, m.Adopted)
	counter(scanRecovered, m.Recovered)
	counter(scanLostRaces, m.LostRaces)
	counter(scanPurged, m.Purged)
	counter(scanErrors, m.Errors)
	ch <- prometheus.MustNewConstMetric(scanLastPassDesc, prometheus.GaugeValue, m.LastPass.Seconds())
	buckets := make(map[float64]uint64, len(scanner.PassBuckets))
	count := uint64(m.Passes)
	for i, bound := range scanner.PassBuckets {
		buckets[bound.Seconds()] = uint64(m.PassesWithin[i])
		// The counters are read one by one while a pass may be recorded:
		// never report fewer passes than a bucket holds.
		count = max(count, uint64(m.PassesWithin[i]))
	}
	ch <- prometheus.MustNewConstHistogram(scanPassDesc, count, m.PassTotal.Seconds(), buckets)
}

// poolCollector exports database/sql's pool statistics under the names of
// client_golang's DBStats collector (go_sql_*), without handing out the
// *sql.DB that only the repository may hold.
type poolCollector struct{ store *repository.Store }

func poolDesc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc("go_sql_"+name, help, nil, prometheus.Labels{"db_name": "clusterd"})
}

var (
	poolMaxOpen      = poolDesc("max_open_connections", "Maximum number of open connections to the database.")
	poolOpen         = poolDesc("open_connections", "The number of established connections both in use and idle.")
	poolInUse        = poolDesc("in_use_connections", "The number of connections currently in use.")
	poolIdle         = poolDesc("idle_connections", "The number of idle connections.")
	poolWaitCount    = poolDesc("wait_count_total", "The total number of connections waited for.")
	poolWaitDuration = poolDesc("wait_duration_seconds_total", "The total time blocked waiting for a new connection.")
	poolIdleClosed   = poolDesc("max_idle_closed_total", "The total number of connections closed due to SetMaxIdleConns.")
	poolIdleTime     = poolDesc("max_idle_time_closed_total", "The total number of connections closed due to SetConnMaxIdleTime.")
	poolLifetime     = poolDesc("max_lifetime_closed_total", "The total number of connections closed due to SetConnMaxLifetime.")
)

// Describe lists the pool's metrics.
func (c poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{poolMaxOpen, poolOpen, poolInUse, poolIdle, poolWaitCount, poolWaitDuration, poolIdleClosed, poolIdleTime, poolLifetime} {
		ch <- d
	}
}

// Collect reads repository.Store.PoolStats.
func (c poolCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.store.PoolStats()
	gauge := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	counter := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v)
	}
	gauge(poolMaxOpen, float64(st.MaxOpenConnections))
	gauge(poolOpen, float64(st.OpenConnections))
	gauge(poolInUse, float64(st.InUse))
	gauge(poolIdle, float64(st.Idle))
	counter(poolWaitCount, float64(st.WaitCount))
	counter(poolWaitDuration, st.WaitDuration.Seconds())
	counter(poolIdleClosed, float64(st.MaxIdleClosed))
	counter(poolIdleTime, float64(st.MaxIdleTimeClosed))
	counter(poolLifetime, float64(st.MaxLifetimeClosed))
}

// batchCollector exports the SQLite writer's group commit counters
// (repository.BatchStats).
type batchCollector struct{ store *repository.Store }

var (
	batchesDesc = prometheus.NewDesc("clusterd_sqlite_write_batches_total",
		"Transactions the SQLite writer ran for writes queued together (group commit).", nil, nil)
	batchedDesc = prometheus.NewDesc("clusterd_sqlite_batched_writes_total",
		"Writes (claims, steps, ends) taken into those transactions; divided by the batches, the mean batch size.", nil, nil)
	undoneDesc = prometheus.NewDesc("clusterd_sqlite_batched_writes_undone_total",
		"Writes a batch rolled back for another write's failure (each run again) or a failed commit (run again when it was a lock conflict).", nil, nil)
)

// Describe lists the batch metrics.
func (c batchCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- batchesDesc
	ch <- batchedDesc
	ch <- undoneDesc
}

// Collect reads repository.Store.BatchStats.
func (c batchCollector) Collect(ch chan<- prometheus.Metric) {
	st, _ := c.store.BatchStats()
	ch <- prometheus.MustNewConstMetric(batchesDesc, prometheus.CounterValue, float64(st.Batches))
	ch <- prometheus.MustNewConstMetric(batchedDesc, prometheus.CounterValue, float64(st.Writes))
	ch <- prometheus.MustNewConstMetric(undoneDesc, prometheus.CounterValue, float64(st.Undone))
}

// metricsHandler serves the registry in Prometheus' text (or OpenMetrics)
// format, to admins only (requireAdmin): the metrics count every account's
// clusters and operations. A collector that fails leaves its metric out
// and the rest is still served.
func (s *Server) metricsHandler(mux *runtime.ServeMux) runtime.HandlerFunc {
	h := promhttp.HandlerFor(s.metrics.registry, promhttp.HandlerOpts{
		ErrorHandling: promhttp.ContinueOnError,
		ErrorLog:      promLogger{s.log},
	})
	return func(w http.ResponseWriter, r *http.Request, _ map[string]string) {
		if err := s.requireAdmin(r); err != nil {
			writeError(mux, w, r, 0, err)
			return
		}
		h.ServeHTTP(w, r)
	}
}

// promLogger passes promhttp's errors to the server's log.
type promLogger struct{ log *slog.Logger }

// Println logs one error of a scrape.
func (l promLogger) Println(v ...any) {
	l.log.Warn("metrics: " + strings.TrimSpace(fmt.Sprintln(v...)))
}

// conflictCollector exports repository.Store.LockConflicts: the attempts
// at a write that lost a lock (a deadlock, Galera's certification failure,
// a lock wait timeout, SQLite's busy snapshot), and the writes given up.
type conflictCollector struct{ store *repository.Store }

var (
	conflictsDesc = prometheus.NewDesc("clusterd_database_lock_conflicts_total",
		"Attempts at a database write that lost a lock and were rolled back (then run again, or the write given up), by kind (deadlock, which counts Galera's certification failures; lock_wait_timeout; busy_snapshot on SQLite).",
		[]string{"kind"}, nil)
	conflictsGaveUpDesc = prometheus.NewDesc("clusterd_database_writes_given_up_total",
		"Writes that failed after losing a lock: every attempt lost one (the caller got UNAVAILABLE, or the job's step failed or waited), or the caller's deadline came before or during the next attempt. On SQLite, also writes whose every group commit was rolled back for others' failures.", nil, nil)
)

// Describe lists the lock conflict counters.
func (conflictCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- conflictsDesc
	ch <- conflictsGaveUpDesc
}

// Collect reads repository.Store.LockConflicts.
func (c conflictCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.store.LockConflicts()
	for kind, v := range map[string]uint64{"deadlock": st.Deadlocks, "lock_wait_timeout": st.LockWaitTimeouts, "busy_snapshot": st.Snapshots} {
		ch <- prometheus.MustNewConstMetric(conflictsDesc, prometheus.CounterValue, float64(v), kind)
	}
	ch <- prometheus.MustNewConstMetric(conflictsGaveUpDesc, prometheus.CounterValue, float64(st.GaveUp))
}
