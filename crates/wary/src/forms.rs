//! The flat forms a record and a policy take on a line: the device line and the JSON line read
//! through the same fields, so the two formats cannot drift apart.

use crate::backoff::Draw;
use crate::breaker::Phase;
use crate::classify::{Class, Failure, Operation, Outcome};
use crate::decide::{GiveUp, Verdict};
use crate::error::LineError;
use crate::key::Key;
use crate::pace::PaceView;
use crate::record::{Admission, Record};
use crate::time::Duration;

/// A record's fields as names and numbers, before they are checked.
pub(crate) struct Fields<'a> {
    pub(crate) key: &'a str,
    pub(crate) attempt: u32,
    pub(crate) op: &'a str,
    pub(crate) outcome: &'a str,
    pub(crate) status: Option<u16>,
    pub(crate) retry_after: Option<Duration>,
    pub(crate) unreadable: u8,
    pub(crate) class: &'a str,
    pub(crate) draw: Option<Draw>,
    pub(crate) wait: Duration,
    pub(crate) attempt_time: Duration,
    pub(crate) total_time: Duration,
    pub(crate) verdict: Option<&'a str>,
    pub(crate) reason: Option<&'a str>,
    pub(crate) asked: Option<Duration>,
    pub(crate) policy: u32,
    pub(crate) admitted: Option<Admission>,
    pub(crate) refused: Option<Admission>,
}

/// An admission on a device line: `breaker:breaker_left_ms:at_ms:rate_milli:due:wait_ms`, the
/// breaker `none` without one; `-` (or a first part `-`) for no admission.
pub(crate) fn admission_token(token: &str, field: &'static str) -> Result<Option<Admission>, LineError> {
    let mut parts = token.split(':');
    let breaker = parts.next().ok_or(LineError::Missing(field))?;
    if breaker == "-" {
        return Ok(None);
    }
    let breaker = match breaker {
        "none" => None,
        name => Some(Phase::from_name(name).ok_or(LineError::Bad(field))?),
    };
    let mut next = || parts.next().and_then(|p| p.parse::<u64>().ok()).ok_or(LineError::Bad(field));
    let breaker_left = Duration::from_millis(next()?);
    let at = Duration::from_millis(next()?);
    let rate_milli = u32::try_from(next()?).map_err(|_| LineError::Bad(field))?;
    let due = next()?;
    let wait = Duration::from_millis(next()?);
    if parts.next().is_some() {
        return Err(LineError::Bad(field));
    }
    Ok(Some(Admission { at, pace: PaceView { rate_milli, due }, wait, breaker, breaker_left }))
}

impl Fields<'_> {
    pub(crate) fn into_record(self) -> Result<Record, LineError> {
        let outcome = match self.outcome {
            "ok" => Outcome::Ok,
            "status" => Outcome::Failure(Failure::Status {
                code: self.status.ok_or(LineError::Missing("status"))?,
                retry_after: self.retry_after,
                unreadable: self.unreadable,
            }),
            other => Outcome::Failure(Failure::from_name(other).ok_or(LineError::Bad("outcome"))?),
        };
        let verdict = match self.verdict {
            None => None,
            Some(name) => {
                let reason = match self.reason {
                    Some(r) => Some(
                        GiveUp::from_name(r, self.asked.unwrap_or(Duration::ZERO))
                            .ok_or(LineError::Bad("reason"))?,
                    ),
                    None => None,
                };
                Some(Verdict::from_name(name, reason).ok_or(LineError::Bad("verdict"))?)
            }
        };
        Ok(Record {
            key: Key::from_hex(self.key).ok_or(LineError::Bad("key"))?,
            attempt: self.attempt,
            op: Operation::from_name(self.op).ok_or(LineError::Bad("op"))?,
            outcome,
            class: Class::from_name(self.class).ok_or(LineError::Bad("class"))?,
            draw: self.draw,
            wait: self.wait,
            attempt_time: self.attempt_time,
            total_time: self.total_time,
            verdict,
            policy: self.policy,
            admitted: self.admitted,
            refused: self.refused,
        })
    }
}

