//! Requests to the console's router without a network: a logged-in cookie, its CSRF
//! token, forms posted as a browser posts them.

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode, header};
use tower::ServiceExt as _;

use super::TOKEN;

pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

pub async fn send(app: &Router, req: Request<Body>) -> Reply {
    let response = app.clone().oneshot(req).await.expect("infallible");
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = axum::body::to_bytes(response.into_body(), 16 << 20)
        .await
        .expect("body");
    Reply {
        status,
        headers,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    }
}

pub fn get(path: &str) -> axum::http::request::Builder {
    Request::builder().method(Method::GET).uri(path)
}

pub fn bearer(path: &str) -> Request<Body> {
    get(path)
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
        .body(Body::empty())
        .expect("request")
}

pub fn post(path: &str, cookie: Option<&str>, form: &[(&str, &str)]) -> Request<Body> {
    let body = form
        .iter()
        .map(|(k, v)| format!("{k}={}", durable_console_encode(v)))
        .collect::<Vec<_>>()
        .join("&");
    let mut req = Request::builder()
        .method(Method::POST)
        .uri(path)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .header(header::HOST, "127.0.0.1:7878");
    if let Some(cookie) = cookie {
        req = req.header(header::COOKIE, cookie);
    }
    req.body(Body::from(body)).expect("request")
}

/// `application/x-www-form-urlencoded` value encoding.
pub fn durable_console_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Logs in with the token; the cookie to send back.
pub async fn login(app: &Router) -> String {
    let reply = send(app, post("/login", None, &[("token", TOKEN)])).await;
    assert_eq!(reply.status, StatusCode::SEE_OTHER, "{}", reply.body);
    let cookie = reply
        .headers
        .get(header::SET_COOKIE)
        .and_then(|v| v.to_str().ok())
        .expect("a session cookie")
        .to_owned();
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(cookie.contains(attribute), "{cookie}");
    }
    cookie.split(';').next().unwrap_or_default().to_owned()
}

/// The CSRF token of the forms on `path`, as the logged-in browser sees it.
pub async fn csrf_of(app: &Router, cookie: &str, path: &str) -> String {
    let reply = send(
        app,
        get(path)
            .header(header::COOKIE, cookie)
            .body(Body::empty())
            .expect("request"),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let marker = "name=\"csrf\" value=\"";
    let at = reply.body.find(marker).expect("a csrf field") + marker.len();
    reply.body[at..]
        .split('"')
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// The body of `GET path` with a cookie.
pub async fn page_of(app: &Router, cookie: &str, path: &str) -> Reply {
    send(
        app,
        get(path)
            .header(header::COOKIE, cookie)
            .body(Body::empty())
            .expect("request"),
    )
    .await
}
