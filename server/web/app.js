// clusterd's web view: the clusters with their state and current operation,
// per cluster its nodes, the timeline of who held it when and its actions
// (start, stop, scale, cancel the running operation, each confirmed first),
// and the operations with their errors. It calls the REST API (/v1/...)
// with the bearer token the viewer typed (kept in sessionStorage, so it
// ends with the tab) or with nothing in development mode. It redraws as the
// watch stream (GET /v1/clusters:watch) tells of changes, or every second
// while that stream is down, while the page is visible and no confirmation
// is open.
'use strict';

const TOKEN_KEY = 'clusterd.token';
const REFRESH_MS = 1000;
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

// ApiError is a refused or failed API call, with the google.rpc.Status the
// server answered (its ErrorInfo reason says why).
class ApiError extends Error {
  constructor(status, body) {
    super((body && body.message) || ('HTTP ' + status));
    this.status = status;
    const info = ((body && body.details) || []).find((d) => d['@type'] === 'type.googleapis.com/google.rpc.ErrorInfo');
    this.reason = info ? info.reason : '';
  }
}

async function api(path, payload) {
  const headers = { Accept: 'application/json' };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = 'Bearer ' + token;
  const init = { headers, cache: 'no-store' };
  if (payload !== undefined) {
    init.method = 'POST';
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(payload);
  }
  const resp = await fetch(path, init);
  const body = await resp.json().catch(() => ({}));
  if (!resp.ok) throw new ApiError(resp.status, body);
  return body;
}

// all reads every page of a list (bounded: 100 pages of 1000).
async function all(path, field) {
  let out = [];
  let token = '';
  for (let i = 0; i < 100; i++) {
    const sep = path.includes('?') ? '&' : '?';
    const body = await api(path + sep + 'pageSize=1000' + (token ? '&pageToken=' + encodeURIComponent(token) : ''));
    out = out.concat(body[field] || []);
    token = body.nextPageToken;
    if (!token) break;
  }
  return out;
}

// el builds an element; strings become text nodes (never HTML).
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') e.className = v;
    else if (k === 'style') e.style.cssText = v;
    else e.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

const pad = (n, w = 2) => String(n).padStart(w, '0');

function clock(t) {
  if (!t) return '';
  const d = new Date(t);
  return pad(d.getHours()) + ':' + pad(d.getMinutes()) + ':' + pad(d.getSeconds()) + '.' + pad(d.getMilliseconds(), 3);
}

function when(t) {
  if (!t) return '';
  const d = new Date(t);
  return d.getFullYear() + '-' + pad(d.getMonth() + 1) + '-' + pad(d.getDate()) + ' ' + clock(t);
}

function duration(ms) {
  if (ms < 1000) return Math.max(0, Math.round(ms)) + ' ms';
  if (ms < 60000) return (ms / 1000).toFixed(1) + ' s';
  return Math.floor(ms / 60000) + ' min ' + Math.round((ms % 60000) / 1000) + ' s';
}

const idOf = (name) => (name || '').split('/').pop();

// EVENT_LABELS says in words what each history entry means; the entry's
// own name stays in its title and data-event.
const EVENT_LABELS = {
  CLUSTER_CREATED: 'cluster created',
  START_REQUESTED: 'start requested',
  STOP_REQUESTED: 'stop requested',
  DESTROY_REQUESTED: 'delete requested',
  RECOVERY_REQUESTED: 'recovery started',
  AUTOSCALE_REQUESTED: 'autoscaler change requested',
  SCALE_UP_REQUESTED: 'scale up requested',
  SCALE_DOWN_REQUESTED: 'scale down requested',
  ADD_NODE_REQUESTED: 'adding nodes requested',
  REMOVE_NODE_REQUESTED: 'removing nodes requested',
  UPGRADE_REQUESTED: 'upgrade requested',
  OPERATION_SUCCEEDED: 'operation succeeded',
  OPERATION_FAILED: 'operation failed',
  CREATE_FAILED: 'create failed',
  FAULTS_DETECTED: 'reconciliation found faults',
  RECOVERY_STARTED: 'recovery took over an interrupted operation',
  REPAIR: 'repair',
  ORPHAN_MACHINE_REMOVED: 'left-over machine removed',
  OPERATION_ADOPTED: 'operation adopted by a live server',
  OPERATION_HANDED_OFF: 'operation handed off by a stopping server',
};

