//! The operator console of [`durable`](https://docs.rs/durable): the sessions of a store,
//! each session's timeline (journal rows, checkpoints, resolutions and approvals beside
//! its transcript), the inbox of calls in doubt, the inbox of calls awaiting approval, and
//! the worker pools (queues, leases, sleeping sessions), in the browser.
//!
//! Run it with `durable serve --db agent.db`, or mount [`router`] in a program of your own:
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use durable::CheckpointStore;
//! use durable_console::ConsoleOptions;
//!
//! # async fn run(store: Arc<dyn CheckpointStore>) -> std::io::Result<()> {
//! // The token comes from DURABLE_CONSOLE_TOKEN, or is generated and printed.
//! let options = ConsoleOptions::from_env();
//! let bind = durable_console::DEFAULT_BIND.parse().map_err(std::io::Error::other)?;
//! durable_console::serve(store, options, bind).await
//! # }
//! ```
//!
//! # Safe by default
//!
//! - [`serve`] binds to loopback; any other address must be allowed with
//!   [`ConsoleOptions::allow_remote`], and a warning is printed.
//! - Every request needs the token: the `/login` form sets an `HttpOnly`,
//!   `SameSite=Strict` cookie, and scripts may send `Authorization: Bearer <token>`. The
//!   token is compared in constant time.
//! - `GET` never changes anything. Every change is a `POST` whose form carries a CSRF
//!   token (an HMAC of the session cookie under a key of this process), refused with
//!   `403` without it. Requests authenticated by the `Authorization` header carry no
//!   ambient credential a browser would attach, and need no CSRF token.
//! - Everything read from the store is HTML-escaped (model text is attacker-influenced),
//!   and pages are served with a `Content-Security-Policy` that runs no script at all.
//! - Secrets are masked as the `durable` CLI masks them ([`mask`]).
//! - A store the console could only open read-only ([`ConsoleOptions::read_only`]) is
//!   served read-only: every form says so and every change is refused.

mod approvals;
mod auth;
mod budget;
mod edit;
mod error;
mod family;
mod format;
mod inbox;
mod layout;
pub mod mask;
mod sessions;
mod signals;
mod timeline;
mod workers;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::routing::{get, post};
use durable::CheckpointStore;

pub use crate::auth::TOKEN_ENV;

/// The default address of [`serve`]: loopback, port 7878.
pub const DEFAULT_BIND: &str = "127.0.0.1:7878";

/// How the console runs: its token, whether it may write, who decisions are recorded as.
#[derive(Clone)]
pub struct ConsoleOptions {
    token: String,
    generated: bool,
    read_only: Option<String>,
    operator: String,
    allow_remote: bool,
}

impl std::fmt::Debug for ConsoleOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsoleOptions")
            .field("token", &"<hidden>")
            .field("generated", &self.generated)
            .field("read_only", &self.read_only)
            .field("operator", &self.operator)
            .field("allow_remote", &self.allow_remote)
            .finish()
    }
}

impl ConsoleOptions {
    /// The token from [`TOKEN_ENV`] (`DURABLE_CONSOLE_TOKEN`) when it is set and not
    /// blank, else 32 random bytes (hex) that [`serve`] prints; decisions recorded as
    /// `$USER` (else `operator`).
    pub fn from_env() -> Self {
        let given = std::env::var(TOKEN_ENV)
            .ok()
            .filter(|t| !t.trim().is_empty());
        let operator = std::env::var("USER")
            .ok()
            .or_else(|| std::env::var("LOGNAME").ok())
            .filter(|s| !s.trim().is_empty())
            .unwrap_or_else(|| "operator".to_owned());
        let generated = given.is_none();
        ConsoleOptions {
            token: given.unwrap_or_else(auth::random_hex),
            generated,
            read_only: None,
            operator,
            allow_remote: false,
        }
    }

