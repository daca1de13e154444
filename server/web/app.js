// clusterd's web view: the clusters with their state and current operation,
// and per cluster its nodes and the timeline of who held it when. It only
// reads the REST API (GET /v1/...), with the bearer token the viewer typed
// (kept in sessionStorage, so it ends with the tab) or with nothing in
// development mode, and redraws every second while the page is visible.
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

async function api(path) {
  const headers = { Accept: 'application/json' };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = 'Bearer ' + token;
  const resp = await fetch(path, { headers, cache: 'no-store' });
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
    withVerb ? el('span', { class: 'verb' }, md.verb || 'operation') : null,
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
        el('div', { class: 'muted' }, up + ' of ' + nodes.length + ' running')),
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
        title: s.verb + ' ' + s.operation + ' ' + clock(s.start) + ' → ' + (s.running ? 'now' : clock(s.end)) },
      s.verb);
    }));
}

function timeline(list) {
  return el('ol', { class: 'timeline', id: 'timeline' }, list.map((s) => {
    const end = s.running ? Date.now() : Date.parse(s.end);
    return el('li', { class: 'span kind-' + s.verb, 'data-operation': s.operation, 'data-result': s.result },
      el('div', { class: 'span-head' },
        el('span', { class: 'verb' }, s.verb),
        s.result ? el('span', { class: 'result ' + s.result }, s.result) : null,
        s.recovery ? el('span', { class: 'mark recovery' }, 'recovery') : null,
        s.repairs ? el('span', { class: 'mark repair' }, s.repairs === 1 ? '1 repair' : s.repairs + ' repairs') : null,
        s.adoptions ? el('span', { class: 'mark adopted' }, s.adoptions === 1 ? 'adopted' : 'adopted ' + s.adoptions + '×') : null,
        el('span', { class: 'holder' }, s.operation ? 'held by ' : 'by the scanner', s.operation ? el('span', { class: 'mono' }, s.operation) : null,
          s.servers.length ? ' on server ' + s.servers.join(', ') : ''),
        el('span', { class: 'muted' }, clock(s.start) + ' → ' + (s.running ? 'now' : clock(s.end)) + ' (' + duration(end - Date.parse(s.start)) + ')')),
      s.running && s.op ? progress(s.op, false) : null,
      s.op && s.op.error ? el('div', { class: 'muted' }, 'error: ' + s.op.error.message) : null,
      el('ul', { class: 'events' }, s.events.map((e) => el('li', { class: e.event === 'REPAIR' ? 'repair' : '' },
        el('span', { class: 'mono' }, clock(e.time)), ' ',
        el('b', {}, e.event), ' ',
        e.fromState === e.toState ? e.toState : (e.fromState === 'STATE_UNSPECIFIED' ? '' : e.fromState + ' → ') + e.toState,
        e.message ? el('span', { class: 'muted' }, ' — ' + e.message) : null))));
  }));
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
    el('div', { class: 'cards' },
      card('Name', el('span', { class: 'mono' }, c.name)),
      card('Account', c.account),
      card('Kubernetes', c.kubernetesVersion),
      card('Size', (c.controlNodeCount || 0) + ' control + ' + (c.workerNodeCount || 0) + ' workers, ' + c.serviceOffering),
      card('Endpoint', c.endpoint || '—'),
      el('div', { class: 'card wide' }, el('div', { class: 'k' }, 'Current operation'),
        el('div', { class: 'v' }, current ? progress(current) : (c.currentOperation || 'none')))),
    el('h2', {}, 'Nodes'),
    (c.nodes || []).length === 0 ? el('p', { class: 'muted' }, 'No nodes.') :
      el('table', { id: 'nodes' },
        el('thead', {}, el('tr', {}, ['Machine', 'Role', 'Power', 'Joined', 'Kubernetes'].map((h) => el('th', {}, h)))),
        el('tbody', {}, c.nodes.map((n) => el('tr', {},
          el('td', { class: 'mono' }, n.name), el('td', {}, n.role), el('td', {}, n.power),
          el('td', {}, n.joined ? 'yes' : 'no'), el('td', {}, n.kubernetesVersion))))),
    el('h2', {}, 'Timeline: who held the cluster when'),
    lane(list),
    timeline(list.slice().reverse()),
  ];
}

// The page: route after '#', redraw every second, report problems.
let timer = null;
let generation = 0;

function route() {
  const m = location.hash.match(/^#\/clusters\/([0-9a-fA-F-]{36})$/);
  return m && UUID.test(m[1]) ? { page: 'cluster', id: m[1].toLowerCase() } : { page: 'list' };
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
  const r = route();
  try {
    const view = r.page === 'cluster' ? await clusterView(r.id) : await listView();
    if (gen !== generation) return;
    document.getElementById('view').replaceChildren(...view.filter(Boolean));
    document.getElementById('problem').hidden = true;
    document.getElementById('refreshed').textContent = 'updated ' + clock(new Date().toISOString());
  } catch (err) {
    if (gen !== generation) return;
    showProblem(err);
  }
  if (gen === generation) {
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
});
document.getElementById('forget-token').addEventListener('click', () => {
  sessionStorage.removeItem(TOKEN_KEY);
  showToken();
  refresh();
});
window.addEventListener('hashchange', refresh);
document.addEventListener('visibilitychange', () => { if (!document.hidden) refresh(); });
showToken();
refresh();
