//! The batch format of `POST /readings/batch`: several keyed readings in one request, each
//! answered by its own status, in order (docs/batches.md).
//!
//! A request body is a JSON array of items; each item is a two-element array, the reading's
//! idempotency key (a string) and its body (the JSON value a single `POST /readings` would
//! carry, unchanged):
//!
//! ```json
//! [["0000000000000007000000010000002a",{"boot":1,"seq":42,"mC":21500}],
//!  ["0000000000000007000000010000002b",{"boot":1,"seq":43,"mC":21375}]]
//! ```
//!
//! The answer is a JSON array with one entry per item, in the items' order (keys are not echoed:
//! the place is the item): the status that item would have got as a single request, or
//! `[status, seconds]` when that answer carried a `Retry-After` in seconds:
//!
//! ```json
//! [201,[503,2]]
//! ```
//!
//! ```
//! use wary_host::batch::{Item, ItemAnswer, parse, encode, answers, parse_answers, Limits};
//!
//! let body = encode(&[Item { key: "k1".into(), body: br#"{"v":1}"#.to_vec() }]);
//! let items = parse(&body, &Limits::default()).unwrap();
//! assert_eq!(items[0].key, "k1");
//! assert_eq!(items[0].body, br#"{"v":1}"#);
//! let text = answers(&[ItemAnswer::status(201), ItemAnswer { status: 503, retry_after_secs: Some(2) }]);
//! assert_eq!(text, b"[201,[503,2]]");
//! assert_eq!(parse_answers(&text).unwrap()[1].retry_after_secs, Some(2));
//! ```

use serde::Deserialize;
use serde_json::value::RawValue;

/// The path batches are posted to.
pub const BATCH_PATH: &str = "/readings/batch";
/// Most items one batch may carry by default.
pub const MAX_ITEMS: usize = 32;
/// Largest batch body by default, bytes.
pub const MAX_BATCH_BYTES: usize = 64 * 1024;

/// A receiver's batch limits: a batch over either is refused whole (413).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most items in one batch.
    pub max_items: usize,
    /// Largest batch body, bytes.
    pub max_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_items: MAX_ITEMS, max_bytes: MAX_BATCH_BYTES }
    }
}

/// One reading of a batch: its key and its JSON body's bytes, as the device sent them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    /// The idempotency key, as sent (checked by the receiver as a header value would be).
    pub key: String,
    /// The reading's JSON body, byte for byte as it stood in the batch.
    pub body: Vec<u8>,
}

/// Why a batch was refused whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BatchError {
    /// The body is larger than [`Limits::max_bytes`].
    #[error("batch body too large")]
    TooLarge,
    /// More items than [`Limits::max_items`].
    #[error("too many items in the batch")]
    TooManyItems,
    /// Not a JSON array of `[key, body]` pairs with a string key, or no item at all.
    #[error("a batch is a non-empty JSON array of [key, body] pairs")]
    Malformed,
}

impl BatchError {
    /// The HTTP status the whole batch is answered with.
    pub fn status(self) -> u16 {
        match self {
            BatchError::TooLarge | BatchError::TooManyItems => 413,
            BatchError::Malformed => 400,
        }
    }
}

/// Reads a batch body under `limits`.
///
/// # Errors
///
/// The batch is refused whole ([`BatchError`]); an item's own key or body is the receiver's to
/// check, item by item, exactly as a single request's.
pub fn parse(body: &[u8], limits: &Limits) -> Result<Vec<Item>, BatchError> {
    if body.len() > limits.max_bytes {
        return Err(BatchError::TooLarge);
    }
    let raw: Vec<(String, Box<RawValue>)> =
        serde_json::from_slice(body).map_err(|_| BatchError::Malformed)?;
    if raw.is_empty() {
        return Err(BatchError::Malformed);
    }
    if raw.len() > limits.max_items {
        return Err(BatchError::TooManyItems);
    }
    Ok(raw.into_iter().map(|(key, body)| Item { key, body: body.get().as_bytes().to_vec() }).collect())
}