#[cfg(feature = "serde")]
mod with_serde {
    use core::fmt;

    use heapless::String;
    use serde::{Deserialize, Serialize};

    use super::*;
    use crate::backoff::Jitter;
    use crate::classify::{Rule, Table, Transport};
    use crate::error::{PolicyError, TableError};
    use crate::policy::{Policy, RetryAfterMode};
    use crate::retry_after::Rules;
    use crate::version::LEDGER_VERSION;

    /// Why a line's form was refused.
    #[derive(Debug)]
    pub(crate) enum FormError {
        Line(LineError),
        Policy(PolicyError),
        Table(TableError),
    }

    impl fmt::Display for FormError {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            match self {
                FormError::Line(e) => e.fmt(f),
                FormError::Policy(e) => write!(f, "invalid policy: {e}"),
                FormError::Table(e) => write!(f, "invalid table: {e}"),
            }
        }
    }

    type Name = String<24>;

    #[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
    fn is_zero(n: &u8) -> bool {
        *n == 0
    }

    fn name(s: &str) -> Name {
        // Every name this crate writes is shorter than the capacity.
        String::try_from(s).unwrap_or_default()
    }

    /// The hex of a fingerprint.
    mod hex32 {
        use core::fmt::Write;

        pub(crate) fn serialize<S: serde::Serializer>(v: &u32, s: S) -> Result<S::Ok, S::Error> {
            let mut out = heapless::String::<8>::new();
            // Eight hex digits always fit.
            let _ = write!(out, "{v:08x}");
            s.serialize_str(&out)
        }

        pub(crate) fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
            let s = <heapless::String<8> as serde::Deserialize>::deserialize(d)?;
            u32::from_str_radix(&s, 16).map_err(|_| serde::de::Error::custom("a fingerprint is 8 hex digits"))
        }
    }

    /// An admission as a JSON object, durations in milliseconds.
    #[derive(Serialize, Deserialize)]
    pub(crate) struct AdmissionForm {
        at_ms: Duration,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        breaker: Option<Name>,
        #[serde(default)]
        breaker_ms: Duration,
        #[serde(default)]
        rate_milli: u32,
        #[serde(default)]
        due: u64,
        #[serde(default)]
        wait_ms: Duration,
    }

    impl From<Admission> for AdmissionForm {
        fn from(a: Admission) -> AdmissionForm {
            AdmissionForm {
                at_ms: a.at,
                breaker: a.breaker.map(|p| name(p.name())),
                breaker_ms: a.breaker_left,
                rate_milli: a.pace.rate_milli,
                due: a.pace.due,
                wait_ms: a.wait,
            }
        }
    }

    impl TryFrom<AdmissionForm> for Admission {
        type Error = FormError;
        fn try_from(f: AdmissionForm) -> Result<Admission, FormError> {
            let breaker = match f.breaker.as_deref() {
                None => None,
                Some(n) => Some(Phase::from_name(n).ok_or(FormError::Line(LineError::Bad("breaker")))?),
            };
            Ok(Admission {
                at: f.at_ms,
                pace: PaceView { rate_milli: f.rate_milli, due: f.due },
                wait: f.wait_ms,
                breaker,
                breaker_left: f.breaker_ms,
            })
        }
    }

    /// A record as one JSON object: flat, with every duration in milliseconds, and the ledger
    /// format's version as `v`; what the endpoint said (`admitted`, `refused`) as objects.
    #[derive(Serialize, Deserialize)]
    pub(crate) struct RecordForm {
        v: u32,
        key: Key,
        attempt: u32,
        op: Operation,
        outcome: Name,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        status: Option<u16>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_after_ms: Option<Duration>,
        #[serde(default, skip_serializing_if = "is_zero")]
        retry_after_unreadable: u8,
        class: Class,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        draw: Option<Draw>,
        wait_ms: Duration,
        attempt_ms: Duration,
        total_ms: Duration,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        verdict: Option<Name>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<Name>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        asked_ms: Option<Duration>,
        #[serde(with = "hex32")]
        policy: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        admitted: Option<AdmissionForm>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        refused: Option<AdmissionForm>,
    }

    impl From<Record> for RecordForm {
        fn from(r: Record) -> RecordForm {
            let (verdict, reason, asked_ms) = match r.verdict {
                None => (None, None, None),
                Some(Verdict::GaveUp(g)) => (
                    Some(name("gave_up")),
                    Some(name(g.name())),
                    match g {
                        GiveUp::RetryAfterTooLong { asked } => Some(asked),
                        _ => None,
                    },
                ),
                Some(v) => (Some(name(v.name())), None, None),
            };
            RecordForm {
                v: LEDGER_VERSION,
                key: r.key,
                attempt: r.attempt,
                op: r.op,
                outcome: name(r.outcome.name()),
                status: r.outcome.code(),
                retry_after_ms: r.outcome.retry_after(),
                retry_after_unreadable: r.outcome.failure().map_or(0, Failure::unreadable_retry_after),
                class: r.class,
                draw: r.draw,
                wait_ms: r.wait,
                attempt_ms: r.attempt_time,
                total_ms: r.total_time,
                verdict,
                reason,
                asked_ms,
                policy: r.policy,
                admitted: r.admitted.map(AdmissionForm::from),
                refused: r.refused.map(AdmissionForm::from),
            }
        }
    }

    impl TryFrom<RecordForm> for Record {
        type Error = FormError;
        fn try_from(f: RecordForm) -> Result<Record, FormError> {
            if f.v != LEDGER_VERSION {
                return Err(FormError::Line(LineError::Version { found: f.v, expected: LEDGER_VERSION }));
            }
            let key = f.key.to_hex();
            let admitted = f.admitted.map(Admission::try_from).transpose()?;
            let refused = f.refused.map(Admission::try_from).transpose()?;
            Fields {
                key: &key,
                attempt: f.attempt,
                op: f.op.name(),
                outcome: &f.outcome,
                status: f.status,
                retry_after: f.retry_after_ms,
                unreadable: f.retry_after_unreadable,
                class: f.class.name(),
                draw: f.draw,
                wait: f.wait_ms,
                attempt_time: f.attempt_ms,
                total_time: f.total_ms,
                verdict: f.verdict.as_deref(),
                reason: f.reason.as_deref(),
                asked: f.asked_ms,
                policy: f.policy,
                admitted,
                refused,
            }
            .into_record()
            .map_err(FormError::Line)
        }
    }

    /// A table as data: its exact status rules, its class rules, its transport rules.
    #[derive(Serialize, Deserialize)]
    struct TableForm {
        exact: heapless::Vec<(u16, Rule), 200>,
        client_errors: Rule,
        server_errors: Rule,
        other_statuses: Rule,
        transport: TransportForm,
        reads_only: bool,
    }

    #[derive(Serialize, Deserialize)]
    struct TransportForm {
        connect_timeout: Rule,
        response_timeout: Rule,
        refused: Rule,
        reset: Rule,
        tls: Rule,
        bad_body: Rule,
        stream_broken_before: Rule,
    }

    impl From<&Table> for TableForm {
        fn from(t: &Table) -> TableForm {
            let r = |k| t.transport_rule(k);
            TableForm {
                exact: t.exact_rules().collect(),
                client_errors: t.client_errors(),
                server_errors: t.server_errors(),
                other_statuses: t.other_statuses(),
                transport: TransportForm {
                    connect_timeout: r(Transport::ConnectTimeout),
                    response_timeout: r(Transport::ResponseTimeout),
                    refused: r(Transport::Refused),
                    reset: r(Transport::Reset),
                    tls: r(Transport::Tls),
                    bad_body: r(Transport::BadBody),
                    stream_broken_before: r(Transport::StreamBefore),
                },
                reads_only: t.is_reads_only(),
            }
        }
    }

    impl TryFrom<TableForm> for Table {
        type Error = TableError;
        fn try_from(f: TableForm) -> Result<Table, TableError> {
            let x = &f.transport;
            let mut t = Table::new(f.client_errors, f.server_errors, f.other_statuses)
                .with_transport(Transport::ConnectTimeout, x.connect_timeout)
                .with_transport(Transport::ResponseTimeout, x.response_timeout)
                .with_transport(Transport::Refused, x.refused)
                .with_transport(Transport::Reset, x.reset)
                .with_transport(Transport::Tls, x.tls)
                .with_transport(Transport::BadBody, x.bad_body)
                .with_transport(Transport::StreamBefore, x.stream_broken_before)
                .reads_only(f.reads_only);
            for (code, rule) in f.exact {
                t = t.with_status(code, rule)?;
            }
            Ok(t)
        }
    }

    /// A policy's every setting, durations in milliseconds.
    #[derive(Serialize, Deserialize)]
    pub(crate) struct PolicyForm {
        base_ms: Duration,
        cap_ms: Duration,
        jitter: Jitter,
        budget_ms: Duration,
        #[serde(default)]
        deadline_ms: Option<Duration>,
        #[serde(default)]
        max_attempts: Option<u32>,
        #[serde(default)]
        min_attempt_ms: Duration,
        #[serde(default)]
        max_retry_after_ms: Option<Duration>,
        retry_after_mode: RetryAfterMode,
        retry_after_rules: Rules,
        table: TableForm,
    }

    impl From<Policy> for PolicyForm {
        fn from(p: Policy) -> PolicyForm {
            PolicyForm {
                base_ms: p.backoff.base,
                cap_ms: p.backoff.cap,
                jitter: p.backoff.jitter,
                budget_ms: p.budget,
                deadline_ms: p.deadline(),
                max_attempts: p.max_attempts(),
                min_attempt_ms: p.min_attempt,
                max_retry_after_ms: p.max_retry_after(),
                retry_after_mode: p.retry_after_mode,
                retry_after_rules: p.retry_after_rules,
                table: TableForm::from(&p.table),
            }
        }
    }

    // `Policy` and `Record` read and write through their forms. The impls live here, beside the
    // forms, so the policy and the record know nothing of their lines. As serde's
    // `try_from`/`into` would, a refused form is reported through its `Display`.
    macro_rules! through_form {
        ($t:ty, $form:ty) => {
            impl Serialize for $t {
                fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                    <$form>::from(*self).serialize(s)
                }
            }

            impl<'de> Deserialize<'de> for $t {
                fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<$t, D::Error> {
                    <$t>::try_from(<$form>::deserialize(d)?).map_err(serde::de::Error::custom)
                }
            }
        };
    }

    through_form!(Policy, PolicyForm);
    through_form!(Record, RecordForm);

    impl TryFrom<PolicyForm> for Policy {
        type Error = FormError;
        fn try_from(f: PolicyForm) -> Result<Policy, FormError> {
            let table = Table::try_from(f.table).map_err(FormError::Table)?;
            // Through the builder's own setters, so a form is checked as a builder is.
            let b = Policy::builder(crate::Preset::Default)
                .table(table)
                .base(f.base_ms)
                .cap(f.cap_ms)
                .jitter(f.jitter)
                .budget(f.budget_ms)
                .min_attempt(f.min_attempt_ms)
                .retry_after_mode(f.retry_after_mode)
                .retry_after_rules(f.retry_after_rules);
            let b = match f.deadline_ms {
                Some(d) => b.deadline(d),
                None => b.no_deadline(),
            };
            let b = match f.max_attempts {
                Some(n) => b.max_attempts(n),
                None => b.unlimited_attempts(),
            };
            let b = match f.max_retry_after_ms {
                Some(d) => b.max_retry_after(d),
                None => b.no_max_retry_after(),
            };
            b.build().map_err(FormError::Policy)
        }
    }
}

