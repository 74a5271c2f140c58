//! The token, the login cookie and CSRF protection.
//!
//! - The token is compared in constant time: both sides are MACed under a key of this
//!   process and the tags compared with `verify_slice`.
//! - `/login` trades the token for a random session id in an `HttpOnly`,
//!   `SameSite=Strict` cookie, kept in memory (a restart logs everyone out).
//! - Each form carries `csrf = HMAC(process key, "csrf" ‖ session id)`; [`Posted`] is the
//!   only way a handler reads a form, and it refuses (`403`) a form without the right one,
//!   or one whose `Origin` is another site.

use std::collections::HashSet;
use std::sync::Mutex;

use axum::extract::{FromRequest, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Form, RequestExt as _};
use hmac::{Hmac, KeyInit, Mac};
use maud::html;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use sha2::Sha256;

use crate::AppState;
use crate::error::PageError;
use crate::layout;

/// The environment variable [`ConsoleOptions::from_env`](crate::ConsoleOptions::from_env)
/// reads the token from.
pub const TOKEN_ENV: &str = "DURABLE_CONSOLE_TOKEN";

/// The login cookie's name.
const COOKIE: &str = "durable_console";

type HmacSha256 = Hmac<Sha256>;

/// 32 random bytes from the OS generator, as 64 hex digits.
pub(crate) fn random_hex() -> String {
    let mut bytes = [0u8; 32];
    // Without an OS random generator there is no safe token or key to make.
    getrandom::fill(&mut bytes).expect("the OS random number generator failed");
    hex(&bytes)
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.is_ascii() {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok())
        .collect()
}

/// The process's secrets and the logged-in sessions.
pub(crate) struct Auth {
    key: Vec<u8>,
    token_tag: Vec<u8>,
    sessions: Mutex<HashSet<String>>,
}

impl Auth {
    pub(crate) fn new(token: &str) -> Self {
        let key = unhex(&random_hex()).unwrap_or_default();
        let token_tag = mac(&key, b"token", token.as_bytes())
            .finalize()
            .into_bytes()
            .to_vec();
        Auth {
            key,
            token_tag,
            sessions: Mutex::new(HashSet::new()),
        }
    }

    /// Whether `candidate` is the token, in time independent of where they differ.
    fn token_matches(&self, candidate: &str) -> bool {
        mac(&self.key, b"token", candidate.as_bytes())
            .verify_slice(&self.token_tag)
            .is_ok()
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        // The set holds plain strings: a panic elsewhere cannot leave it half-changed.
        self.sessions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The CSRF token of a login session.
    pub(crate) fn csrf(&self, session: &str) -> String {
        hex(&mac(&self.key, b"csrf", session.as_bytes())
            .finalize()
            .into_bytes())
    }

    fn csrf_ok(&self, session: &str, given: Option<&str>) -> bool {
        let Some(tag) = given.and_then(unhex) else {
            return false;
        };
        mac(&self.key, b"csrf", session.as_bytes())
            .verify_slice(&tag)
            .is_ok()
    }
}

fn mac(key: &[u8], domain: &[u8], bytes: &[u8]) -> HmacSha256 {
    // HMAC takes keys of any length.
    let mut mac = <HmacSha256 as KeyInit>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("HMAC accepts every key length"));
    mac.update(domain);
    mac.update(&[0]);
    mac.update(bytes);
    mac
}

/// Who made a request, once [`require`] let it through.
#[derive(Clone, Debug)]
pub(crate) enum Who {
    /// A browser logged in through `/login`, with its session id.
    Cookie(String),
    /// A script that sent `Authorization: Bearer <token>`.
    Bearer,
}

fn cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|pair| pair.trim().strip_prefix(COOKIE)?.strip_prefix('='))
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Middleware on every route but `/login`: a known login cookie or the bearer token, else
/// a `GET` is sent to `/login` (`303`) and anything else is refused (`401`).
pub(crate) async fn require(
    State(state): State<AppState>,
    mut req: Request,
    next: Next,
) -> Response {
    let headers = req.headers();
    let who = if let Some(token) = bearer(headers) {
        state.auth.token_matches(token).then_some(Who::Bearer)
    } else {
        cookie(headers)
            .filter(|id| state.auth.sessions().contains(*id))
            .map(|id| Who::Cookie(id.to_owned()))
    };
    if let Some(who) = who {
        req.extensions_mut().insert(who);
        return next.run(req).await;
    }
    if req.method() == Method::GET && bearer(req.headers()).is_none() {
        return Redirect::to("/login").into_response();
    }
    PageError::new(
        StatusCode::UNAUTHORIZED,
        "this console needs its token: log in at /login, or send `Authorization: Bearer <token>`",
    )
    .into_response()
}

/// The viewer of a page: who they are and the CSRF token their forms carry.
pub(crate) struct Viewer {
    /// The `csrf` field of every form on the page (empty for bearer requests, which need
    /// none).
    pub(crate) csrf: String,
}