/// The body of a batch of `items` (each body must be JSON; it is written as it is).
pub fn encode(items: &[Item]) -> Vec<u8> {
    let mut out = Vec::with_capacity(items.iter().map(|i| i.key.len() + i.body.len() + 6).sum::<usize>() + 2);
    out.push(b'[');
    for (n, item) in items.iter().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        out.push(b'[');
        out.extend_from_slice(serde_json::Value::String(item.key.clone()).to_string().as_bytes());
        out.push(b',');
        out.extend_from_slice(&item.body);
        out.push(b']');
    }
    out.push(b']');
    out
}

/// One item's answer: the status it would have got alone, and its Retry-After in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ItemAnswer {
    /// The HTTP status.
    pub status: u16,
    /// The `Retry-After` that answer carried, whole seconds.
    pub retry_after_secs: Option<u64>,
}

impl ItemAnswer {
    /// A status without Retry-After.
    pub const fn status(status: u16) -> Self {
        ItemAnswer { status, retry_after_secs: None }
    }
}

/// The answer body: one entry per item, in order.
pub fn answers(items: &[ItemAnswer]) -> Vec<u8> {
    let mut out = String::with_capacity(items.len() * 4 + 2);
    out.push('[');
    for (n, a) in items.iter().enumerate() {
        if n > 0 {
            out.push(',');
        }
        match a.retry_after_secs {
            Some(s) => out.push_str(&format!("[{},{s}]", a.status)),
            None => out.push_str(&a.status.to_string()),
        }
    }
    out.push(']');
    out.into_bytes()
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Entry {
    Status(u16),
    WithRetryAfter(u16, u64),
}

/// Reads an answer body (a sender's side, and tests).
///
/// # Errors
///
/// [`BatchError::Malformed`] if it is not an array of statuses and `[status, seconds]` pairs.
pub fn parse_answers(body: &[u8]) -> Result<Vec<ItemAnswer>, BatchError> {
    let entries: Vec<Entry> = serde_json::from_slice(body).map_err(|_| BatchError::Malformed)?;
    Ok(entries
        .into_iter()
        .map(|e| match e {
            Entry::Status(s) => ItemAnswer::status(s),
            Entry::WithRetryAfter(status, s) => ItemAnswer { status, retry_after_secs: Some(s) },
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_keep_their_bodies_byte_for_byte() {
        let body = br#"[["a",{"x": 1, "y":[2]}],["b",7]]"#;
        let items = parse(body, &Limits::default()).unwrap();
        assert_eq!(items.len(), 2);
        assert_eq!(items[0], Item { key: "a".into(), body: br#"{"x": 1, "y":[2]}"#.to_vec() });
        assert_eq!(items[1].body, b"7");
        assert_eq!(parse(&encode(&items), &Limits::default()).unwrap(), items);
    }

    #[test]
    fn limits_and_shape_refuse_the_whole_batch() {
        let limits = Limits { max_items: 2, max_bytes: 40 };
        assert_eq!(parse(br#"[["a",1],["b",2],["c",3]]"#, &limits), Err(BatchError::TooManyItems));
        assert_eq!(parse(&[b' '; 41], &limits), Err(BatchError::TooLarge));
        for bad in [&b"[]"[..], b"{}", br#"[["a"]]"#, br#"[[1,{}]]"#, br#"[["a",{}"#, b""] {
            assert_eq!(parse(bad, &limits), Err(BatchError::Malformed), "{}", String::from_utf8_lossy(bad));
        }
        assert_eq!(BatchError::TooManyItems.status(), 413);
        assert_eq!(BatchError::Malformed.status(), 400);
    }

    #[test]
    fn answers_are_positional() {
        let a = [
            ItemAnswer::status(201),
            ItemAnswer { status: 429, retry_after_secs: Some(3) },
            ItemAnswer::status(403),
        ];
        let text = answers(&a);
        assert_eq!(text, b"[201,[429,3],403]");
        assert_eq!(parse_answers(&text).unwrap(), a);
        assert!(parse_answers(br#"["201"]"#).is_err());
    }
}