    /// Uses `token` (it must be given to log in).
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = token.into();
        self.generated = false;
        self
    }

    /// The token requests must present.
    pub fn token_value(&self) -> &str {
        &self.token
    }

    /// Whether the token was generated (and is printed by [`serve`]).
    pub fn token_was_generated(&self) -> bool {
        self.generated
    }

    /// Serves read-only, saying `reason` on every form (e.g. a signed store opened
    /// without its key): every change is refused.
    pub fn read_only(mut self, reason: impl Into<String>) -> Self {
        self.read_only = Some(reason.into());
        self
    }

    /// The name forms propose for the audit row (`by`); each operator may change it.
    pub fn operator(mut self, name: impl Into<String>) -> Self {
        self.operator = name.into();
        self
    }

    /// Lets [`serve`] bind to an address other than loopback (a warning is printed).
    pub fn allow_remote(mut self, allow: bool) -> Self {
        self.allow_remote = allow;
        self
    }
}

/// What every handler shares.
#[derive(Clone)]
struct AppState {
    store: Arc<dyn CheckpointStore>,
    auth: Arc<auth::Auth>,
    read_only: Option<Arc<str>>,
    operator: Arc<str>,
}

/// The console's routes over `store`: `/` (sessions), `/sessions/{id}` (timeline,
/// `?version=N`), `/in-doubt` (the calls in doubt), `/approvals` (the calls awaiting
/// approval), `/workers` (queues, leases, sleeping sessions), their forms, and `/login`.
/// Every route but `/login` requires the token.
pub fn router(store: Arc<dyn CheckpointStore>, options: ConsoleOptions) -> Router {
    let state = AppState {
        store,
        auth: Arc::new(auth::Auth::new(&options.token)),
        read_only: options.read_only.map(Arc::from),
        operator: Arc::from(options.operator),
    };
    let protected = Router::new()
        .route("/", get(sessions::page))
        .route("/sessions/{id}", get(timeline::page))
        .route("/sessions/{id}/fork", post(timeline::fork))
        .route("/sessions/{id}/budget", post(budget::raise))
        .route("/sessions/{id}/cancel", post(family::cancel))
        .route("/sessions/{id}/signal", post(signals::send))
        .route("/in-doubt", get(inbox::page))
        .route("/in-doubt/{call}/confirm", post(inbox::confirm))
        .route("/in-doubt/{call}/resolve", post(inbox::resolve))
        .route("/approvals", get(approvals::page))
        .route("/approvals/{call}/confirm", post(approvals::confirm))
        .route("/approvals/{call}/decide", post(approvals::decide))
        .route("/workers", get(workers::page))
        .route("/workers/{session}/confirm", post(workers::confirm))
        .route("/workers/{session}/wake", post(workers::wake))
        .route("/logout", post(auth::logout))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::require,
        ));
    Router::new()
        .route("/login", get(auth::login_page).post(auth::login))
        .merge(protected)
        .fallback(error::not_found)
        .layer(axum::middleware::map_response(layout::security_headers))
        .with_state(state)
}

/// Binds `bind`, prints the console's URL (and the token when it was generated) on
/// stdout, and serves [`router`] until the process ends.
///
/// A non-loopback `bind` is refused unless [`ConsoleOptions::allow_remote`] is set; then
/// a warning is printed on stderr.
pub async fn serve(
    store: Arc<dyn CheckpointStore>,
    options: ConsoleOptions,
    bind: SocketAddr,
) -> std::io::Result<()> {
    if !bind.ip().is_loopback() {
        if !options.allow_remote {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!(
                    "refusing to serve the console on {bind}, which is not a loopback address; allow it explicitly (`--allow-remote`) or bind to 127.0.0.1"
                ),
            ));
        }
        eprintln!(
            "warning: the console is served on {bind}, reachable from other machines, over plain HTTP: the token and the session cookie cross the network unencrypted; put it behind TLS or an SSH tunnel"
        );
    }
    let listener = tokio::net::TcpListener::bind(bind).await?;
    let local = listener.local_addr()?;
    {
        // Not `println!`: a closed stdout (`durable serve | head -1`) must not stop the server.
        use std::io::Write as _;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "durable console: http://{local}/");
        if options.generated {
            let _ = writeln!(
                out,
                "token: {} (set {TOKEN_ENV} to choose one)",
                options.token
            );
        }
        if let Some(reason) = &options.read_only {
            let _ = writeln!(out, "read-only: {reason}");
        }
        let _ = out.flush();
    }
    axum::serve(listener, router(store, options)).await
}
