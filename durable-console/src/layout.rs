//! The page shell: one inline stylesheet, the navigation, the read-only notice, and the
//! security headers of every response.
//!
//! This is the only file that uses `PreEscaped`, for the stylesheet, a constant. Store
//! data is only ever spliced as `(expr)`, which maud escapes (`tests/http.rs` checks that
//! no other file names `PreEscaped`).

use axum::http::{HeaderValue, header};
use axum::response::Response;
use maud::{DOCTYPE, Markup, PreEscaped, html};

use crate::AppState;
use crate::auth::Viewer;

const STYLE: &str = r#"
:root { --fg: #1d2330; --muted: #5f6b7a; --line: #dfe3ea; --bg: #f6f7f9; --card: #fff;
  --accent: #2457c5; --warn: #a34b00; --warn-bg: #fff4e5; --bad: #b3261e; --bad-bg: #fdecea;
  --ok: #1b7a3d; --ok-bg: #e8f5ec; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
  color: var(--fg); background: var(--bg); }
header.top { display: flex; align-items: center; gap: 24px; padding: 10px 24px;
  background: #1d2330; color: #fff; }
header.top .brand { font-weight: 700; letter-spacing: .02em; }
header.top nav a { color: #c9d3e3; text-decoration: none; margin-right: 18px; }
header.top nav a.on { color: #fff; border-bottom: 2px solid #7aa2ff; padding-bottom: 2px; }
header.top form { margin-left: auto; }
header.top button { background: transparent; color: #c9d3e3; border: 1px solid #3b4457; }
main { padding: 20px 24px 40px; max-width: 1500px; margin: 0 auto; }
h1 { font-size: 20px; margin: 4px 0 14px; }
h2 { font-size: 15px; margin: 22px 0 8px; color: #2b3342; }
a { color: var(--accent); }
code, pre, .mono { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace;
  font-size: 12.5px; }
pre { white-space: pre-wrap; word-break: break-word; margin: 0; }
table { border-collapse: collapse; width: 100%; background: var(--card);
  border: 1px solid var(--line); border-radius: 6px; }
th, td { text-align: left; padding: 6px 10px; border-bottom: 1px solid var(--line);
  vertical-align: top; }
th { font-size: 12px; text-transform: uppercase; letter-spacing: .04em; color: var(--muted);
  background: #fafbfc; }
tr:last-child td { border-bottom: 0; }
td.num, th.num { text-align: right; }
.muted { color: var(--muted); }
.pill { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 12px;
  background: #eef1f5; color: #384152; white-space: nowrap; }
.pill.active, .pill.completed, .pill.resolved { background: var(--ok-bg); color: var(--ok); }
.pill.parked, .pill.doubt, .pill.issued, .pill.not_happened { background: var(--warn-bg); color: var(--warn); }
.pill.failed, .pill.cancelled { background: var(--bad-bg); color: var(--bad); }
.count { font-weight: 700; color: var(--warn); }
.filters { display: flex; gap: 12px; align-items: end; flex-wrap: wrap; margin-bottom: 14px; }
.filters label { display: flex; flex-direction: column; font-size: 12px; color: var(--muted); }
input, select, textarea { font: inherit; padding: 5px 8px; border: 1px solid #c5ccd6;
  border-radius: 5px; background: #fff; }
textarea { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12.5px; width: 100%; }
button { font: inherit; padding: 6px 14px; border-radius: 5px; border: 1px solid var(--accent);
  background: var(--accent); color: #fff; cursor: pointer; }
button.secondary { background: #fff; color: var(--accent); }
button.danger { background: var(--bad); border-color: var(--bad); }
button:disabled { opacity: .5; cursor: not-allowed; }
.notice { padding: 10px 14px; border-radius: 6px; margin: 0 0 14px; }
.notice.readonly { background: var(--warn-bg); color: var(--warn); border: 1px solid #f3c98b; }
.notice.done { background: var(--ok-bg); color: var(--ok); border: 1px solid #a8d9b8; }
.problem { background: var(--bad-bg); color: var(--bad); padding: 10px 14px; border-radius: 6px; }
.split { display: grid; grid-template-columns: minmax(0, 2fr) minmax(340px, 1fr); gap: 20px; }
.scroll { overflow-x: auto; }
td.args { max-width: 360px; }
code.args { word-break: break-word; white-space: pre-wrap; }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 6px;
  padding: 12px 14px; margin-bottom: 14px; }
.facts { display: grid; grid-template-columns: max-content 1fr; gap: 3px 16px; margin: 0; }
.facts dt { color: var(--muted); }
.facts dd { margin: 0; }
tr.checkpoint td { background: #f3f6fc; }
tr.checkpoint.viewed td { background: #e3ebfb; }
tr.resolution td { background: var(--ok-bg); }
tr.doubt td { background: var(--warn-bg); }
.transcript .msg { border-left: 3px solid var(--line); padding: 4px 10px; margin-bottom: 10px; }
.transcript .msg.user { border-color: #7aa2ff; }
.transcript .msg.assistant { border-color: #1b7a3d; }
.transcript .msg.tool { border-color: #a34b00; }
.transcript .role { font-size: 11px; text-transform: uppercase; letter-spacing: .05em;
  color: var(--muted); }
.transcript .text { white-space: pre-wrap; word-break: break-word; }
.decisions { display: grid; grid-template-columns: 1fr 1fr; gap: 14px; margin-top: 10px; }
.decisions form { border: 1px solid var(--line); border-radius: 6px; padding: 10px 12px; }
.decisions h3 { margin: 0 0 6px; font-size: 14px; }
form.inline { display: flex; gap: 8px; align-items: end; flex-wrap: wrap; }
form.inline label, .decisions label { display: flex; flex-direction: column; font-size: 12px;
  color: var(--muted); gap: 2px; margin-bottom: 6px; }
section.login, section.problem-page { max-width: 460px; margin: 80px auto; background: var(--card);
  border: 1px solid var(--line); border-radius: 8px; padding: 24px 28px; }
section.login form { display: flex; flex-direction: column; gap: 8px; }
.versions a { margin-right: 6px; }
header.top nav .badge { display: inline-block; min-width: 18px; padding: 0 6px; border-radius: 9px;
  background: #f3c98b; color: #1d2330; font-size: 11px; font-weight: 700; text-align: center; }
.pill.requested, .pill.awaiting_approval { background: var(--warn-bg); color: var(--warn); }
.pill.approved { background: var(--ok-bg); color: var(--ok); }
.pill.denied, .pill.expired { background: var(--bad-bg); color: var(--bad); }
.decisions.three { grid-template-columns: 1fr 1.4fr 1fr; }
.reasoning { white-space: pre-wrap; word-break: break-word; background: #fafbfc;
  border-left: 3px solid var(--line); padding: 4px 10px; margin: 0; }
table.diff td { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12.5px; }
td.before { background: var(--bad-bg); } td.after { background: var(--ok-bg); }
tr.approval td { background: #fbf8ee; }
tr.approval-detail td { background: #fdfbf4; font-size: 13px; }
.versions a.on { font-weight: 700; text-decoration: none; color: var(--fg); }
"#;

/// Which section of the navigation a page belongs to.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Nav {
    Sessions,
    InDoubt,
    Approvals,
    Workers,
}

/// The counts the navigation shows: calls in doubt, calls awaiting approval (`None`
/// when the store could not say).
async fn counts(state: &AppState) -> (Option<usize>, Option<usize>) {
    let store = state.store.as_ref();
    let doubt = store.in_doubt(None).await.ok().map(|calls| {
        calls
            .iter()
            .filter(|c| c.status == durable::store::CallStatus::Issued)
            .count()
    });
    let pending = store.pending_approvals(None).await.ok().map(|p| p.len());
    (doubt, pending)
}

/// ` (3)` after a navigation link, when there is something to decide.
fn badge(count: Option<usize>) -> Markup {
    html! {
        @if let Some(n) = count.filter(|n| *n > 0) { " " span.badge { (n) } }
    }
}

fn head(title: &str) -> Markup {
    html! {
        head {
            meta charset="utf-8";
            meta name="viewport" content="width=device-width, initial-scale=1";
            meta name="referrer" content="same-origin";
            title { (title) " · durable console" }
            style { (PreEscaped(STYLE)) }
        }
    }
}

/// A page without navigation (login, errors).
pub(crate) fn bare(title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(title))
            body { main { (body) } }
        }
    }
}

/// A page of the console: navigation (with the counts of calls in doubt and awaiting
/// approval), the read-only notice when it applies, `body`.
pub(crate) async fn page(
    state: &AppState,
    viewer: &Viewer,
    nav: Nav,
    title: &str,
    body: Markup,
) -> Markup {
    let tab = |which: Nav| if which == nav { "on" } else { "" };
    let (doubt, pending) = counts(state).await;
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(title))
            body {
                header.top {
                    span.brand { "durable console" }
                    nav {
                        a href="/" class=(tab(Nav::Sessions)) { "Sessions" }
                        a href="/in-doubt" class=(tab(Nav::InDoubt)) { "In doubt" (badge(doubt)) }
                        a href="/approvals" class=(tab(Nav::Approvals)) { "Approvals" (badge(pending)) }
                        a href="/workers" class=(tab(Nav::Workers)) { "Workers" }
                    }
                    form method="post" action="/logout" {
                        input type="hidden" name="csrf" value=(viewer.csrf);
                        button type="submit" { "Log out" }
                    }
                }
                main {
                    @if let Some(reason) = &state.read_only {
                        (read_only_notice(reason))
                    }
                    (body)
                }
            }
        }
    }
}

/// The notice shown on every page (and beside every form) of a read-only console.
pub(crate) fn read_only_notice(reason: &str) -> Markup {
    html! {
        p.notice.readonly {
            strong { "Read-only: " } (reason) ". Forms are shown for reference; nothing can be changed."
        }
    }
}

/// The hidden CSRF field of a form.
pub(crate) fn csrf_field(viewer: &Viewer) -> Markup {
    html! { input type="hidden" name="csrf" value=(viewer.csrf); }
}

/// Headers on every response: no script may run (even if escaping failed somewhere), no
/// framing, no sniffing, nothing cached, no referrer leaves the console (`same-origin`, not
/// `no-referrer`: under `no-referrer` a browser sends `Origin: null` with every form).
pub(crate) async fn security_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    let fixed = [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
        ),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "same-origin"),
        (header::CACHE_CONTROL, "no-store"),
    ];
    for (name, value) in fixed {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}