#[cfg(all(test, feature = "serde"))]
mod tests {
    use crate::{
        Class, Decision, Draw, Duration, Failure, GiveUp, Jitter, Key, Operation, Outcome, Policy, Preset,
        RetryAfterMode, Rule, Table, Transport, Verdict, ledger::Record, retry_after::Rules,
    };

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_policy_written_out_reads_back_exactly_status_rules_included() {
        let custom = Table::DEFAULT
            .with_status(409, Rule::RetryIdempotent)
            .unwrap()
            .with_status(503, Rule::RetryAny)
            .unwrap()
            .with_transport(Transport::Tls, Rule::RetryAny)
            .with_other_statuses(Rule::RetryIdempotent)
            .reads_only(true);
        let policies = [
            Policy::builder(Preset::Default).build().unwrap(),
            Policy::builder(Preset::Basic).build().unwrap(),
            Policy::builder(Preset::Strict).build().unwrap(),
            Policy::builder(Preset::Default)
                .table(custom)
                .jitter(Jitter::Full)
                .max_attempts(4)
                .deadline(ms(9_000))
                .min_attempt(ms(250))
                .max_retry_after(ms(20_000))
                .retry_after_mode(RetryAfterMode::Max)
                .retry_after_rules(Rules::STRICT)
                .build()
                .unwrap(),
        ];
        for p in policies {
            let json = serde_json::to_string(&p).unwrap();
            let back: Policy = serde_json::from_str(&json).unwrap();
            assert_eq!(back, p, "{json}");
            assert_eq!(back.fingerprint(), p.fingerprint());
        }
        let json =
            serde_json::to_value(Policy::builder(Preset::Default).table(custom).build().unwrap()).unwrap();
        assert_eq!(json["table"]["exact"][0], serde_json::json!([408, "retry_any"]));
        assert_eq!(json["table"]["exact"][2], serde_json::json!([429, "retry_any"]));
        assert_eq!(json["table"]["exact"][1], serde_json::json!([409, "retry_idempotent"]));
        assert_eq!(json["table"]["transport"]["tls"], "retry_any");
        assert_eq!(json["base_ms"], 100);
        assert_eq!(json["jitter"], "equal");
    }

