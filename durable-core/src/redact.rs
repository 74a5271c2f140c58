//! Removing credentials from database URLs before they reach an error, a log line, a
//! panic or a terminal.

/// Query parameters whose value is a credential (compared case-insensitively).
const SECRET_PARAMS: &[&str] = &["password", "sslpassword", "passfile", "sslkey"];

/// A database URL with its password removed, for messages: `postgres://app:s3cret@db:5432/x`
/// becomes `postgres://app:***@db:5432/x`.
///
/// Written for URLs as users type them, including wrong ones: a password holding a raw
/// `/`, `?`, `@` or `#` (which should have been percent-encoded) is still removed whole,
/// because the user info is taken to end at the *last* `@` (a user info with no `:` is
/// kept: it is a user name). The values of `password=`, `sslpassword=`, `passfile=` and
/// `sslkey=` query parameters are replaced up to the next `&`. When in doubt more is
/// removed, never less. A string without `://` is returned unchanged (a file path).
///
/// ```
/// use durable_core::redact::redact_url;
///
/// assert_eq!(redact_url("postgres://app:s3cret@db:5432/x"), "postgres://app:***@db:5432/x");
/// assert_eq!(redact_url("postgres://app:a/b?c@d#e@db/x"), "postgres://app:***@db/x");
/// assert_eq!(redact_url("postgres://db/x?user=app&password=s3cret"), "postgres://db/x?user=app&password=***");
/// assert_eq!(redact_url("agent.db"), "agent.db");
/// ```
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let (scheme, rest) = url.split_at(scheme_end + 3);
    // The user info ends at the last `@`: anything before it may be a password with raw
    // reserved characters, so it is never split at `/`, `?` or `#`.
    let (userinfo, after) = match rest.rfind('@') {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    };
    let mut out = String::with_capacity(url.len());
    out.push_str(scheme);
    if let Some(userinfo) = userinfo {
        match userinfo.split_once(':') {
            Some((user, _password)) => {
                out.push_str(user);
                out.push_str(":***");
            }
            None => out.push_str(userinfo),
        }
        out.push('@');
    }
    out.push_str(after);
    mask_secret_params(&out)
}

/// Replaces the value of every credential query parameter (`?password=…`, `&sslkey=…`)
/// up to the next `&` or the end: a `#` does not end it, since it may be part of the
/// password.
fn mask_secret_params(url: &str) -> String {
    let mut out = String::with_capacity(url.len());
    let mut rest = url;
    while let Some(at) = rest.find(['?', '&']) {
        out.push_str(&rest[..=at]);
        rest = &rest[at + 1..];
        let key_len = rest.find(['=', '&']).unwrap_or(rest.len());
        let key = &rest[..key_len];
        let is_secret = rest[key_len..].starts_with('=')
            && SECRET_PARAMS.iter().any(|s| key.eq_ignore_ascii_case(s));
        if is_secret {
            out.push_str(key);
            out.push_str("=***");
            rest = &rest[key_len..];
            rest = &rest[rest.find('&').unwrap_or(rest.len())..];
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn passwords_are_removed() {
        for (url, expected) in [
            (
                "postgres://app:s3cret@db:5432/x",
                "postgres://app:***@db:5432/x",
            ),
            ("postgresql://app:s3cret@db/x", "postgresql://app:***@db/x"),
            ("postgres://app@db/x", "postgres://app@db/x"),
            ("postgres://db/x", "postgres://db/x"),
            ("postgres://:s3cret@db/x", "postgres://:***@db/x"),
            // raw reserved characters in the password
            (
                "postgres://app:pa/ss@db:5432/x",
                "postgres://app:***@db:5432/x",
            ),
            ("postgres://app:pa?ss@db/x", "postgres://app:***@db/x"),
            ("postgres://app:p@ss@db/x", "postgres://app:***@db/x"),
            ("postgres://app:pa#ss@db/x", "postgres://app:***@db/x"),
            (
                "postgres://app:a/b?c@d#e@db/x?sslmode=disable",
                "postgres://app:***@db/x?sslmode=disable",
            ),
            // percent-encoded (correct) form
            ("postgres://app:pa%2Fss%40x@db/x", "postgres://app:***@db/x"),
            // query parameters
            (
                "postgres://db/x?user=app&password=s3cret&sslmode=disable",
                "postgres://db/x?user=app&password=***&sslmode=disable",
            ),
            (
                "postgres://db/x?PASSWORD=s3cret#frag",
                "postgres://db/x?PASSWORD=***",
            ),
            (
                "postgres://db/x?password=a@b/c?d#e&x=1",
                "postgres://db/x?password=***&x=1",
            ),
            (
                "postgres://db/x?sslpassword=k&sslkey=/k.pem",
                "postgres://db/x?sslpassword=***&sslkey=***",
            ),
            // not URLs
            ("agent.db", "agent.db"),
            ("/tmp/a:b@c.db", "/tmp/a:b@c.db"),
            ("", ""),
        ] {
            assert_eq!(redact_url(url), expected, "{url}");
        }
    }

    #[test]
    fn no_piece_of_a_password_survives() {
        for password in [
            "Q1s3cret",
            "Q1a/Q2b",
            "Q1a?Q2b",
            "Q1a@Q2b",
            "Q1a#Q2b",
            "Q1/?@#Q2",
            "Q1@Q2/Q3?Q4#Q5",
        ] {
            for url in [
                format!("postgres://app:{password}@db.example:5432/agent"),
                format!("postgres://db.example/agent?password={password}"),
            ] {
                let shown = redact_url(&url);
                let kept: Vec<&str> = password
                    .split(['/', '?', '@', '#'])
                    .filter(|piece| !piece.is_empty() && shown.contains(*piece))
                    .collect();
                assert!(shown.contains("***"), "{url} -> {shown}");
                assert!(kept.is_empty(), "{url} -> {shown} keeps {kept:?}");
            }
        }
    }
}