impl FromRequestParts<AppState> for Viewer {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Response> {
        match parts.extensions.get::<Who>() {
            Some(Who::Cookie(id)) => Ok(Viewer {
                csrf: state.auth.csrf(id),
            }),
            Some(Who::Bearer) => Ok(Viewer {
                csrf: String::new(),
            }),
            None => Err(StatusCode::UNAUTHORIZED.into_response()),
        }
    }
}

/// A form that carries a CSRF token.
pub(crate) trait CsrfForm {
    /// The form's `csrf` field, if it has one.
    fn csrf(&self) -> Option<&str>;
}

/// A `POST`ed form, CSRF-checked: the only way handlers read forms.
pub(crate) struct Posted<T>(pub(crate) T);

impl<T> FromRequest<AppState> for Posted<T>
where
    T: DeserializeOwned + CsrfForm + Send + 'static,
{
    type Rejection = Response;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Response> {
        let forbidden = |why: &str| PageError::new(StatusCode::FORBIDDEN, why).into_response();
        let who = req
            .extensions()
            .get::<Who>()
            .cloned()
            .ok_or_else(|| StatusCode::UNAUTHORIZED.into_response())?;
        if !same_origin(req.headers()) {
            return Err(forbidden(
                "refused: this form was sent from another site (its Origin is not this console)",
            ));
        }
        let Form(form): Form<T> = req
            .extract_with_state(state)
            .await
            .map_err(IntoResponse::into_response)?;
        if let Who::Cookie(session) = &who
            && !state.auth.csrf_ok(session, form.csrf())
        {
            return Err(forbidden(
                "refused: the form's CSRF token is missing or wrong; reload the page and submit the form again",
            ));
        }
        Ok(Posted(form))
    }
}

/// `Origin`, when the browser sends one, names this console (the `Host` it was asked
/// for).
fn same_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return true;
    };
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let authority = origin.to_str().ok().and_then(|o| {
        o.strip_prefix("http://")
            .or_else(|| o.strip_prefix("https://"))
    });
    matches!((authority, host), (Some(a), Some(h)) if a == h)
}

#[derive(Deserialize)]
pub(crate) struct LoginForm {
    #[serde(default)]
    token: String,
}

/// `GET /login`.
pub(crate) async fn login_page() -> Response {
    login_form(StatusCode::OK, None)
}

fn login_form(status: StatusCode, problem: Option<&str>) -> Response {
    let body = html! {
        section.login {
            h1 { "durable console" }
            p { "Paste the console's token: " code { "durable serve" } " printed it at start, or it is "
                code { (TOKEN_ENV) } "." }
            @if let Some(problem) = problem { p.problem { (problem) } }
            form method="post" action="/login" {
                label for="token" { "Token" }
                input #token type="password" name="token" autocomplete="current-password" autofocus;
                button type="submit" { "Log in" }
            }
        }
    };
    (status, layout::bare("Log in", body)).into_response()
}

/// `POST /login`: the token for a session cookie.
pub(crate) async fn login(State(state): State<AppState>, Form(form): Form<LoginForm>) -> Response {
    if !state.auth.token_matches(form.token.trim()) {
        return login_form(
            StatusCode::UNAUTHORIZED,
            Some("That is not the console's token."),
        );
    }
    let id = random_hex();
    state.auth.sessions().insert(id.clone());
    let cookie = format!("{COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/");
    ([(header::SET_COOKIE, cookie)], Redirect::to("/")).into_response()
}

#[derive(Deserialize)]
pub(crate) struct LogoutForm {
    csrf: Option<String>,
}

impl CsrfForm for LogoutForm {
    fn csrf(&self) -> Option<&str> {
        self.csrf.as_deref()
    }
}

/// `POST /logout`: forgets the session.
pub(crate) async fn logout(
    State(state): State<AppState>,
    headers: HeaderMap,
    Posted(_): Posted<LogoutForm>,
) -> Response {
    if let Some(id) = cookie(&headers) {
        state.auth.sessions().remove(id);
    }
    let expired = format!("{COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0");
    ([(header::SET_COOKIE, expired)], Redirect::to("/login")).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_and_csrf() {
        let auth = Auth::new("s3cret");
        assert!(auth.token_matches("s3cret"));
        assert!(!auth.token_matches("s3cre"));
        assert!(!auth.token_matches(""));
        let csrf = auth.csrf("session-a");
        assert!(auth.csrf_ok("session-a", Some(&csrf)));
        assert!(!auth.csrf_ok("session-b", Some(&csrf)));
        assert!(!auth.csrf_ok("session-a", None));
        assert!(!auth.csrf_ok("session-a", Some("zz")));
        // Another process has another key.
        assert_ne!(Auth::new("s3cret").csrf("session-a"), csrf);
    }
}