    #[test]
    fn a_policy_read_back_is_checked_like_a_built_one() {
        let mut json = serde_json::to_value(Policy::builder(Preset::Default).build().unwrap()).unwrap();
        json["budget_ms"] = 0.into();
        let e = serde_json::from_value::<Policy>(json.clone()).unwrap_err().to_string();
        assert!(e.contains("budget must be at least 1 ms"), "{e}");
        json["budget_ms"] = 100.into();
        json["table"]["exact"] = serde_json::json!([[302, "fail"]]);
        let e = serde_json::from_value::<Policy>(json.clone()).unwrap_err().to_string();
        assert!(e.contains("400..=599"), "{e}");
        json["table"]["exact"] = serde_json::json!([]);
        json["jitter"] = "gaussian".into();
        assert!(serde_json::from_value::<Policy>(json).is_err());
    }

    #[test]
    fn a_record_is_one_flat_versioned_line_and_reads_back() {
        let p = Policy::builder(Preset::Default).build().unwrap();
        let key = Key::from_parts(1, 2, 3);
        let asked = GiveUp::RetryAfterTooLong { asked: ms(90_000) };
        let records = [
            Record::decided(
                &p,
                key,
                1,
                Operation::KeyedWrite,
                Outcome::from_response(503, [b"2".as_slice(), b"soon"], None, None, &Rules::LENIENT).0,
                Draw::unit(77),
                Decision::Retry { wait: ms(2_010) },
                ms(12),
                ms(12),
            ),
            Record::decided(
                &p,
                key,
                2,
                Operation::KeyedWrite,
                Outcome::status_after(429, ms(90_000)),
                Draw::Percent(5),
                Decision::Done(Verdict::GaveUp(asked)),
                ms(3),
                ms(2_025),
            ),
            Record::decided(
                &p,
                key,
                1,
                Operation::Write,
                Failure::Reset.into(),
                Draw::ZERO,
                Decision::Done(Verdict::Unknown),
                ms(1),
                ms(1),
            ),
            Record::cancelled(&p, key, 2, Operation::Idempotent, ms(40)),
        ];
        for r in records {
            let json = serde_json::to_string(&r).unwrap();
            assert!(json.starts_with("{\"v\":4,"), "{json}");
            let back: Record = serde_json::from_str(&json).unwrap();
            assert_eq!(back, r, "{json}");
        }
        // Version 2 and 3 lines are refused, and the message says why.
        let old = serde_json::to_string(&records[0]).unwrap().replace("{\"v\":4,", "{\"v\":2,");
        let e = serde_json::from_str::<Record>(&old).unwrap_err().to_string();
        assert!(
            e.contains("ledger line version 2 (keys held a 32-bit device id), this wary reads version 4"),
            "{e}"
        );
        let v3 = serde_json::to_string(&records[0]).unwrap().replace("{\"v\":4,", "{\"v\":3,");
        let e = serde_json::from_str::<Record>(&v3).unwrap_err().to_string();
        assert!(
            e.contains(
                "ledger line version 3 (no record of the pace and the breaker), this wary reads version 4"
            ),
            "{e}"
        );
        let v = serde_json::to_value(records[1]).unwrap();
        assert_eq!(v["outcome"], "status");
        assert_eq!(v["status"], 429);
        assert_eq!(v["retry_after_ms"], 90_000);
        assert_eq!(v["verdict"], "gave_up");
        assert_eq!(v["reason"], "retry_after_too_long");
        assert_eq!(v["asked_ms"], 90_000);
        assert_eq!(v["draw"], serde_json::json!({"percent": 5}));
        assert!(v.get("retry_after_unreadable").is_none(), "left out when there were none");
        let first = serde_json::to_value(records[0]).unwrap();
        assert_eq!(
            (first["retry_after_ms"].clone(), first["retry_after_unreadable"].clone()),
            (2_000.into(), 1.into())
        );
        assert_eq!(v["class"], "retry");
        assert_eq!(v["key"], key.to_hex().as_str());
        assert_eq!(v["policy"], format!("{:08x}", p.fingerprint()));
        // The first record's class and draw: a retry keeps the draw that decided its wait.
        assert_eq!((records[0].class, records[0].draw), (Class::Retry, Some(Draw::unit(77))));
        // An unknown keeps no draw: no wait was computed.
        assert_eq!(records[2].draw, None);
        let mut old = v.clone();
        old["v"] = 1.into();
        let e = serde_json::from_value::<Record>(old).unwrap_err().to_string();
        assert!(e.contains("version 1"), "{e}");
        let mut bad = v;
        bad["op"] = "peek".into();
        assert!(serde_json::from_value::<Record>(bad).is_err());
        // What the pace and the breaker said reads back exactly, and is left out of a plain
        // call's line.
        assert!(serde_json::to_value(records[0]).unwrap().get("admitted").is_none());
        let said = crate::ledger::Admission {
            at: ms(2_010),
            pace: crate::PaceView { rate_milli: 250, due: 3_073 },
            wait: ms(4),
            breaker: Some(crate::Phase::Closed),
            breaker_left: ms(0),
        };
        let refused =
            crate::ledger::Admission { breaker: Some(crate::Phase::Open), breaker_left: ms(900), ..said };
        let r = Record { admitted: Some(said), refused: Some(refused), ..records[1] };
        let v = serde_json::to_value(r).unwrap();
        assert_eq!(
            v["admitted"],
            serde_json::json!({"at_ms": 2_010, "breaker": "closed", "breaker_ms": 0, "rate_milli": 250, "due": 3_073, "wait_ms": 4})
        );
        assert_eq!(v["refused"]["breaker"], "open");
        assert_eq!(serde_json::from_value::<Record>(v.clone()).unwrap(), r);
        let mut ajar = v;
        ajar["refused"]["breaker"] = "ajar".into();
        assert!(serde_json::from_value::<Record>(ajar).is_err());
    }
}