function eventLabel(name) {
  return EVENT_LABELS[name] || String(name || '').toLowerCase().replace(/_/g, ' ');
}

// verbLabel is an operation's verb in words (add_nodes: add nodes).
const verbLabel = (verb) => String(verb || '').replace(/_/g, ' ');

function stateBadge(state) {
  return el('span', { class: 'state ' + state }, state);
}

// progress shows an operation's verb (unless withVerb is false), step and
// steps done of total.
function progress(op, withVerb = true) {
  const md = (op && op.metadata) || {};
  const done = md.stepsDone || 0;
  const total = md.stepsTotal || 0;
  const pct = total > 0 ? Math.min(100, Math.round((100 * done) / total)) : 0;
  return el('div', { class: 'op', 'data-operation': op.name },
    withVerb ? el('span', { class: 'verb' }, verbLabel(md.verb) || 'operation') : null,
    el('div', { class: 'bar', role: 'progressbar', 'aria-valuemin': 0, 'aria-valuemax': total, 'aria-valuenow': done, title: pct + '%' },
      el('span', { style: 'width:' + pct + '%' })),
    el('span', { class: 'step' }, (md.step || 'starting') + ' · ' + done + '/' + total + ' steps'),
    md.requestedCancellation ? el('span', { class: 'muted' }, 'cancelling') : null);
}

// quotas reads every account's quota for an admin (ListQuotas), or, for a
// user (who may read only its own), the quotas of the accounts of the
// clusters it sees.
async function quotas(clusters) {
  try {
    return await all('/v1/quotas', 'quotas');
  } catch (err) {
    if (err.status !== 403) throw err;
  }
  const accounts = [...new Set(clusters.map((c) => c.account))].sort();
  return Promise.all(accounts.map((a) => api('/v1/accounts/' + encodeURIComponent(a) + '/quota')));
}

