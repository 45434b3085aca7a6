//! The names that left the crate's root stay reachable there for one release, deprecated, and
//! mean what the new paths mean.
#![allow(deprecated)]
#![allow(clippy::unwrap_used, missing_docs)]

use wary::{Draw, Duration, Operation, Outcome, Policy, Preset};

#[test]
fn old_root_names_reach_the_same_items() {
    let p = Policy::builder(Preset::Basic).build().unwrap();
    let outcomes = [Outcome::status(503), Outcome::Ok];
    let draws = [Draw::ZERO];
    let old: wary::Plan<4> = wary::plan(&p, Operation::Read, &outcomes, &draws).unwrap();
    let new: wary::plan::Plan<4> = wary::plan::plan(&p, Operation::Read, &outcomes, &draws).unwrap();
    assert_eq!(old, new);
    let mut into = wary::plan::Plan::<4>::default();
    wary::plan_into(&mut into, &p, Operation::Read, &outcomes, &draws).unwrap();
    assert_eq!(into, new);
    let too_few: Result<wary::Plan<4>, wary::PlanError> = wary::plan(&p, Operation::Read, &outcomes, &[]);
    assert!(matches!(too_few, Err(wary::plan::PlanError::TooFewDraws { .. })));

    assert_eq!(wary::parse_retry_after(b"120"), Ok(wary::retry_after::RetryAfter::Seconds(120)));
    assert_eq!(wary::parse_retry_after_lenient(b"1.5"), wary::retry_after::parse_lenient(b"1.5"));
    assert_eq!(wary::parse_http_date(b"Sun, 06 Nov 1994 08:49:37 GMT"), Ok(784_111_777));
    let rules: wary::Rules = wary::retry_after::Rules::STRICT;
    assert_eq!(rules.ambiguous, wary::Duplicates::Reject);
    let _: wary::RetryAfterError = wary::retry_after::RetryAfterError::Empty;
    let _: wary::Reading = wary::retry_after::Reading::default();
    let _: wary::RetryAfter = wary::retry_after::RetryAfter::Date(0);

    assert_eq!(wary::LEDGER_VERSION, wary::ledger::LEDGER_VERSION);
    assert_eq!(wary::DEVICE_TAG, wary::ledger::DEVICE_TAG);
    assert_eq!(wary::DEVICE_FIELDS, wary::ledger::DEVICE_FIELDS);
    assert_eq!(wary::parse_device_line("no ledger here"), Err(wary::LineError::NotALedgerLine));
    let mut ledger = wary::Ledger::<4>::new();
    let stats: &wary::AttemptStats<16> = ledger.stats();
    assert_eq!(stats.calls(), 0);
    let mut call = wary::Attempts::new(wary::Instant::from_millis(0));
    call.start(&p, wary::Instant::from_millis(0));
    let (_, record): (_, wary::Record) = call.end(
        &p,
        None,
        Operation::Read,
        wary::Key::from_parts(1, 2, 3),
        Outcome::Ok,
        Draw::ZERO,
        wary::Instant::from_millis(5),
    );
    wary::Sink::record(&mut ledger, &record);
    assert_eq!(ledger.stats().calls(), 1);
    assert_eq!(record.wait, Duration::ZERO);
}
