//! The operation of every HTTP method under every preset, keyed and not, and what a 503 does
//! to it: a strict table stays strict whoever builds the operation.

#![allow(clippy::unwrap_used, clippy::panic, missing_docs)]

use wary::{Class, Operation, Outcome, Policy, Preset};

const METHODS: [&str; 9] = ["GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE", "POST", "PATCH", "CONNECT"];

/// The expected operation, written out per preset: only GET and HEAD are idempotent under
/// strict; the other presets add OPTIONS, TRACE, PUT and DELETE.
fn expected_op(preset: Preset, method: &str, keyed: bool) -> Operation {
    let idempotent = match preset {
        Preset::Strict => ["GET", "HEAD"].contains(&method),
        _ => ["GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"].contains(&method),
    };
    match (idempotent, keyed) {
        (true, _) => Operation::Idempotent,
        (false, true) => Operation::KeyedWrite,
        (false, false) => Operation::Write,
    }
}

/// The expected class of a 503: retried when idempotent, and for a keyed write except under
/// strict (which retries reads only); otherwise `unknown` (it may have landed).
fn expected_503(preset: Preset, method: &str, keyed: bool) -> Class {
    match (preset, expected_op(preset, method, keyed)) {
        (_, Operation::Idempotent) => Class::Retry,
        (Preset::Strict, _) => Class::Unknown,
        (_, Operation::KeyedWrite) => Class::Retry,
        _ => Class::Unknown,
    }
}

#[test]
fn every_method_under_every_preset_keyed_or_not_and_a_503() {
    let mut rows = 0;
    for preset in Preset::ALL {
        let policy = Policy::builder(preset).build().unwrap();
        for method in METHODS {
            for keyed in [false, true] {
                let op = policy.operation(method, keyed);
                assert_eq!(op, expected_op(preset, method, keyed), "{preset:?} {method} keyed={keyed}");
                let class = policy.classify(op, &Outcome::status(503));
                assert_eq!(class, expected_503(preset, method, keyed), "{preset:?} {method} keyed={keyed}");
                // The free constructor never retries what the policy's own operation does not.
                #[allow(deprecated)]
                let free = Operation::from_method(method, keyed);
                let free_class = policy.classify(free, &Outcome::status(503));
                assert!(
                    free_class != Class::Retry || class == Class::Retry,
                    "{preset:?} {method} keyed={keyed}: from_method gives {free_class:?}, the policy {class:?}"
                );
                rows += 1;
            }
        }
    }
    assert_eq!(rows, 4 * 9 * 2);
}

#[test]
fn a_strict_put_built_by_hand_from_the_method_is_not_retried() {
    let strict = Policy::builder(Preset::Strict).build().unwrap();
    for m in ["PUT", "DELETE", "OPTIONS", "TRACE"] {
        #[allow(deprecated)]
        let op = Operation::from_method(m, false);
        assert_eq!(strict.classify(op, &Outcome::status(503)), Class::Unknown, "{m}");
        assert_eq!(strict.classify(strict.operation(m, false), &Outcome::status(503)), Class::Unknown, "{m}");
    }
}

#[test]
fn the_names_on_the_wire_did_not_change_with_the_variant() {
    assert_eq!(Operation::Idempotent.name(), "read");
    assert_eq!(Operation::from_name("read"), Some(Operation::Idempotent));
    assert_eq!(Operation::ALL.map(|o| o.name()), ["read", "keyed_write", "write"]);
}

#[cfg(feature = "serde")]
#[test]
fn the_serde_name_did_not_change_either() {
    assert_eq!(serde_json::to_string(&Operation::Idempotent).unwrap(), "\"read\"");
    assert_eq!(serde_json::from_str::<Operation>("\"read\"").unwrap(), Operation::Idempotent);
    assert!(serde_json::from_str::<Operation>("\"idempotent\"").is_err());
}