// quotaTable shows usage against limit per account (∞: unlimited).
function quotaTable(list) {
  if (list.length === 0) return null;
  const cell = (q, field, unit) => {
    const used = Number((q.usage || {})[field] || 0);
    const lim = (q.limits || {})[field];
    const over = lim !== undefined && lim !== null && used >= Number(lim);
    return el('td', { class: over ? 'full' : '' }, used + ' / ' + (lim === undefined || lim === null ? '∞' : lim) + (unit || ''));
  };
  return [
    el('h2', {}, 'Quotas'),
    el('table', { id: 'quotas' },
      el('thead', {}, el('tr', {}, ['Account', 'Clusters', 'Nodes', 'vCPUs', 'Memory (MiB)', 'Limits'].map((h) => el('th', {}, h)))),
      el('tbody', {}, list.map((q) => el('tr', { 'data-quota': q.name },
        el('td', {}, q.name.replace(/^accounts\//, '').replace(/\/quota$/, '')),
        cell(q, 'clusters'), cell(q, 'nodes'), cell(q, 'cpus'), cell(q, 'memoryMb'),
        el('td', { class: 'muted' }, q.explicit ? 'set by an admin' : 'default'))))),
  ];
}

async function listView() {
  const [clusters, running] = await Promise.all([
    all('/v1/clusters', 'clusters'),
    all('/v1/operations?filter=' + encodeURIComponent('done = false'), 'operations'),
  ]);
  const quota = quotaTable(await quotas(clusters));
  const ops = Object.fromEntries(running.map((op) => [op.name, op]));
  const rows = clusters.map((c) => {
    const id = idOf(c.name);
    const nodes = c.nodes || [];
    const up = nodes.filter((n) => n.power === 'RUNNING').length;
    let op = '';
    if (c.currentOperation) {
      op = ops[c.currentOperation] ? progress(ops[c.currentOperation]) : el('span', { class: 'mono' }, c.currentOperation);
    }
    return el('tr', { 'data-cluster': c.name },
      el('td', {}, UUID.test(id) ? el('a', { href: '#/clusters/' + id, class: 'name' }, c.displayName) : c.displayName,
        el('div', { class: 'mono muted' }, c.name)),
      el('td', {}, c.account),
      el('td', {}, stateBadge(c.state), c.statusMessage ? el('div', { class: 'muted status' }, c.statusMessage) : ''),
      el('td', {}, c.kubernetesVersion),
      el('td', {}, (c.controlNodeCount || 0) + ' + ' + (c.workerNodeCount || 0),
        el('div', { class: 'muted' }, up + ' of ' + nodes.length + ' running'),
        desired(c, ops[c.currentOperation])),
      el('td', { class: 'current' }, op),
      el('td', { class: 'muted' }, when(c.updateTime)));
  });
  return [
    el('h1', {}, 'Clusters ', el('span', { class: 'muted' }, '(' + clusters.length + ')')),
    clusters.length === 0 ? el('p', { class: 'muted' }, 'No clusters yet: clusterctl create NAME --wait') :
      el('table', { id: 'clusters' },
        el('thead', {}, el('tr', {}, ['Cluster', 'Account', 'State', 'Kubernetes', 'Nodes (control + workers)', 'Current operation', 'Updated']
          .map((h) => el('th', {}, h)))),
        el('tbody', {}, rows)),
    quota,
  ].flat();
}

// desired says, while an operation changes how many workers the cluster
// has, the count it leads to against the worker machines there are now
// (and how many of them run and have joined); null otherwise.
function desired(c, op) {
  const md = (op && !op.done && op.metadata) || {};
  const target = md.targetWorkerNodeCount || 0;
  if (!target) return null;
  const workers = (c.nodes || []).filter((n) => n.role === 'WORKER');
  const ready = workers.filter((n) => n.power === 'RUNNING' && n.joined).length;
  return el('div', { class: 'desired', 'data-desired': target, 'data-actual': workers.length, 'data-ready': ready },
    verbLabel(md.verb) + ' to ' + target + ' workers: ' + workers.length + ' worker machines now, ' + ready + ' running and joined');
}

// spans groups a cluster's history into who held it: consecutive events of
// one operation are one span, from its first entry to its last (to now
// while it runs). Events written by no operation (reconciliation's
// FAULTS_DETECTED) are spans of their own, held by the scanner.
function spans(events, opsByName, current) {
  const out = [];
  for (const e of events) {
    let s = out[out.length - 1];
    if (!s || !e.operation || s.operation !== e.operation) {
      s = { operation: e.operation || '', events: [], servers: [], start: e.time, end: e.time };
      out.push(s);
    }
    s.events.push(e);
    s.end = e.time;
    if (e.server && !s.servers.includes(e.server)) s.servers.push(e.server);
  }
  for (const s of out) {
    const op = opsByName[s.operation];
    const md = (op && op.metadata) || {};
    if (md.server && !s.servers.includes(md.server)) s.servers.push(md.server);
    s.op = op;
    s.recovery = md.verb === 'recover' || s.events.some((e) => e.event === 'RECOVERY_STARTED');
    s.verb = md.verb || (s.recovery ? 'recover' : s.operation ? 'operation' : 'scanner');
    s.repairs = s.events.filter((e) => e.event === 'REPAIR').length;
    // An operation adopted after its server stopped or died: one span, its
    // servers listed in turn.
    s.adoptions = s.events.filter((e) => e.event === 'OPERATION_ADOPTED').length;
    s.running = s.operation !== '' && (s.operation === current || (op && !op.done));
    if (s.running) s.result = 'running';
    else if (op && op.error) s.result = op.error.code === 1 ? 'cancelled' : 'failed';
    else if (op) s.result = 'succeeded';
    else s.result = '';
  }
  return out;
}

function lane(list) {
  if (list.length === 0) return null;
  const now = Date.now();
  const t0 = Date.parse(list[0].start);
  const t1 = Math.max(now, ...list.map((s) => Date.parse(s.end)));
  const range = Math.max(1, t1 - t0);
  return el('div', { class: 'lane', title: 'who held the cluster, from its creation to now' },
    list.map((s) => {
      const a = Date.parse(s.start);
      const b = s.running ? now : Date.parse(s.end);
      const left = (100 * (a - t0)) / range;
      const width = Math.max(0.6, (100 * (b - a)) / range);
      return el('div', { class: 'kind-' + s.verb + (s.running ? ' running' : ''), style: `left:${left}%;width:${width}%`,
        title: verbLabel(s.verb) + ' ' + s.operation + ' ' + clock(s.start) + ' → ' + (s.running ? 'now' : clock(s.end)) },
      verbLabel(s.verb));
    }));
}

function timeline(list) {
  return el('ol', { class: 'timeline', id: 'timeline' }, list.map((s) => {
    const end = s.running ? Date.now() : Date.parse(s.end);
    return el('li', { class: 'span kind-' + s.verb, 'data-operation': s.operation, 'data-result': s.result },
      el('div', { class: 'span-head' },
        el('span', { class: 'verb', 'data-verb': s.verb }, verbLabel(s.verb)),
        s.result ? el('span', { class: 'result ' + s.result }, s.result) : null,
        s.recovery ? el('span', { class: 'mark recovery' }, 'recovery') : null,
        s.repairs ? el('span', { class: 'mark repair' }, s.repairs === 1 ? '1 repair' : s.repairs + ' repairs') : null,
        s.adoptions ? el('span', { class: 'mark adopted' }, s.adoptions === 1 ? 'adopted' : 'adopted ' + s.adoptions + '×') : null,
        s.running && end - Date.parse(s.start) > LONG_MS ? el('span', { class: 'mark long', title: 'held the cluster for more than ' + duration(LONG_MS) }, 'held for long') : null,
        el('span', { class: 'holder' }, s.operation ? 'held by ' : 'by the scanner', s.operation ? el('span', { class: 'mono' }, s.operation) : null,
          s.servers.length ? ' on server ' + s.servers.join(', ') : ''),
        el('span', { class: 'muted' }, clock(s.start) + ' → ' + (s.running ? 'now' : clock(s.end)) + ' (' + duration(end - Date.parse(s.start)) + ')')),
      s.running && s.op ? progress(s.op, false) : null,
      s.op && s.op.error ? el('div', { class: 'muted' }, 'error: ' + s.op.error.message) : null,
      el('ul', { class: 'events' }, s.events.map((e) => el('li', { class: e.event === 'REPAIR' ? 'repair' : '' },
        el('span', { class: 'mono' }, clock(e.time)), ' ',
        el('b', { 'data-event': e.event, title: e.event }, eventLabel(e.event)), ' ',
        e.fromState === e.toState ? e.toState : (e.fromState === 'STATE_UNSPECIFIED' ? '' : e.fromState + ' → ') + e.toState,
        e.message ? el('span', { class: 'muted' }, ' — ' + e.message) : null))));
  }));
}

// pending is the action waiting for its confirmation ({what, cluster, kind,
// run}); while it is open the page does not redraw under the person.
// notice is what the last action did, shown until the next one.
let pending = null;
let notice = null;

function button(attrs, text, onClick) {
  const b = el('button', Object.assign({ type: 'button' }, attrs), text);
  b.addEventListener('click', onClick);
  return b;
}

function ask(action) {
  pending = action;
  notice = null;
  refresh();
}

async function confirmPending() {
  const action = pending;
  if (!action) return;
  const input = document.getElementById('scale-workers');
  try {
    const op = await action.run(input ? Number(input.value) : undefined);
    notice = { cluster: action.cluster, text: action.done + (op && op.name ? ': ' + op.name : '') };
  } catch (err) {
    notice = { cluster: action.cluster, text: action.what + ' was refused: ' + (err.reason ? err.reason + ': ' : '') + err.message, bad: true };
  }
  pending = null;
  refresh();
}

// actions are what the cluster's owner can ask of it from its page: cancel
// the running operation, or start, stop or scale it. The server decides
// (its refusals are shown); each asks for a confirmation first, and sends
// the etag of the cluster shown, so it acts only on what the person saw.
function actions(c, current) {
  const name = c.name;
  const post = (suffix, body) => api('/v1/' + name + ':' + suffix, Object.assign({ requestId: crypto.randomUUID(), etag: c.etag }, body));
  const list = [];
  if (c.currentOperation) {
    const what = 'Cancel ' + (current && current.metadata ? current.metadata.verb + ' ' : '') + c.currentOperation;
    list.push(button({ id: 'action-cancel', class: 'action' }, 'Cancel operation', () => ask({
      cluster: name, kind: 'cancel', what, done: 'cancellation requested',
      run: () => api('/v1/' + c.currentOperation + ':cancel', {}),
    })));
  } else {
    list.push(button({ id: 'action-start', class: 'action' }, 'Start', () => ask({
      cluster: name, kind: 'start', what: 'Start ' + c.displayName, done: 'start requested', run: () => post('start', {}),
    })));
    list.push(button({ id: 'action-stop', class: 'action' }, 'Stop', () => ask({
      cluster: name, kind: 'stop', what: 'Stop ' + c.displayName + ' (its machines are powered off)', done: 'stop requested',
      run: () => post('stop', {}),
    })));
    list.push(button({ id: 'action-scale', class: 'action' }, 'Scale…', () => ask({
      cluster: name, kind: 'scale', what: 'Scale ' + c.displayName + ' to this many workers', done: 'scale requested',
      workers: c.workerNodeCount || 0, run: (n) => post('scale', { workerNodeCount: n }),
    })));
  }
  const box = [];
  if (pending && pending.cluster === name) {
    box.push(el('div', { class: 'confirm', id: 'confirm', role: 'dialog', 'aria-label': 'confirm ' + pending.kind },
      el('p', {}, pending.what + '?'),
      pending.kind === 'scale' ? el('p', {}, el('label', { for: 'scale-workers' }, 'Workers '),
        el('input', { id: 'scale-workers', type: 'number', min: 0, value: pending.workers })) : null,
      button({ id: 'confirm-yes', class: 'action danger' }, 'Confirm', confirmPending),
      ' ',
      button({ id: 'confirm-no', class: 'action' }, 'Keep as is', () => { pending = null; refresh(); })));
  }
  if (notice && notice.cluster === name) {
    box.push(el('p', { id: 'notice', class: notice.bad ? 'notice bad' : 'notice' }, notice.text));
  }
  return el('div', { class: 'actions', id: 'actions' }, list, box);
}

async function clusterView(id) {
  const name = 'clusters/' + id;
  const [c, events, ops] = await Promise.all([
    api('/v1/' + name),
    all('/v1/' + name + '/events', 'events'),
    all('/v1/operations?filter=' + encodeURIComponent('cluster = "' + name + '"'), 'operations'),
  ]);
  const opsByName = Object.fromEntries(ops.map((op) => [op.name, op]));
  const list = spans(events, opsByName, c.currentOperation);
  const current = c.currentOperation ? opsByName[c.currentOperation] : null;
  const card = (k, ...v) => el('div', { class: 'card' }, el('div', { class: 'k' }, k), el('div', { class: 'v' }, ...v));
  return [
    el('p', {}, el('a', { href: '#/' }, '← all clusters')),
    el('h1', { id: 'cluster' }, c.displayName, ' ', stateBadge(c.state)),
    c.statusMessage || c.nextStep ? el('div', { class: 'status-box', id: 'status' },
      c.statusMessage ? el('p', {}, el('strong', {}, 'Why: '), c.statusMessage,
        c.statusTime ? el('span', { class: 'muted' }, ' (' + when(c.statusTime) + ')') : '') : '',
      c.nextStep ? el('p', {}, el('strong', {}, 'Next step: '), c.nextStep) : '') : '',
    actions(c, current),
    el('div', { class: 'cards' },
      card('Name', el('span', { class: 'mono' }, c.name)),
      card('Account', c.account),
      card('Kubernetes', c.kubernetesVersion),
      card('Size', (c.controlNodeCount || 0) + ' control + ' + (c.workerNodeCount || 0) + ' workers, ' + c.serviceOffering,
        desired(c, current)),
      card('Endpoint', c.endpoint || '—'),
      el('div', { class: 'card wide' }, el('div', { class: 'k' }, 'Current operation'),
        el('div', { class: 'v' }, current ? progress(current) : (c.currentOperation || 'none')))),
    el('h2', {}, 'Nodes'),
    (c.nodes || []).length === 0 ? el('p', { class: 'muted' }, 'No nodes.') :
      el('table', { id: 'nodes' },
        el('thead', {}, el('tr', {}, ['Node', 'Machine', 'Role', 'Power', 'Joined', 'Kubernetes'].map((h) => el('th', {}, h)))),
        el('tbody', {}, c.nodes.map((n) => el('tr', { 'data-machine': n.name },
          el('td', { class: 'node-name' }, n.displayName || ''), el('td', { class: 'mono muted' }, n.name), el('td', {}, n.role), el('td', {}, n.power),
          el('td', {}, n.joined ? 'yes' : 'no'), el('td', {}, n.kubernetesVersion))))),
    el('h2', {}, 'Timeline: who held the cluster when'),
    lane(list),
    timeline(list.slice().reverse()),
  ];
}

// opResult is an operation's outcome as the operations page filters it.
function opResult(op) {
  if (!op.done) return 'running';
  if (op.error) return op.error.code === 1 ? 'cancelled' : 'failed';
  return 'succeeded';
}

const RESULT_ORDER = { failed: 0, running: 1, cancelled: 2, succeeded: 3 };
const VERBS = ['create', 'start', 'stop', 'scale', 'upgrade', 'add_nodes', 'remove_nodes', 'delete', 'recover'];
// LONG_MS marks a running operation that has held its cluster this long.
const LONG_MS = 10 * 60 * 1000;

function errorReason(err) {
  const info = (err.details || []).find((d) => d['@type'] === 'type.googleapis.com/google.rpc.ErrorInfo');
  return info ? info.reason : '';
}

// operationsView lists the operations the viewer may read, failed first
// (then running, cancelled, succeeded; newest first within each), filtered
// by the hash's state, verb, cluster and account, with each failure's whole
// error.
async function operationsView(filter) {
  const [ops, clusters] = await Promise.all([all('/v1/operations', 'operations'), all('/v1/clusters', 'clusters')]);
  const byName = Object.fromEntries(clusters.map((c) => [c.name, c]));
  const accounts = [...new Set(clusters.map((c) => c.account))].sort();
  const rows = ops.map((op) => {
    const md = op.metadata || {};
    const c = byName[md.cluster] || {};
    return { op, md, cluster: c, result: opResult(op), account: c.account || '', start: Date.parse(md.createTime || 0) || 0 };
  }).filter((r) => (!filter.state || r.result === filter.state) && (!filter.verb || r.md.verb === filter.verb) &&
    (!filter.cluster || r.md.cluster === filter.cluster || r.cluster.displayName === filter.cluster) &&
    (!filter.account || r.account === filter.account));
  rows.sort((a, b) => (RESULT_ORDER[a.result] - RESULT_ORDER[b.result]) || (b.start - a.start));
  const select = (key, label, values) => {
    const sel = el('select', { id: 'filter-' + key, 'aria-label': label },
      el('option', { value: '' }, 'any ' + label), values.map((v) => el('option', { value: v, selected: filter[key] === v }, v)));
    sel.addEventListener('change', () => setFilter(key, sel.value));
    return sel;
  };
  const clusterNames = [...new Set(ops.map((op) => (op.metadata || {}).cluster).filter(Boolean))]
    .map((n) => (byName[n] && byName[n].displayName) || n).sort();
  const now = Date.now();
  return [
    el('h1', {}, 'Operations ', el('span', { class: 'muted' }, '(' + rows.length + ' of ' + ops.length + ')')),
    el('div', { class: 'filters', id: 'filters' },
      select('state', 'state', ['failed', 'running', 'cancelled', 'succeeded']), ' ',
      select('verb', 'verb', VERBS), ' ',
      select('cluster', 'cluster', clusterNames), ' ',
      select('account', 'account', accounts)),
    rows.length === 0 ? el('p', { class: 'muted' }, 'No operations match.') :
      el('table', { id: 'operations' },
        el('thead', {}, el('tr', {}, ['Operation', 'Cluster', 'Account', 'Result', 'Started', 'Took', 'Error or progress'].map((h) => el('th', {}, h)))),
        el('tbody', {}, rows.map((r) => {
          const end = r.md.endTime ? Date.parse(r.md.endTime) : now;
          const long = r.result === 'running' && now - r.start > LONG_MS;
          const id = idOf(r.md.cluster);
          return el('tr', { 'data-operation': r.op.name, 'data-result': r.result },
            el('td', {}, el('span', { class: 'verb', 'data-verb': r.md.verb }, verbLabel(r.md.verb) || 'operation'), el('div', { class: 'mono muted' }, r.op.name)),
            el('td', {}, UUID.test(id) ? el('a', { href: '#/clusters/' + id }, r.cluster.displayName || r.md.cluster) : (r.md.cluster || '')),
            el('td', {}, r.account),
            el('td', {}, el('span', { class: 'result ' + r.result }, r.result), long ? el('span', { class: 'mark long' }, 'held for long') : null),
            el('td', { class: 'muted' }, when(r.md.createTime)),
            el('td', { class: 'muted' }, r.start ? duration(end - r.start) : ''),
            el('td', { class: 'error' }, r.op.error ? [errorReason(r.op.error) ? el('b', {}, errorReason(r.op.error) + ': ') : null, r.op.error.message] :
              (r.result === 'running' ? progress(r.op, false) : '')));
        }))),
  ];
}

function parseFilter(query) {
  const q = new URLSearchParams(query || '');
  return { state: q.get('state') || '', verb: q.get('verb') || '', cluster: q.get('cluster') || '', account: q.get('account') || '' };
}

function setFilter(key, value) {
  const f = route().filter || {};
  f[key] = value;
  const q = new URLSearchParams(Object.entries(f).filter(([, v]) => v));
  location.hash = '#/operations' + (q.toString() ? '?' + q.toString() : '');
}

// live follows GET /v1/clusters:watch (newline-delimited JSON): each
// message redraws the page (at most every LIVE_MIN_MS), so it shows a
// change as it is committed instead of at the next poll. While the stream
// is open the page does not poll; when it ends or fails, the page polls
// every second again and opens a new stream after a pause that doubles up
// to LIVE_RETRY_MAX_MS. A new token (Use token, Forget) opens a new one.
const LIVE_MIN_MS = 100;
const LIVE_RETRY_MAX_MS = 30000;
const live = { open: false, abort: null, retry: 1000, redraw: null };

async function follow() {
  if (live.abort) live.abort.abort();
  const ctl = new AbortController();
  live.abort = ctl;
  const headers = { Accept: 'application/json' };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = 'Bearer ' + token;
  try {
    const resp = await fetch('/v1/clusters:watch', { headers, cache: 'no-store', signal: ctl.signal });
    if (!resp.ok || !resp.body) throw new Error('watch: HTTP ' + resp.status);
    const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += value;
      let nl;
      while ((nl = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, nl).trim();
        buf = buf.slice(nl + 1);
        if (!line) continue;
        const msg = JSON.parse(line);
        if (msg.error) throw new Error('watch: ' + (msg.error.message || 'ended'));
        const kind = (msg.result || {}).kind;
        if (kind === 'SYNCED') {
          live.open = true;
          live.retry = 1000;
          document.body.dataset.live = 'true';
          clearTimeout(timer);
        } else if (live.open && kind !== 'BOOKMARK' && kind !== 'EXISTING') {
          liveRedraw();
        }
      }
    }
  } catch (err) {
    if (ctl.signal.aborted) return;
  }
  if (live.abort !== ctl) return;
  live.open = false;
  document.body.dataset.live = 'false';
  refresh();
  setTimeout(() => { if (live.abort === ctl) follow(); }, live.retry);
  live.retry = Math.min(live.retry * 2, LIVE_RETRY_MAX_MS);
}

function liveRedraw() {
  if (live.redraw) return;
  live.redraw = setTimeout(() => { live.redraw = null; if (!pending) refresh(); }, LIVE_MIN_MS);
}

// The page: route after '#', redraw every second, report problems.
let timer = null;
let generation = 0;

function route() {
  const m = location.hash.match(/^#\/clusters\/([0-9a-fA-F-]{36})$/);
  if (m && UUID.test(m[1])) return { page: 'cluster', id: m[1].toLowerCase() };
  const o = location.hash.match(/^#\/operations(?:\?(.*))?$/);
  if (o) return { page: 'operations', filter: parseFilter(o[1]) };
  return { page: 'list' };
}

function showProblem(err) {
  const box = document.getElementById('problem');
  let text = err.message;
  if (err.status === 401) {
    text = 'This server needs credentials: paste a bearer token above and press “Use token”. (' + (err.reason || 'UNAUTHENTICATED') + ': ' + err.message + ')';
  } else if (err.reason) {
    text = err.reason + ': ' + err.message;
  }
  box.textContent = text;
  box.hidden = false;
}

async function refresh() {
  clearTimeout(timer);
  const gen = ++generation;
  // A view drawn for a hash the page has left (a filter changed while it
  // loaded, before the hashchange event) is dropped: the hashchange's own
  // refresh draws the page asked for.
  const hash = location.hash;
  const r = route();
  try {
    const view = r.page === 'cluster' ? await clusterView(r.id) :
      r.page === 'operations' ? await operationsView(r.filter) : await listView();
    if (gen !== generation || hash !== location.hash) return;
    document.getElementById('view').replaceChildren(...view.filter(Boolean));
    document.getElementById('problem').hidden = true;
    document.getElementById('refreshed').textContent = 'updated ' + clock(new Date().toISOString());
  } catch (err) {
    if (gen !== generation || hash !== location.hash) return;
    showProblem(err);
  }
  if (gen === generation && !pending && !live.open) {
    timer = setTimeout(() => { if (!document.hidden) refresh(); }, REFRESH_MS);
  }
}

function showToken() {
  document.getElementById('token').placeholder = sessionStorage.getItem(TOKEN_KEY) ?
    'token set for this tab' : 'bearer token (not needed in development mode)';
}

document.getElementById('auth').addEventListener('submit', (ev) => {
  ev.preventDefault();
  const input = document.getElementById('token');
  if (input.value.trim()) sessionStorage.setItem(TOKEN_KEY, input.value.trim());
  input.value = '';
  showToken();
  refresh();
  follow();
});
document.getElementById('forget-token').addEventListener('click', () => {
  sessionStorage.removeItem(TOKEN_KEY);
  showToken();
  refresh();
  follow();
});
window.addEventListener('hashchange', () => { pending = null; notice = null; refresh(); });
document.addEventListener('visibilitychange', () => { if (!document.hidden) refresh(); });
showToken();
refresh();
follow();
