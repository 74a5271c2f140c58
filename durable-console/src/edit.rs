//! Arguments an operator edited before approving a call: what the display mask hid put
//! back, and what the edit changes, path by path.

use serde_json::Value;

use crate::format::visible;

/// Puts back what the display mask hid (see
/// [`unmask_displayed`](durable::secret::unmask_displayed)).
pub(crate) fn unmask(edited: Value, original: &Value) -> Value {
    durable::secret::unmask_displayed(edited, original)
}

/// One changed place of the arguments: its path, before and after (masked; `None`
/// where absent).
pub(crate) type Change = (String, Option<Value>, Option<Value>);

pub(crate) fn diff(before: &Value, after: &Value, path: &str, out: &mut Vec<Change>) {
    match (before, after) {
        (Value::Object(b), Value::Object(a)) => {
            for (k, bv) in b {
                let at = format!("{path}.{k}");
                match a.get(k) {
                    Some(av) => diff(bv, av, &at, out),
                    None => out.push((at, Some(bv.clone()), None)),
                }
            }
            for (k, av) in a.iter().filter(|(k, _)| !b.contains_key(*k)) {
                out.push((format!("{path}.{k}"), None, Some(av.clone())));
            }
        }
        (b, a) if b != a => out.push((path.to_owned(), Some(b.clone()), Some(a.clone()))),
        _ => {}
    }
}

pub(crate) fn shown(value: Option<&Value>) -> String {
    value.map_or_else(|| "(absent)".to_owned(), |v| visible(&v.to_string(), 2000))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn what_was_masked_is_put_back() {
        let original = json!({"amount": 5, "card": {"$secret": "k1:abc"}, "auth": {"token": "t"}});
        let typed = json!({"amount": 7, "card": "<secret>", "auth": {"token": "***"}});
        assert_eq!(
            unmask(typed, &original),
            json!({"amount": 7, "card": {"$secret": "k1:abc"}, "auth": {"token": "t"}})
        );
        let changed = json!({"amount": 5, "card": "4242"});
        assert_eq!(unmask(changed.clone(), &original), changed);
    }

    #[test]
    fn the_diff_names_each_changed_path() {
        let mut out = Vec::new();
        diff(
            &json!({"a": 1, "b": {"c": 2}, "d": 3}),
            &json!({"a": 1, "b": {"c": 4}, "e": 5}),
            "$",
            &mut out,
        );
        let paths: Vec<_> = out.iter().map(|(p, _, _)| p.as_str()).collect();
        assert_eq!(paths, ["$.b.c", "$.d", "$.e"]);
    }
}
