//! A provider's `429`, read for the fleet's rate limiter: how long it asks every worker
//! to wait, for [`Journal::report_throttle`](durable_core::Journal::report_throttle).

use std::time::Duration;

/// How long a `429` response asks to wait, from its headers (name, value; names compared
/// case-insensitively): `retry-after-ms` (OpenAI's, milliseconds), else `retry-after`
/// in seconds (an HTTP date is not read). `None` when neither is there or readable.
///
/// ```
/// use std::time::Duration;
///
/// let headers = [("Retry-After", "2")];
/// assert_eq!(durable_openai::retry_after(headers), Some(Duration::from_secs(2)));
/// // Then, for the whole fleet:
/// // journal.report_throttle("openai:gpt-4.1", wait).await?;
/// ```
pub fn retry_after<'a>(headers: impl IntoIterator<Item = (&'a str, &'a str)>) -> Option<Duration> {
    let mut seconds = None;
    for (name, value) in headers {
        let value = value.trim();
        if name.eq_ignore_ascii_case("retry-after-ms") {
            if let Some(ms) = value
                .parse::<f64>()
                .ok()
                .filter(|ms| ms.is_finite() && *ms >= 0.0)
            {
                return Some(Duration::from_secs_f64((ms / 1000.0).min(86_400.0)));
            }
        } else if name.eq_ignore_ascii_case("retry-after") {
            seconds = value
                .parse::<f64>()
                .ok()
                .filter(|s| s.is_finite() && *s >= 0.0)
                .map(|s| Duration::from_secs_f64(s.min(86_400.0)));
        }
    }
    seconds
}

/// How long a rate-limit error's message asks to wait, as OpenAI writes it ("… Please
/// try again in 1.5s." or "… in 20ms."): for clients that give the message but not the
/// headers. `None` when the message says no such thing.
///
/// ```
/// use std::time::Duration;
///
/// let message = "Rate limit reached for gpt-4.1 on tokens per min. Please try again in 1.5s.";
/// assert_eq!(durable_openai::retry_after_in_message(message), Some(Duration::from_millis(1500)));
/// ```
pub fn retry_after_in_message(message: &str) -> Option<Duration> {
    let (_, rest) = message.split_once("try again in ")?;
    let number: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let value: f64 = number.parse().ok().filter(|v: &f64| v.is_finite())?;
    let unit = &rest[number.len()..];
    let seconds = if unit.starts_with("ms") {
        value / 1000.0
    } else if unit.starts_with('s') {
        value
    } else if unit.starts_with('m') {
        value * 60.0
    } else {
        return None;
    };
    Some(Duration::from_secs_f64(seconds.clamp(0.0, 86_400.0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_prefer_milliseconds_and_refuse_nonsense() {
        assert_eq!(
            retry_after([("retry-after", "3"), ("Retry-After-Ms", "250")]),
            Some(Duration::from_millis(250))
        );
        assert_eq!(retry_after([("retry-after", "-1")]), None);
        assert_eq!(
            retry_after([("retry-after", "Wed, 21 Oct 2015 07:28:00 GMT")]),
            None
        );
        assert_eq!(retry_after([("x-other", "1")]), None);
    }

    #[test]
    fn messages_give_seconds_milliseconds_or_minutes() {
        assert_eq!(
            retry_after_in_message("Please try again in 20ms."),
            Some(Duration::from_millis(20))
        );
        assert_eq!(
            retry_after_in_message("try again in 2m3s"),
            Some(Duration::from_secs(120))
        );
        assert_eq!(retry_after_in_message("try again later"), None);
    }
}
